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
)

// DefaultDir is where shared-memory files are created when no directory is
// given: /dev/shm when it exists, the OS temp directory otherwise.
func DefaultDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// filePrefix starts the name of every file this package creates; the pid that
// follows lets RemoveStale find the files of dead processes.
const filePrefix = "cb-kv-"

// Memory is a mapped KV memory: K and V planes of every layer as float32
// slices over one shared-memory file. The slices may be read and written
// concurrently by different goroutines and processes; coordinating writers of
// the same slots is the caller's job. Close is safe for concurrent use with
// itself but the slices must not be used after Close.
type Memory struct {
	path   string
	layout Layout
	owner  bool // created (and removed on Close) by this process
	data   []byte
	floats []float32

	closeOnce sync.Once
	closeErr  error
}

// Create makes a new shared-memory file (mode 0600, unique name
// cb-kv-<pid>-<random>.shm) in dir (DefaultDir when empty), sizes it for
// layout, zeroes it and maps it. Close unmaps and removes the file.
func Create(dir string, layout Layout) (*Memory, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	if dir == "" {
		dir = DefaultDir()
	}
	var f *os.File
	var err error
	for range 16 {
		name := fmt.Sprintf("%s%d-%016x.shm", filePrefix, os.Getpid(), rand.Uint64())
		f, err = os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil || !errors.Is(err, os.ErrExist) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kvcache: create shared memory: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(layout.Bytes()); err != nil {
		os.Remove(f.Name())
		return nil, fmt.Errorf("kvcache: size shared memory: %w", err)
	}
	m, err := mapFile(f, layout)
	if err != nil {
		os.Remove(f.Name())
		return nil, err
	}
	m.path = f.Name()
	m.owner = true
	return m, nil
}

// Open maps an existing shared-memory file created by Create with the same
// layout (the blend server's side). The file's size must equal
// layout.Bytes(). Close unmaps it and leaves the file in place.
func Open(path string, layout Layout) (*Memory, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("kvcache: open shared memory: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("kvcache: stat shared memory: %w", err)
	}
	if st.Size() != layout.Bytes() {
		return nil, fmt.Errorf("%w: file %s has %d bytes, layout needs %d", ErrBadLayout, path, st.Size(), layout.Bytes())
	}
	m, err := mapFile(f, layout)
	if err != nil {
		return nil, err
	}
	m.path = path
	return m, nil
}

func mapFile(f *os.File, layout Layout) (*Memory, error) {
	data, err := syscall.Mmap(int(f.Fd()), 0, int(layout.Bytes()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("kvcache: mmap: %w", err)
	}
	floats := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(data))), len(data)/4)
	return &Memory{layout: layout, data: data, floats: floats}, nil
}

// Path is the shared-memory file's path.
func (m *Memory) Path() string { return m.path }

// Layout is the layout the memory was mapped with.
func (m *Memory) Layout() Layout { return m.layout }

// K is the key plane of layer, shape [NumBlocks, BlockSize, KVHeads, HeadDim].
func (m *Memory) K(layer int) []float32 {
	n := m.layout.PlaneFloats()
	off := 2 * layer * n
	return m.floats[off : off+n : off+n]
}

// V is the value plane of layer, shape [NumBlocks, BlockSize, KVHeads, HeadDim].
func (m *Memory) V(layer int) []float32 {
	n := m.layout.PlaneFloats()
	off := (2*layer + 1) * n
	return m.floats[off : off+n : off+n]
}

// TokenK is the K vector (KVHeads*HeadDim floats) of one slot of one layer.
func (m *Memory) TokenK(layer, slot int) []float32 {
	t := m.layout.TokenFloats()
	return m.K(layer)[slot*t : (slot+1)*t : (slot+1)*t]
}

// TokenV is the V vector (KVHeads*HeadDim floats) of one slot of one layer.
func (m *Memory) TokenV(layer, slot int) []float32 {
	t := m.layout.TokenFloats()
	return m.V(layer)[slot*t : (slot+1)*t : (slot+1)*t]
}

// Close unmaps the memory and, when this process created it, removes the
// file. It is idempotent.
func (m *Memory) Close() error {
	m.closeOnce.Do(func() {
		if m.data != nil {
			m.closeErr = syscall.Munmap(m.data)
			m.data, m.floats = nil, nil
		}
		if m.owner {
			if err := os.Remove(m.path); err != nil && !errors.Is(err, os.ErrNotExist) && m.closeErr == nil {
				m.closeErr = fmt.Errorf("kvcache: remove shared memory: %w", err)
			}
		}
	})
	return m.closeErr
}

// RemoveStale removes shared-memory files in dir (DefaultDir when empty) that
// were created by processes no longer alive (a crash leaves its file behind).
// It returns the paths removed.
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
