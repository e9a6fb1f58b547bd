package model

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// teamSpin is how long a team's helper waits for the next loop, yielding
// its processor, once the last one is done, before it exits. A forward
// runs a loop every few hundred microseconds; between two of them the
// helper stays on its core, so the next loop starts on every thread within
// microseconds instead of waiting for a helper started anew: a new
// goroutine waited a median of 108 µs before it ran (an idle OS thread
// woken on this virtual machine), and at 50 µs, with the wait counted from
// the helper's last task instead of the loop's end, a Llama-3.2-1B F16
// decode step started its helper 27–45 times (it exited while the caller
// still ran a task of a large product, or did a loop's serial work) and
// the helper ran 78 % of the step; now it starts once and runs 92 %
// (runtime/trace, 30 steps). An idle model's helper exits after teamSpin.
const teamSpin = time.Millisecond

// teamDoneWait bounds how long a helper with no task left waits for the
// other threads to finish the loop's last ones before teamSpin starts.
const teamDoneWait = time.Second

// team runs the parallel loops of a Model on threads goroutines: the
// caller's and threads-1 helpers. Helpers start with a loop, wait for the
// next one for up to teamSpin after it is done (yielding, so other
// goroutines still run) and exit when none comes: an idle Model holds no
// goroutine. One loop runs on the team at a time; a loop started while
// another runs (concurrent forward calls) runs on goroutines of its own,
// as parallel does. Safe for concurrent use.
type team struct {
	threads int
	busy    sync.Mutex
	job     atomic.Pointer[teamJob]
	alive   []atomic.Bool // alive[i]: helper i (1..threads-1) is running
	started atomic.Int64  // helpers started (the tests count them)
}

// teamJob is one loop: tasks [0, n) of fn, cut into one contiguous range
// per thread. A thread takes its own range's tasks from the front, in
// order, then steals the other ranges' from their backs, one at a time.
// A thread's tasks are thus neighbours, and so are the weight rows or the
// cached positions they read, which the hardware prefetchers follow from
// one task into the next; taken in turns from one shared counter (as they
// were), each thread's next task lay a task or more ahead of its last, and
// every task began a new stream from memory. In SmolLM2-135M Q4_K_M
// decode steps (2 threads, 400 steps, 3 alternations) the 576×576 Q5_0
// products (eight tasks of 28 KiB) went from 13.4–14.1 to 14.9–16.4 GB/s
// and the Q6_K down projections from 26.0–28.3 to 28.1–32.3; the step's
// mean from 6.78/6.22/5.77/5.97 to 5.96/5.85/5.45/5.50 ms and its fastest
// from 5.21/4.93/4.47/4.82 to 5.10/4.48/4.21/4.70 (4 alternations of 400).
type teamJob struct {
	n      int
	fn     func(worker, task int)
	ranges []teamRange
	inline [teamInline]teamRange // ranges' storage for small teams
	done   atomic.Int64
}

// teamInline is the most threads whose ranges a teamJob holds inline.
const teamInline = 8

// maxTeamTasks is the most tasks a teamRange's 32-bit bounds hold; a loop
// of more (none the model runs) goes to parallel's shared counter.
const maxTeamTasks = 1<<32 - 1

// teamRange is a thread's range of tasks [lo, hi), lo in the low 32 bits
// of lohi and hi in the high: the owner takes lo, thieves take hi−1, each
// by compare-and-swap, so a task is taken once. Not padded to a cache
// line of its own: a loop's tasks take microseconds or more, so the line
// the ranges share moves between cores a few times a task, as the one
// shared counter did; padded, every loop's job was 512 bytes of garbage
// (a SmolLM2-135M decode step runs about 165 loops).
type teamRange struct {
	lohi atomic.Uint64
}

// newTeamJob cuts [0, n) into parts contiguous ranges of equal size (the
// first n%parts one task longer).
func newTeamJob(n, parts int, fn func(worker, task int)) *teamJob {
	j := &teamJob{n: n, fn: fn}
	if parts <= teamInline {
		j.ranges = j.inline[:parts]
	} else {
		j.ranges = make([]teamRange, parts)
	}
	lo := 0
	for i := range j.ranges {
		hi := lo + n/parts
		if i < n%parts {
			hi++
		}
		j.ranges[i].lohi.Store(uint64(lo) | uint64(hi)<<32)
		lo = hi
	}
	return j
}

