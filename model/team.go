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
