package kvcache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cacheblend/cacheblend/quant"
)

// DefaultDir is where the fallback file is created (see Create) when no
// directory is given: /dev/shm when it exists, the OS temp directory
// otherwise.
func DefaultDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// filePrefix starts the name a fallback file has between its creation and
// its unlinking; the pid that follows lets RemoveStale find the files of
// processes that died in between.
const filePrefix = "cb-kv-"

// memfdName names the memfd (/proc/<pid>/fd shows "/memfd:cb-kv (deleted)").
const memfdName = "cb-kv"

// Seals is what Create puts on a memfd: its size can never change and no
// seal can be added or removed, so a process that maps it can rely on every
// byte of the layout staying mapped.
const Seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// ErrBadDescriptor reports a descriptor that Map refuses: not a regular
// file (or memfd), not open for reading and writing, or of another size
// than the layout's.
var ErrBadDescriptor = errors.New("kvcache: bad KV memory descriptor")

// memfdCreate is unix.MemfdCreate; tests replace it to exercise the
// fallback.
var memfdCreate = unix.MemfdCreate

// Memory is a mapped KV memory: K and V planes of every layer over one
// shared mapping, of the layout's element type (float32 slices through K
// and V for an F32 layout; any type through Plane, Read and Write). The memory has no path: the worker
// creates it (Create) and hands its descriptor (File) to the blend server,
// which maps it (Map). The slices may be read and written concurrently by
// different goroutines and processes; coordinating writers of the same slots
// is the caller's job. Close is safe for concurrent use with itself but the
// slices must not be used after Close.
type Memory struct {
	name   string
	layout Layout
	file   *os.File // the descriptor, kept by the creator only
	sealed bool
	data   []byte
	floats []float32

	closeOnce sync.Once
	closeErr  error
}

// Create makes the KV memory of layout and maps it: an anonymous memfd
// (memfd_create, close-on-exec) sized for layout and sealed with Seals; when
// the kernel refuses memfd_create, a 0600 file in dir (DefaultDir when
// empty) that is unlinked before Create returns (O_TMPFILE, or a unique
// name removed at once). Either way nothing on the file system names the
// memory: it lives while a descriptor or a mapping of it does. The memory is
// zero, and mapped populated (MAP_POPULATE: the whole pool is resident at
// once, so the forward never faults on it). File is the descriptor to hand
// to the blend server; Close unmaps it
// and closes the descriptor.
func Create(dir string, layout Layout) (*Memory, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	f, name, memfd, err := createFile(dir)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Memory, error) {
		f.Close()
		return nil, err
	}
	if err := f.Truncate(layout.Bytes()); err != nil {
		return fail(fmt.Errorf("kvcache: size KV memory: %w", err))
	}
	sealed := false
	if memfd {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, Seals); err != nil {
			return fail(fmt.Errorf("kvcache: seal KV memory: %w", err))
		}
		sealed = true
	}
	m, err := mapFile(f, layout)
	if err != nil {
		return fail(err)
	}
	m.name, m.file, m.sealed = name, f, sealed
	return m, nil
}

// createFile returns a new, empty, pathless read-write file: a memfd, or
// the fallback in dir.
func createFile(dir string) (f *os.File, name string, memfd bool, err error) {
	fd, err := memfdCreate(memfdName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err == nil {
		return os.NewFile(uintptr(fd), "memfd:"+memfdName), "memfd:" + memfdName, true, nil
	}
	if dir == "" {
		dir = DefaultDir()
	}
	// An unnamed file in dir (Linux 3.11+, not every file system).
	if fd, terr := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600); terr == nil {
		name = "unlinked file in " + dir
		return os.NewFile(uintptr(fd), name), name, false, nil
	}
	for range 16 {
		p := filepath.Join(dir, fmt.Sprintf("%s%d-%016x.shm", filePrefix, os.Getpid(), rand.Uint64()))
		f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			if err := os.Remove(p); err != nil {
				f.Close()
				return nil, "", false, fmt.Errorf("kvcache: unlink KV memory file: %w", err)
			}
			name = "unlinked file in " + dir
			return f, name, false, nil
		}
		if !errors.Is(err, os.ErrExist) {
			break
		}
	}
	return nil, "", false, fmt.Errorf("kvcache: create KV memory (memfd unavailable): %w", err)
}

