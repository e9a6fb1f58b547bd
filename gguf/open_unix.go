//go:build unix

package gguf

import (
	"fmt"
	"math"
	"os"

	"golang.org/x/sys/unix"
)

// Open memory-maps the file at path read-only (MAP_SHARED, PROT_READ),
// parses and validates it. The tensor data is not copied: [File.Data]
// slices alias the mapping until [File.Close]. The mapping is released when
// the file does not parse.
func Open(path string) (*File, error) {
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
	data, err := unix.Mmap(int(fd.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("gguf: mmap %s: %w", path, err)
	}
	f, err := parse(data, prefix)
	if err != nil {
		_ = unix.Munmap(data)
		return nil, err
	}
	f.unmap = unix.Munmap
	return f, nil
}
