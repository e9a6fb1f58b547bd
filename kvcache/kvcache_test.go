package kvcache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSlot(t *testing.T) {
	bt := []int32{7, 2, 9}
	tests := []struct {
		name    string
		pos     int
		want    int
		wantErr bool
	}{
		{"first slot", 0, 7 * 16, false},
		{"inside first block", 5, 7*16 + 5, false},
		{"second block", 16, 2 * 16, false},
		{"last slot", 47, 9*16 + 15, false},
		{"beyond table", 48, 0, true},
		{"negative", -1, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Slot(bt, tc.pos, 16)
			if tc.wantErr {
				if !errors.Is(err, ErrSlotOutOfRange) {
					t.Fatalf("err = %v, want ErrSlotOutOfRange", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Slot = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestSlotMappingStopsAtBound(t *testing.T) {
	dst := make([]int, 40)
	n := SlotMapping(dst, []int32{3, 1}, 10, 50, 16)
	if n != 22 {
		t.Fatalf("mapped %d positions, want 22", n)
	}
	if dst[0] != 3*16+10 || dst[6] != 1*16+0 || dst[21] != 1*16+15 {
		t.Fatalf("bad mapping %v", dst[:n])
	}
}

func TestLayoutValidate(t *testing.T) {
	tests := []struct {
		name string
		l    Layout
		ok   bool
	}{
		{"good", Layout{2, 4, 16, 2, 8, F32}, true},
		{"good f16", Layout{2, 4, 16, 2, 8, F16}, true},
		{"unknown type", Layout{2, 4, 16, 2, 8, DType(9)}, false},
		{"zero layers", Layout{0, 4, 16, 2, 8, F32}, false},
		{"negative blocks", Layout{2, -4, 16, 2, 8, F32}, false},
		{"absurd size", Layout{1 << 10, 1 << 20, 16, 8, 128, F32}, false},
		{"absurd size f16", Layout{1 << 10, 1 << 20, 16, 8, 128, F16}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, ok want %v", err, tc.ok)
			}
		})
	}
}

// share maps m's descriptor as the blend server does and checks that the
// two mappings share the memory.
func share(t *testing.T, m *Memory) {
	t.Helper()
	l := m.Layout()
	peer, err := Map(m.File(), l)
	if err != nil {
		t.Fatal(err)
	}
	// A write through one mapping is visible through the other.
	peer.TokenK(1, 37)[3] = 42.5
	peer.TokenV(0, 5)[0] = -1
	if got := m.K(1)[37*l.TokenFloats()+3]; got != 42.5 {
		t.Fatalf("K not shared: %v", got)
	}
	if got := m.V(0)[5*l.TokenFloats()]; got != -1 {
		t.Fatalf("V not shared: %v", got)
	}
	// K and V planes do not overlap.
	if m.K(0)[5*l.TokenFloats()] != 0 {
		t.Fatal("V write leaked into K")
	}
	if peer.File() != nil {
		t.Fatal("a mapped memory owns a descriptor")
	}
	if err := peer.Close(); err != nil {
		t.Fatal(err)
	}
	if m.K(1)[37*l.TokenFloats()+3] != 42.5 {
		t.Fatal("the peer's Close lost the memory")
	}
}

// noFiles fails when dir holds anything: the memory has no path.
func noFiles(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("%s holds %v: the KV memory has a path", dir, ents)
	}
}

func TestCreateMemfdSealedAndShared(t *testing.T) {
	dir := t.TempDir()
	l := Layout{NumLayers: 2, NumBlocks: 4, BlockSize: 16, KVHeads: 2, HeadDim: 8}
	m, err := Create(dir, l)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	noFiles(t, dir)
	if m.Name() != "memfd:cb-kv" || !m.Sealed() {
		t.Fatalf("name %q sealed %v, want a sealed memfd", m.Name(), m.Sealed())
	}
	st, err := m.File().Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != l.Bytes() || !st.Mode().IsRegular() {
		t.Fatalf("size %d mode %v", st.Size(), st.Mode())
	}
	// The seals: the size can change neither way.
	if err := m.File().Truncate(l.Bytes() / 2); err == nil {
		t.Fatal("a sealed memfd was shrunk")
	}
	if err := m.File().Truncate(l.Bytes() * 2); err == nil {
		t.Fatal("a sealed memfd was grown")
	}
	share(t, m)
	if _, err := Map(m.File(), Layout{NumLayers: 3, NumBlocks: 4, BlockSize: 16, KVHeads: 2, HeadDim: 8}); !errors.Is(err, ErrBadDescriptor) {
		t.Fatalf("map with a wrong layout: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal("second close:", err)
	}
}

func TestCreateFallbackUnlinkedFile(t *testing.T) {
	memfdCreate = func(string, int) (int, error) { return -1, syscall.ENOSYS }
	defer func() { memfdCreate = unix.MemfdCreate }()
	dir := t.TempDir()
	l := Layout{NumLayers: 2, NumBlocks: 4, BlockSize: 16, KVHeads: 2, HeadDim: 8}
	m, err := Create(dir, l)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	noFiles(t, dir)
	if m.Sealed() || !strings.HasPrefix(m.Name(), "unlinked file in ") {
		t.Fatalf("name %q sealed %v", m.Name(), m.Sealed())
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(m.File().Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o777 != 0o600 || st.Nlink != 0 || st.Size != l.Bytes() {
		t.Fatalf("mode %#o links %d size %d, want 0600, unlinked, %d bytes", st.Mode&0o777, st.Nlink, st.Size, l.Bytes())
	}
	share(t, m)
}

func TestMapRefusesBadDescriptors(t *testing.T) {
	l := Layout{NumLayers: 2, NumBlocks: 4, BlockSize: 16, KVHeads: 2, HeadDim: 8}
	dir := t.TempDir()
	open := func(t *testing.T, name string, size int64, flag int) *os.File {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(p, flag, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	writeSealed, err := Create("", l)
	if err != nil {
		t.Fatal(err)
	}
	defer writeSealed.Close()
	// A memfd sealed against writes (built by hand: Create seals F_SEAL_SEAL).
	fd, err := unix.MemfdCreate("x", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	ro := os.NewFile(uintptr(fd), "x")
	defer ro.Close()
	if err := ro.Truncate(l.Bytes()); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(ro.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    *os.File
	}{
		{"too small", open(t, "small", l.Bytes()-4, os.O_RDWR)},
		{"too large", open(t, "large", l.Bytes()+4096, os.O_RDWR)},
		{"read only", open(t, "ro", l.Bytes(), os.O_RDONLY)},
		{"pipe", pr},
		{"directory", d},
		{"write-sealed memfd", ro},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if m, err := Map(tc.f, l); !errors.Is(err, ErrBadDescriptor) {
				if m != nil {
					m.Close()
				}
				t.Fatalf("Map = %v, want ErrBadDescriptor", err)
			}
		})
	}
	if _, err := Map(writeSealed.File(), Layout{}); !errors.Is(err, ErrBadLayout) {
		t.Fatalf("zero layout: %v", err)
	}
}

func TestRemoveStale(t *testing.T) {
	dir := t.TempDir()
	// A process that has exited: its pid is no longer alive.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(dir, fmt.Sprintf("%s%d-00000000000000ab.shm", filePrefix, cmd.Process.Pid))
	mine := filepath.Join(dir, fmt.Sprintf("%s%d-00000000000000cd.shm", filePrefix, os.Getpid()))
	other := filepath.Join(dir, "unrelated.shm")
	for _, p := range []string{dead, mine, other} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveStale(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != dead {
		t.Fatalf("removed %v, want [%s]", removed, dead)
	}
	for _, p := range []string{mine, other} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s removed: %v", p, err)
		}
	}
}

func TestDTypeSizes(t *testing.T) {
	tests := []struct {
		name            string
		in              string
		want            DType
		bytes, rowBytes int64
	}{
		{"f32", "f32", F32, 2 * 3 * 4 * 16 * 2 * 8 * 4, 2 * 8 * 4},
		{"f16", "F16", F16, 2 * 3 * 4 * 16 * 2 * 8 * 2, 2 * 8 * 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ParseDType(tc.in)
			if err != nil || d != tc.want || d.String() != tc.name {
				t.Fatalf("ParseDType(%q) = %v, %v", tc.in, d, err)
			}
			l := Layout{NumLayers: 3, NumBlocks: 4, BlockSize: 16, KVHeads: 2, HeadDim: 8, DType: d}
			if l.Bytes() != tc.bytes || int64(l.RowBytes()) != tc.rowBytes || l.TokenBytes() != 2*3*tc.rowBytes {
				t.Fatalf("Bytes %d RowBytes %d TokenBytes %d", l.Bytes(), l.RowBytes(), l.TokenBytes())
			}
		})
	}
	if _, err := ParseDType("q8_0"); !errors.Is(err, ErrBadLayout) {
		t.Fatalf("ParseDType(q8_0) = %v", err)
	}
}

// TestReadWrite writes rows through Write and reads them back through Read
// and the raw planes: exact for F32, the nearest half for F16 (ties to
// even, overflow to Inf), and each plane, layer and slot in its own bytes.
func TestReadWrite(t *testing.T) {
	for _, d := range []DType{F32, F16} {
		t.Run(d.String(), func(t *testing.T) {
			l := Layout{NumLayers: 2, NumBlocks: 2, BlockSize: 4, KVHeads: 1, HeadDim: 4, DType: d}
			m, err := Create(t.TempDir(), l)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			src := []float32{1, -2.5, 1 + 1.0/2048, 1 + 3.0/2048, 70000, float32(math.Inf(-1)), 1e-8, 0.1}
			m.Write(Values, 1, 5, src) // slots 5 and 6 of layer 1's V
			want := slices.Clone(src)
			if d == F16 {
				// 1+2⁻¹¹ ties to 1 (even), 1+3·2⁻¹¹ to 1+2⁻⁹; 70000 overflows;
				// 1e-8 underflows to 0; 0.1 is 0x2E66.
				want = []float32{1, -2.5, 1, 1 + 1.0/512, float32(math.Inf(1)), float32(math.Inf(-1)), 0, 0.0999755859375}
			}
			got := make([]float32, len(src))
			m.Read(Values, 1, 5, got)
			if !slices.Equal(got, want) {
				t.Fatalf("read %v, want %v", got, want)
			}
			p := m.Plane(1, Values)
			if len(p) != l.PlaneFloats()*d.Size() {
				t.Fatalf("plane of %d bytes", len(p))
			}
			for i, b := range p {
				inRows := i >= 5*l.RowBytes() && i < 7*l.RowBytes()
				if !inRows && b != 0 {
					t.Fatalf("byte %d outside the written slots is %d", i, b)
				}
			}
			for _, other := range [][]byte{m.Plane(1, Keys), m.Plane(0, Values), m.Plane(0, Keys)} {
				if slices.ContainsFunc(other, func(b byte) bool { return b != 0 }) {
					t.Fatal("a write reached another plane")
				}
			}
			if d == F16 {
				if h := binary.LittleEndian.Uint16(p[5*l.RowBytes()+2*7:]); h != 0x2E66 {
					t.Fatalf("0.1 stored as %#04x, want 0x2e66", h)
				}
				func() {
					defer func() {
						if recover() == nil {
							t.Fatal("K of an F16 memory did not panic")
						}
					}()
					m.K(0)
				}()
			}
		})
	}
}

// TestHalves checks that an F16 memory's Halves view holds, at each slot's
// offset, the bit patterns Row returns (little-endian), and that an F32
// memory refuses it.
func TestHalves(t *testing.T) {
	m, err := Create(t.TempDir(), Layout{2, 4, 16, 2, 8, F16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tf := m.Layout().TokenFloats()
	src := make([]float32, tf)
	for i := range src {
		src[i] = float32(i) - 7.25
	}
	for _, p := range []Plane{Keys, Values} {
		m.Write(p, 1, 5, src)
		h := m.Halves(1, p)
		row := m.Row(p, 1, 5)
		for i := range tf {
			if want := binary.LittleEndian.Uint16(row[2*i:]); h[5*tf+i] != want {
				t.Fatalf("plane %v value %d: %#04x, want %#04x", p, i, h[5*tf+i], want)
			}
		}
	}
	f, err := Create(t.TempDir(), Layout{2, 4, 16, 2, 8, F32})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defer func() {
		if recover() == nil {
			t.Fatal("Halves of an F32 memory did not panic")
		}
	}()
	f.Halves(0, Keys)
}
