package offheap

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pageSize is the granularity of a mapping.
var pageSize = os.Getpagesize()

// Elem is the element types a buffer outside the Go heap may hold: numbers,
// which hold no pointer the collector would have to see.
type Elem interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

// Make returns n zeroed Ts in a new private anonymous mapping, the slice's
// capacity covering the whole mapping (n·size rounded up to a page). It
// returns an error when n is not positive or the kernel refuses the
// mapping (the caller may fall back to make). Release it with [Release].
func Make[T Elem](n int) ([]T, error) {
	size := sizeOf[T]()
	if n <= 0 || n > (1<<62)/size {
		return nil, fmt.Errorf("offheap: %d elements of %d bytes", n, size)
	}
	bytes := (n*size + pageSize - 1) / pageSize * pageSize
	b, err := unix.Mmap(-1, 0, bytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("offheap: map %d bytes: %w", bytes, err)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), bytes/size)[:n], nil
}

// Release unmaps a buffer Make returned. s must start where Make's slice
// started and keep its capacity (any length); neither s nor any slice of
// the buffer may be used afterwards.
func Release[T Elem](s []T) error {
	size := sizeOf[T]()
	c := cap(s)
	if c == 0 || c*size%pageSize != 0 {
		return fmt.Errorf("offheap: release of a slice of capacity %d: not a buffer of Make", c)
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s[:c]))), c*size)
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("offheap: unmap %d bytes: %w", len(b), err)
	}
	return nil
}

// Floats is Make[float32].
func Floats(n int) ([]float32, error) { return Make[float32](n) }

// Free is Release[float32].
func Free(s []float32) error { return Release(s) }

// sizeOf is the size in bytes of a T.
func sizeOf[T Elem]() int { return int(unsafe.Sizeof(*new(T))) }
