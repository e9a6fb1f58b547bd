package kvcache

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
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
		{"good", Layout{2, 4, 16, 2, 8}, true},
		{"zero layers", Layout{0, 4, 16, 2, 8}, false},
		{"negative blocks", Layout{2, -4, 16, 2, 8}, false},
		{"absurd size", Layout{1 << 10, 1 << 20, 16, 8, 128}, false},
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

func TestCreateOpenShare(t *testing.T) {
	dir := t.TempDir()
	l := Layout{NumLayers: 2, NumBlocks: 4, BlockSize: 16, KVHeads: 2, HeadDim: 8}
	m, err := Create(dir, l)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(m.Path())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", st.Mode().Perm())
	}
	if st.Size() != l.Bytes() {
		t.Fatalf("size %d, want %d", st.Size(), l.Bytes())
	}
	peer, err := Open(m.Path(), l)
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
	if err := peer.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.Path()); err != nil {
		t.Fatal("peer close removed the file")
	}
	if _, err := Open(m.Path(), Layout{NumLayers: 3, NumBlocks: 4, BlockSize: 16, KVHeads: 2, HeadDim: 8}); !errors.Is(err, ErrBadLayout) {
		t.Fatalf("open with wrong layout: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal("second close:", err)
	}
	if _, err := os.Stat(m.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("owner close left the file")
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
