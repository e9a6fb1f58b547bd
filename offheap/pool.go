package offheap

import (
	"sync"
	"unsafe"
)

// DefaultPoolMax is how many free buffers a [Pool] keeps when its Max is 0.
const DefaultPoolMax = 4

// Pool recycles float32 scratch buffers mapped outside the Go heap: the
// large per-call buffers a sync.Pool would keep on the heap (where the
// collector counts them as live and lets the heap grow by as much again)
// and drop at every collection (so that they are allocated again, as
// garbage, after it). A Pool keeps at most Max free buffers (0:
// [DefaultPoolMax]) for the life of the process; a buffer put back beyond
// that is unmapped at once. The zero value is ready to use; a Pool must not
// be copied after first use. Safe for concurrent use.
type Pool struct {
	// Max is how many free buffers the pool keeps (0: DefaultPoolMax).
	Max int

	mu   sync.Mutex
	free []poolBuf
	// onHeap holds the first element of every heap slice handed out
	// because the kernel refused a mapping: Put must not unmap those.
	onHeap map[*float32]struct{}
}

// poolBuf is one buffer and whether it is mapped (Floats) or, where the
// kernel refused the mapping, an ordinary heap slice.
type poolBuf struct {
	s      []float32
	mapped bool
}

// Get returns a buffer of n floats (n ≥ 0) whose contents are undefined:
// a free one whose capacity holds n, or else a new mapping with a quarter
// of headroom (a heap slice if the kernel refuses it). Give it back with
// [Pool.Put] once no slice of it is used any more.
func (p *Pool) Get(n int) []float32 {
	p.mu.Lock()
	best := -1
	for i, b := range p.free {
		if cap(b.s) >= n && (best < 0 || cap(b.s) < cap(p.free[best].s)) {
			best = i
		}
	}
	if best >= 0 {
		b := p.free[best]
		p.free = append(p.free[:best], p.free[best+1:]...)
		p.mu.Unlock()
		return b.s[:n]
	}
	// None fits: the largest free buffer makes way for a bigger one (the
	// next Put brings the new one back), so the pool does not keep buffers
	// the calls have outgrown.
	var drop poolBuf
	if len(p.free) > 0 {
		big := 0
		for i, b := range p.free {
			if cap(b.s) > cap(p.free[big].s) {
				big = i
			}
		}
		drop = p.free[big]
		p.free = append(p.free[:big], p.free[big+1:]...)
		p.forget(drop)
	}
	p.mu.Unlock()
	release(drop)
	if n == 0 {
		return nil
	}
	s, err := Floats(n + n/4)
	if err != nil { // refused mapping: the heap still works
		s = make([]float32, n, n+n/4)
		p.mu.Lock()
		if p.onHeap == nil {
			p.onHeap = make(map[*float32]struct{})
		}
		p.onHeap[unsafe.SliceData(s)] = struct{}{}
		p.mu.Unlock()
	}
	return s[:n]
}

// Put gives back a buffer Get returned (any length, its capacity kept);
// neither it nor any slice of it may be used afterwards. A nil buffer is
// ignored.
func (p *Pool) Put(s []float32) {
	if cap(s) == 0 {
		return
	}
	max := p.Max
	if max <= 0 {
		max = DefaultPoolMax
	}
	p.mu.Lock()
	b := poolBuf{s: s[:0], mapped: true}
	if _, ok := p.onHeap[unsafe.SliceData(s)]; ok {
		b.mapped = false
	}
	if len(p.free) < max {
		p.free = append(p.free, b)
		b = poolBuf{}
	} else {
		p.forget(b)
	}
	p.mu.Unlock()
	release(b)
}

// Len is how many free buffers the pool holds.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

// Drain unmaps every free buffer (buffers still out are not affected).
func (p *Pool) Drain() {
	p.mu.Lock()
	free := p.free
	p.free = nil
	for _, b := range free {
		p.forget(b)
	}
	p.mu.Unlock()
	for _, b := range free {
		release(b)
	}
}

// forget drops a heap buffer leaving the pool from onHeap; p.mu is held.
func (p *Pool) forget(b poolBuf) {
	if !b.mapped && cap(b.s) > 0 {
		delete(p.onHeap, unsafe.SliceData(b.s[:1]))
	}
}

// release unmaps b if it is mapped (a heap buffer is left to the
// collector).
func release(b poolBuf) {
	if b.mapped {
		_ = Free(b.s) // cannot fail for a buffer of Floats
	}
}
