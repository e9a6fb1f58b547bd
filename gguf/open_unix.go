//go:build unix

package gguf

import (
	"fmt"
	"io"
	"math"
	"os"

	"golang.org/x/sys/unix"
)

// Open memory-maps the file at path read-only (MAP_SHARED, PROT_READ),
// parses and validates it. The tensor data is not copied: [File.Data]
// slices alias the mapping until [File.Close]. The mapping is released when
// the file does not parse. With [Resident] the file is read into anonymous
// memory instead.
func Open(path string, opts ...OpenOption) (*File, error) {
	var cfg openConfig
	for _, o := range opts {
		o(&cfg)
	}
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("gguf: %s is not a regular file", path)
	}
	prefix := path + ": "
	size := st.Size()
	if size == 0 {
		return nil, formatError(prefix, "empty file")
	}
	if size > math.MaxInt {
		return nil, formatError(prefix, "file of %d bytes is too large to map", size)
	}
	var mapping []byte // what unix.Munmap releases (len = cap)
	if cfg.resident {
		mapping, err = readResident(fd, int(size))
	} else {
		mapping, err = unix.Mmap(int(fd.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	}
	if err != nil {
		return nil, fmt.Errorf("gguf: load %s: %w", path, err)
	}
	f, err := parse(mapping[:size], prefix)
	if err != nil {
		_ = unix.Munmap(mapping)
		return nil, err
	}
	f.unmap = func([]byte) error { return unix.Munmap(mapping) }
	return f, nil
}

// readResident reads size bytes of fd into a private anonymous mapping
// advised for transparent huge pages and then made read-only (see
// Resident), returning the whole mapping (size rounded up to 2 MiB).
func readResident(fd *os.File, size int) ([]byte, error) {
	const huge = 2 << 20
	n := (size + huge - 1) / huge * huge
	data, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	// Advice only: a kernel without transparent huge pages refuses it,
	// and the copy in small pages still works.
	_ = unix.Madvise(data, unix.MADV_HUGEPAGE)
	if _, err := io.ReadFull(fd, data[:size]); err != nil {
		_ = unix.Munmap(data)
		return nil, fmt.Errorf("read: %w", err)
	}
	if err := unix.Mprotect(data, unix.PROT_READ); err != nil {
		_ = unix.Munmap(data)
		return nil, fmt.Errorf("mprotect: %w", err)
	}
	return data, nil
}
