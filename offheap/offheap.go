package offheap

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pageSize is the granularity of a mapping.
var pageSize = os.Getpagesize()

// Floats returns n zeroed float32s in a new private anonymous mapping, the
// slice's capacity covering the whole mapping (n rounded up to a page). It
// returns an error when n is not positive or the kernel refuses the
// mapping (the caller may fall back to make). Release it with [Free].
func Floats(n int) ([]float32, error) {
	if n <= 0 || n > (1<<62)/4 {
		return nil, fmt.Errorf("offheap: %d floats", n)
	}
	size := (n*4 + pageSize - 1) / pageSize * pageSize
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("offheap: map %d bytes: %w", size, err)
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), size/4)[:n], nil
}

// Free unmaps a buffer Floats returned. s must start where Floats' slice
// started and keep its capacity (any length); neither s nor any slice of
// the buffer may be used afterwards.
func Free(s []float32) error {
	c := cap(s)
	if c == 0 || c*4%pageSize != 0 {
		return fmt.Errorf("offheap: free of a slice of capacity %d: not a buffer of Floats", c)
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s[:c]))), c*4)
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("offheap: unmap %d bytes: %w", len(b), err)
	}
	return nil
}
