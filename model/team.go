package model

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// teamSpin is how long a team's helper waits for the next loop, yielding
// its processor, before it exits. A forward runs a loop every few hundred
// microseconds; between two of them the helper stays on its core, so the
// next loop starts on every thread within microseconds instead of waiting
// for an idle OS thread to be woken (tens of microseconds on a virtual
// machine, a quarter of a small loop).
const teamSpin = 50 * time.Microsecond

// team runs the parallel loops of a Model on threads goroutines: the
// caller's and threads-1 helpers. Helpers start with a loop, wait for the
// next one for up to teamSpin (yielding, so other goroutines still run)
// and exit when none comes: an idle Model holds no goroutine. One loop runs
// on the team at a time; a loop started while another runs (concurrent
// forward calls) runs on goroutines of its own, as parallel does. Safe for
// concurrent use.
type team struct {
	threads int
	busy    sync.Mutex
	job     atomic.Pointer[teamJob]
	alive   []atomic.Bool // alive[i]: helper i (1..threads-1) is running
}

// teamJob is one loop: tasks [0, n) of fn, taken from next by any thread.
type teamJob struct {
	n    int
	fn   func(worker, task int)
	next atomic.Int64
	done atomic.Int64
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
	if !t.busy.TryLock() {
		parallel(t.threads, n, fn)
		return
	}
	defer t.busy.Unlock()
	j := &teamJob{n: n, fn: fn}
	t.job.Store(j)
	for i := 1; i < min(t.threads, n); i++ {
		if t.alive[i].CompareAndSwap(false, true) {
			go t.helper(i, j)
		}
	}
	j.work(0)
	// The helpers finish the tasks they took; a helper that exits or is
	// late takes none, and this thread has done the rest.
	for j.done.Load() < int64(n) {
		runtime.Gosched()
	}
}

// work runs tasks of j until none is left.
func (j *teamJob) work(w int) {
	for {
		i := int(j.next.Add(1)) - 1
		if i >= j.n {
			return
		}
		j.fn(w, i)
		j.done.Add(1)
	}
}

// helper is helper i: it works on every loop published after j (j
// included) and exits after teamSpin without one.
func (t *team) helper(i int, j *teamJob) {
	defer t.alive[i].Store(false)
	for {
		j.work(i)
		idle := time.Now()
		for {
			if nj := t.job.Load(); nj != j {
				j = nj
				break
			}
			if time.Since(idle) > teamSpin {
				return
			}
			runtime.Gosched()
		}
	}
}