// Map maps the KV memory behind f, a descriptor received from its creator
// (the blend server's side). It never opens a path. f must be a regular
// file (a memfd is one) open for reading and writing, of exactly
// layout.Bytes() bytes, and not sealed against writes; otherwise Map
// returns an error wrapping ErrBadDescriptor (or ErrBadLayout for the
// layout itself). The caller keeps f and may close it once Map returns: the
// mapping holds the memory. Close unmaps. Like Create's, the mapping is
// populated at once (MAP_POPULATE): writes into it never fault.
func Map(f *os.File, layout Layout) (*Memory, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%w: fstat: %v", ErrBadDescriptor, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%w: not a regular file or memfd (mode %#o)", ErrBadDescriptor, st.Mode)
	}
	if st.Size != layout.Bytes() {
		return nil, fmt.Errorf("%w: %d bytes, the layout needs %d", ErrBadDescriptor, st.Size, layout.Bytes())
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: F_GETFL: %v", ErrBadDescriptor, err)
	}
	if fl&unix.O_ACCMODE != unix.O_RDWR {
		return nil, fmt.Errorf("%w: not open for reading and writing", ErrBadDescriptor)
	}
	sealed := false
	if seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); err == nil {
		if seals&(unix.F_SEAL_WRITE|unix.F_SEAL_FUTURE_WRITE) != 0 {
			return nil, fmt.Errorf("%w: sealed against writes", ErrBadDescriptor)
		}
		sealed = seals&unix.F_SEAL_SHRINK != 0
	}
	m, err := mapFile(f, layout)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadDescriptor, err)
	}
	m.name, m.sealed = fmt.Sprintf("descriptor (dev %d, inode %d)", st.Dev, st.Ino), sealed
	return m, nil
}

// mapFile maps f shared and populated (MAP_POPULATE): the pages are
// allocated and this process's page tables filled at map time, so neither the
// worker's forward nor the blend server's scatter pays a page fault per 4 KiB
// on first touch. Measured on `cb demo` (16-layer default, 2 cores): a
// retrieve scattering ~15 MB took 8–9 ms faulting page by page and 1–2 ms
// populated. The cost is paid once per mapping: the whole pool is resident
// from the start, as a serving engine's preallocated KV pool is.
func mapFile(f *os.File, layout Layout) (*Memory, error) {
	data, err := syscall.Mmap(int(f.Fd()), 0, int(layout.Bytes()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("kvcache: mmap: %w", err)
	}
	m := &Memory{layout: layout, data: data}
	if layout.DType == F32 {
		m.floats = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(data))), len(data)/4)
	}
	return m, nil
}

// Name describes the memory for logs ("memfd:cb-kv", "unlinked file in
// /dev/shm", or the identity of a mapped descriptor); it is not a path.
func (m *Memory) Name() string { return m.name }

// File is the memory's descriptor, to pass to the blend server (nil for a
// memory mapped by Map). It stays owned by the Memory: Close closes it.
func (m *Memory) File() *os.File { return m.file }

// Sealed reports whether the memory's size is sealed (a memfd with
// F_SEAL_SHRINK): its mapping can never lose pages. The fallback file
// cannot be sealed.
func (m *Memory) Sealed() bool { return m.sealed }

// Layout is the layout the memory was mapped with.
func (m *Memory) Layout() Layout { return m.layout }

// Plane names one of a layer's two planes.
type Plane uint8

// The two planes of a layer.
const (
	Keys   Plane = iota // K
	Values              // V
)

// K is the key plane of layer, shape [NumBlocks, BlockSize, KVHeads, HeadDim],
// of an F32 memory; it panics for another element type (use Plane, Read and
// Write).
func (m *Memory) K(layer int) []float32 { return m.f32(layer, Keys) }

// V is the value plane of layer, shape [NumBlocks, BlockSize, KVHeads, HeadDim],
// of an F32 memory; it panics for another element type.
func (m *Memory) V(layer int) []float32 { return m.f32(layer, Values) }

func (m *Memory) f32(layer int, p Plane) []float32 {
	if m.floats == nil && m.data != nil {
		panic(fmt.Sprintf("kvcache: float32 plane of a %v KV memory", m.layout.DType))
	}
	n := m.layout.PlaneFloats()
	off := (2*layer + int(p)) * n
	return m.floats[off : off+n : off+n]
}

// Halves is plane p of layer of an F16 memory as its binary16 bit
// patterns (a plane starts at an even offset of the page-aligned mapping);
// it panics for another element type.
func (m *Memory) Halves(layer int, p Plane) []uint16 {
	if m.layout.DType != F16 {
		panic(fmt.Sprintf("kvcache: binary16 plane of a %v KV memory", m.layout.DType))
	}
	b := m.Plane(layer, p)
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2)
}

