package tp

import (
	"errors"
	"fmt"
	"github.com/cacheblend/cacheblend/simd"
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Segment header layout (every word on its own cache line).
const (
	offMagic  = 0   // uint32 segMagic
	offWorld  = 4   // uint32 world size
	offSlot   = 8   // uint32 floats per slot
	offCount  = 64  // uint32 ranks arrived at the current barrier
	offSense  = 128 // uint32 the barrier's sense
	offAbort  = 192 // uint32 0, or the abort code
	offPids   = 256 // int64 pid per rank
	headerLen = 4096

	segMagic = 0x43425450 // "CBTP"
)

// Abort codes in the segment's abort word.
const (
	abortNone = iota
	abortAborted
	abortDead
	abortTimeout
)

// spin, yield and busyWait bound the busy phases of a barrier wait before
// it sleeps. The busy phase lasts busyWait because a sleep costs far more
// than it asks for: with nothing else to run, the Go runtime's poller waits
// in whole milliseconds, so a 20 µs sleep returns after about 1 ms — at 32
// barriers per prefill that was a third of a 2-rank prefill's wall time.
// A rank owns its core (GOMAXPROCS=1 per rank), so spinning costs nothing
// another rank could use; a peer late by more than busyWait is a
// descheduled or dead one, and the wait then sleeps and checks liveness.
const (
	spinIters  = 2000
	yieldIters = 200
	busyWait   = 2 * time.Millisecond
	sleepStep  = 20 * time.Microsecond
)

// SegmentSize is the byte size of a segment for world ranks of slotFloats
// floats each (two slot sets).
func SegmentSize(world, slotFloats int) int {
	return headerLen + 2*world*slotFloats*4
}

// Reducer is one rank's AllReducer over a shared segment. It is used by one
// goroutine at a time; Abort is safe from any goroutine.
type Reducer struct {
	rank, world int
	timeout     time.Duration
	mem         []byte
	unmap       bool // mem is an mmap of a descriptor (Close unmaps it)
	count       *atomic.Uint32
	sense       *atomic.Uint32
	abort       *atomic.Uint32
	pids        []*atomic.Int64
	slots       [2][][]float32
	local       uint32
	round       int
	err         error
}

var _ AllReducer = (*Reducer)(nil)

// CreateSegment makes a new group segment for world ranks: an anonymous
// memfd (close-on-exec, nothing on the file system names it) sized by
// SegmentSize and initialised. The caller passes it to every rank process
// (an inherited descriptor, or SCM_RIGHTS) and closes it when the group ends.
func CreateSegment(world int, cfg Config) (*os.File, error) {
	cfg = cfg.withDefaults()
	if world < 1 || world > MaxWorld {
		return nil, fmt.Errorf("%w: world size %d outside 1..%d", ErrBadSegment, world, MaxWorld)
	}
	fd, err := unix.MemfdCreate("cb-tp", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("tp: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:cb-tp")
	size := SegmentSize(world, cfg.SlotFloats)
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("tp: size segment: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("tp: map segment: %w", err)
	}
	initHeader(mem, world, cfg.SlotFloats)
	if err := unix.Munmap(mem); err != nil {
		f.Close()
		return nil, fmt.Errorf("tp: unmap segment: %w", err)
	}
	return f, nil
}

func initHeader(mem []byte, world, slotFloats int) {
	u32(mem, offWorld).Store(uint32(world))
	u32(mem, offSlot).Store(uint32(slotFloats))
	u32(mem, offMagic).Store(segMagic)
}

// OpenSegment maps the segment f (from CreateSegment, possibly received
// from another process) as rank's reducer, after checking its size and
// header: nothing in it is trusted to size an allocation. It records this
// process's pid for the peers' liveness checks. cfg.SlotFloats is ignored
// (the header's value is used); cfg.Timeout bounds the barrier waits. f may
// be closed once OpenSegment returns.
func OpenSegment(f *os.File, rank int, cfg Config) (*Reducer, error) {
	cfg = cfg.withDefaults()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("tp: stat segment: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < headerLen || st.Size > int64(SegmentSize(MaxWorld, 1<<24)) {
		return nil, fmt.Errorf("%w: not a regular file of a plausible size (mode %#o, %d bytes)", ErrBadSegment, st.Mode, st.Size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("tp: map segment: %w", err)
	}
	r, err := newReducer(mem, rank, cfg.Timeout)
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	r.unmap = true
	r.pids[rank].Store(int64(os.Getpid()))
	return r, nil
}

// NewLocalGroup returns the world ranks of a group whose segment is a Go
// slice: the ranks run as goroutines of this process (tests, and the
// benchmarks' single-process runs). It has no pids to watch: a rank that
// stops calling must Abort, or its peers wait until cfg.Timeout.
func NewLocalGroup(world int, cfg Config) ([]*Reducer, error) {
	cfg = cfg.withDefaults()
	if world < 1 || world > MaxWorld {
		return nil, fmt.Errorf("%w: world size %d outside 1..%d", ErrBadSegment, world, MaxWorld)
	}
	// []uint64 backing keeps the header words 8-byte aligned.
	words := make([]uint64, (SegmentSize(world, cfg.SlotFloats)+7)/8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	initHeader(mem, world, cfg.SlotFloats)
	rs := make([]*Reducer, world)
	for i := range rs {
		r, err := newReducer(mem, i, cfg.Timeout)
		if err != nil {
			return nil, err
		}
		rs[i] = r
	}
	return rs, nil
}

func newReducer(mem []byte, rank int, timeout time.Duration) (*Reducer, error) {
	if len(mem) < headerLen || u32(mem, offMagic).Load() != segMagic {
		return nil, fmt.Errorf("%w: no segment header", ErrBadSegment)
	}
	world := int(u32(mem, offWorld).Load())
	slot := int(u32(mem, offSlot).Load())
	switch {
	case world < 1 || world > MaxWorld:
		return nil, fmt.Errorf("%w: world size %d outside 1..%d", ErrBadSegment, world, MaxWorld)
	case slot < 1 || slot > 1<<24:
		return nil, fmt.Errorf("%w: slot of %d floats", ErrBadSegment, slot)
	case len(mem) < SegmentSize(world, slot):
		return nil, fmt.Errorf("%w: %d bytes, %d ranks of %d floats need %d", ErrBadSegment, len(mem), world, slot, SegmentSize(world, slot))
	case rank < 0 || rank >= world:
		return nil, fmt.Errorf("%w: rank %d outside [0, %d)", ErrBadSegment, rank, world)
	}
	r := &Reducer{
		rank: rank, world: world, timeout: timeout, mem: mem,
		count: u32(mem, offCount), sense: u32(mem, offSense), abort: u32(mem, offAbort),
		pids: make([]*atomic.Int64, world),
	}
	// The local sense starts at the shared one (0 in a new segment).
	r.local = r.sense.Load()
	for q := range world {
		r.pids[q] = (*atomic.Int64)(unsafe.Pointer(&mem[offPids+8*q]))
	}
	for s := range 2 {
		r.slots[s] = make([][]float32, world)
		for q := range world {
			off := headerLen + (s*world+q)*slot*4
			r.slots[s][q] = unsafe.Slice((*float32)(unsafe.Pointer(&mem[off])), slot)
		}
	}
	return r, nil
}

func u32(mem []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

// Rank is this reducer's rank.
func (r *Reducer) Rank() int { return r.rank }

// Size is the group's world size.
func (r *Reducer) Size() int { return r.world }

// Abort fails the group: every rank's current and later AllReduce returns
// ErrAborted (unless it already failed otherwise).
func (r *Reducer) Abort() { r.abort.CompareAndSwap(abortNone, abortAborted) }

// PeerDied marks the group failed because a peer's process ended (the rank
// that reaps a child calls it): every rank's AllReduce returns ErrPeerDead.
func (r *Reducer) PeerDied() { r.abort.CompareAndSwap(abortNone, abortDead) }

// WatchPeer records pid as rank's process until that rank records its own
// (the rank that starts a peer process knows it first), so a peer that dies
// before mapping the segment is still detected.
func (r *Reducer) WatchPeer(rank, pid int) {
	if rank >= 0 && rank < r.world && pid > 0 {
		r.pids[rank].CompareAndSwap(0, int64(pid))
	}
}

// Close unmaps a segment opened with OpenSegment (a no-op for a local
// group). The reducer must not be used afterwards.
func (r *Reducer) Close() error {
	if !r.unmap || r.mem == nil {
		return nil
	}
	mem := r.mem
	r.mem = nil
	if err := unix.Munmap(mem); err != nil {
		return fmt.Errorf("tp: unmap segment: %w", err)
	}
	return nil
}

// AllReduce replaces buf with the sum over the ranks of their bufs, summed
// in rank order (so every rank gets the same bits). A vector longer than a
// slot is reduced in several rounds.
func (r *Reducer) AllReduce(buf []float32) error {
	if r.err != nil {
		return r.err
	}
	if r.world == 1 {
		return nil
	}
	n := len(r.slots[0][0])
	for off := 0; off < len(buf); off += n {
		chunk := buf[off:min(len(buf), off+n)]
		set := r.slots[r.round&1]
		r.round++
		copy(set[r.rank], chunk)
		if err := r.barrier(); err != nil {
			r.err = err
			return err
		}
		copy(chunk, set[0][:len(chunk)])
		for q := 1; q < r.world; q++ {
			addTo(chunk, set[q][:len(chunk)])
		}
	}
	return nil
}

func addTo(dst, src []float32) { simd.Axpy(1, src[:len(dst)], dst) }

// barrier is a sense-reversing barrier: the last rank to arrive resets the
// count and flips the sense the others wait on.
func (r *Reducer) barrier() error {
	r.local ^= 1
	if r.count.Add(1) == uint32(r.world) {
		r.count.Store(0)
		r.sense.Store(r.local)
		return nil
	}
	var began, deadline time.Time
	for i := 0; ; i++ {
		if r.sense.Load() == r.local {
			return nil
		}
		if code := r.abort.Load(); code != abortNone {
			return abortErr(code)
		}
		switch {
		case i < spinIters:
			continue
		case i < spinIters+yieldIters:
			runtime.Gosched()
			continue
		}
		now := time.Now()
		if deadline.IsZero() {
			began = now
			deadline = now.Add(r.timeout)
		}
		if now.Sub(began) < busyWait {
			runtime.Gosched()
			continue
		}
		if q := r.deadPeer(); q >= 0 {
			r.abort.CompareAndSwap(abortNone, abortDead)
			return fmt.Errorf("%w: rank %d (pid %d)", ErrPeerDead, q, r.pids[q].Load())
		}
		if now.After(deadline) {
			r.abort.CompareAndSwap(abortNone, abortTimeout)
			return fmt.Errorf("%w (%v)", ErrTimeout, r.timeout)
		}
		time.Sleep(sleepStep)
	}
}

// deadPeer returns a peer whose recorded process is gone, or -1.
func (r *Reducer) deadPeer() int {
	for q, p := range r.pids {
		if q == r.rank {
			continue
		}
		pid := int(p.Load())
		if pid <= 0 {
			continue
		}
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			return q
		}
	}
	return -1
}

func abortErr(code uint32) error {
	switch code {
	case abortDead:
		return ErrPeerDead
	case abortTimeout:
		return ErrTimeout
	default:
		return ErrAborted
	}
}
