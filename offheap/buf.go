package offheap

// BufMin is the smallest buffer (bytes) a [Buf] maps outside the heap;
// smaller ones are not worth a system call and stay on the heap.
const BufMin = 64 << 10

// Buf is one growable buffer of Ts outside the Go heap, for scratch memory
// a long-lived value keeps between calls (a product's quantized
// activations): on the heap, the collector would count it as live and let
// the heap grow by as much again. A buffer under [BufMin] bytes, or one the
// kernel refuses to map, is an ordinary heap slice.
//
// The owner must call [Buf.Free] when it is done; a value that embeds a Buf
// and may be dropped without that registers the Free as a cleanup, with the
// Buf behind a pointer of its own:
//
//	x.mem = new(offheap.Buf[uint32])
//	runtime.AddCleanup(x, (*offheap.Buf[uint32]).Free, x.mem)
//
// The zero value is empty and ready to use; a Buf must not be copied. Not
// safe for concurrent use.
type Buf[T Elem] struct {
	s      []T
	mapped bool
}

// Grow returns the buffer resized to n elements (n ≥ 0): its contents when
// its capacity holds n, else a new zeroed buffer with a quarter of
// headroom, the old one released — no slice Grow returned before may be
// used after a Grow that reallocates.
func (b *Buf[T]) Grow(n int) []T {
	if cap(b.s) >= n {
		return b.s[:n]
	}
	b.Free()
	c := n + n/4
	if c*sizeOf[T]() >= BufMin {
		if s, err := Make[T](c); err == nil {
			b.s, b.mapped = s, true
			return s[:n]
		}
		// Refused mapping: the heap still works.
	}
	b.s = make([]T, n, c)
	return b.s
}

// Free releases the buffer (unmapping it when mapped) and empties b; no
// slice of it may be used afterwards. Free of an empty Buf does nothing.
func (b *Buf[T]) Free() {
	if b.mapped {
		_ = Release(b.s) // cannot fail for a buffer of Make
	}
	b.s, b.mapped = nil, false
}

// Mapped reports whether the buffer lives outside the heap.
func (b *Buf[T]) Mapped() bool { return b.mapped }