// TokenK is the K vector (KVHeads*HeadDim floats) of one slot of one layer
// of an F32 memory.
func (m *Memory) TokenK(layer, slot int) []float32 {
	t := m.layout.TokenFloats()
	return m.K(layer)[slot*t : (slot+1)*t : (slot+1)*t]
}

// TokenV is the V vector (KVHeads*HeadDim floats) of one slot of one layer
// of an F32 memory.
func (m *Memory) TokenV(layer, slot int) []float32 {
	t := m.layout.TokenFloats()
	return m.V(layer)[slot*t : (slot+1)*t : (slot+1)*t]
}

// Plane is plane p of layer as bytes, whatever the element type: slot s's
// values are bytes [s·RowBytes, (s+1)·RowBytes), in the machine's byte
// order (little-endian on amd64 and arm64).
func (m *Memory) Plane(layer int, p Plane) []byte {
	n := m.layout.PlaneFloats() * m.layout.DType.Size()
	off := (2*layer + int(p)) * n
	return m.data[off : off+n : off+n]
}

// Row is slot's row of plane p of layer as bytes (RowBytes long): a copy
// between memories of one element type needs no conversion.
func (m *Memory) Row(p Plane, layer, slot int) []byte {
	rb := m.layout.RowBytes()
	return m.Plane(layer, p)[slot*rb : (slot+1)*rb : (slot+1)*rb]
}

// Read decodes the values of consecutive slots from slot on, plane p of
// layer, into dst (len(dst)/TokenFloats slots, len(dst) a multiple of
// TokenFloats): a copy for F32, exact conversion to float32 for F16.
func (m *Memory) Read(p Plane, layer, slot int, dst []float32) {
	if m.layout.DType == F32 {
		t := m.layout.TokenFloats()
		copy(dst, m.f32(layer, p)[slot*t:slot*t+len(dst)])
		return
	}
	rb := m.layout.DType.Size()
	src := m.Plane(layer, p)[slot*m.layout.TokenFloats()*rb:][:len(dst)*rb]
	if err := quant.DequantizeRow(quant.F16, src, dst); err != nil {
		panic(err) // sizes are this function's own
	}
}

// Write encodes src into consecutive slots from slot on, plane p of layer
// (len(src)/TokenFloats slots): a copy for F32, rounding to the nearest
// half (ties to even; beyond ±65504 to ±Inf) for F16.
func (m *Memory) Write(p Plane, layer, slot int, src []float32) {
	if m.layout.DType == F32 {
		t := m.layout.TokenFloats()
		copy(m.f32(layer, p)[slot*t:slot*t+len(src)], src)
		return
	}
	rb := m.layout.DType.Size()
	dst := m.Plane(layer, p)[slot*m.layout.TokenFloats()*rb:][:len(src)*rb]
	if err := quant.Quantize(quant.F16, src, dst); err != nil {
		panic(err)
	}
}

// Close unmaps the memory and closes the creator's descriptor; the memory
// itself is freed by the kernel once no process maps it or holds a
// descriptor. It is idempotent.
func (m *Memory) Close() error {
	m.closeOnce.Do(func() {
		if m.data != nil {
			m.closeErr = syscall.Munmap(m.data)
			m.data, m.floats = nil, nil
		}
		if m.file != nil {
			if err := m.file.Close(); err != nil && m.closeErr == nil {
				m.closeErr = fmt.Errorf("kvcache: close KV memory: %w", err)
			}
		}
	})
	return m.closeErr
}

// RemoveStale removes fallback files in dir (DefaultDir when empty) left
// by processes that died between creating and unlinking them, and the
// named shared-memory files of earlier versions (cb-kv-<pid>-*.shm of dead
// pids). It returns the paths removed.
func RemoveStale(dir string) ([]string, error) {
	if dir == "" {
		dir = DefaultDir()
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("kvcache: scan for stale files: %w", err)
	}
	var removed []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, filePrefix) || !strings.HasSuffix(name, ".shm") {
			continue
		}
		rest := strings.TrimPrefix(name, filePrefix)
		pidStr, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() || alive(pid) {
			continue
		}
		p := filepath.Join(dir, name)
		if err := os.Remove(p); err == nil {
			removed = append(removed, p)
		}
	}
	return removed, nil
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