// take removes a task from the range, from the front (front) or the back,
// and reports false when the range is empty.
func (r *teamRange) take(front bool) (int, bool) {
	for {
		v := r.lohi.Load()
		lo, hi := uint32(v), uint32(v>>32)
		if lo >= hi {
			return 0, false
		}
		var nv uint64
		var i uint32
		if front {
			i, nv = lo, uint64(lo+1)|uint64(hi)<<32
		} else {
			i, nv = hi-1, uint64(lo)|uint64(hi-1)<<32
		}
		if r.lohi.CompareAndSwap(v, nv) {
			return int(i), true
		}
	}
}

func newTeam(threads int) *team {
	return &team{threads: max(threads, 1), alive: make([]atomic.Bool, max(threads, 1))}
}

// run calls fn(worker, task) for every task in [0, n) on at most the
// team's threads (worker < threads) and returns when all are done.
func (t *team) run(n int, fn func(worker, task int)) {
	if n <= 0 {
		return
	}
	if t.threads <= 1 || n == 1 {
		for i := range n {
			fn(0, i)
		}
		return
	}
	if uint64(n) > maxTeamTasks || !t.busy.TryLock() {
		parallel(t.threads, n, fn)
		return
	}
	defer t.busy.Unlock()
	j := newTeamJob(n, min(t.threads, n), fn)
	t.job.Store(j)
	for i := 1; i < min(t.threads, n); i++ {
		if t.alive[i].CompareAndSwap(false, true) {
			t.started.Add(1)
			go t.helper(i, j)
		}
	}
	j.work(0)
	// The helpers finish the tasks they took; a helper that exits or is
	// late takes none, and this thread has done the rest.
	for k := 0; j.done.Load() < int64(n); k++ {
		spinYield(k)
	}
}

// work runs tasks of j until none is left: worker w's own range first,
// from its front, then the others' from their backs.
func (j *teamJob) work(w int) {
	for k := range len(j.ranges) {
		r := &j.ranges[(w+k)%len(j.ranges)]
		for {
			i, ok := r.take(k == 0)
			if !ok {
				break
			}
			j.fn(w, i)
			j.done.Add(1)
		}
	}
}

// helper is helper i: it works on every loop published after j (j
// included) and exits when none comes within teamSpin of the last one's
// end.
func (t *team) helper(i int, j *teamJob) {
	defer t.alive[i].Store(false)
	for {
		j.work(i)
		// Other threads may still run j's last tasks (one task of a large
		// product takes milliseconds); the next loop cannot come before
		// j is done, so the wait for it starts then (a loop that never
		// ends, its task having panicked on a caller that recovered, keeps
		// the helper for teamDoneWait at most).
		end := time.Now().Add(teamDoneWait)
		for k := 0; j.done.Load() < int64(j.n); k++ {
			if spinYield(k) && time.Now().After(end) {
				break
			}
		}
		idle := time.Now()
		for k := 0; ; k++ {
			if nj := t.job.Load(); nj != j {
				j = nj
				break
			}
			if spinYield(k) && time.Since(idle) > teamSpin {
				return
			}
		}
	}
}

// teamPolls is how many times a waiting thread of a team checks what it
// waits for between two yields of its processor.
const teamPolls = 128

// spinYield is the pause of a waiting thread of a team after its k-th
// check: every teamPolls checks it yields its processor (runtime.Gosched),
// so other goroutines still run, and reports true, when the thread may
// look at the clock for its time-out; between, it returns false at once. Yielding on
// every check put each wait through the scheduler, which also woke idle
// OS threads (runtime.wakep): 8 % of the CPU time of a SmolLM2-135M
// Q4_K_M decode step, 2 % with a yield every 128 checks, and the fastest
// of 500 steps 5.3–5.9 → 4.7–5.5 ms (4 alternations).
func spinYield(k int) bool {
	if k%teamPolls != teamPolls-1 {
		return false
	}
	runtime.Gosched()
	return true
}
