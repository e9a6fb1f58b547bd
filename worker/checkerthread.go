package worker

import (
	"runtime"
	"sync"
)

// checkerProcs adds one Go processor (GOMAXPROCS) to the process while a
// quality checker runs, for the checker's thread. The checker's full
// prefills run on one OS thread of the lowest priority (lowerThreadPriority):
// with a processor of its own, the request path keeps every processor it
// had and the kernel, not Go's scheduler, shares the cores — in favour of
// the request path. Without the extra processor, Go would time-slice the
// checker with the forward's goroutines, taking a third of the cores from
// the request path on a 2-core machine. GOMAXPROCS is process-wide, so the
// count is too: the first checker adds the processor and the last one
// gives it back. Safe for concurrent use.
var checkerProcs struct {
	mu   sync.Mutex
	n    int // running checkers
	base int // GOMAXPROCS before the first
}

// addCheckerProc notes a checker starting; removeCheckerProc its end.
func addCheckerProc() {
	checkerProcs.mu.Lock()
	defer checkerProcs.mu.Unlock()
	if checkerProcs.n == 0 {
		checkerProcs.base = runtime.GOMAXPROCS(0)
		runtime.GOMAXPROCS(checkerProcs.base + 1)
	}
	checkerProcs.n++
}

func removeCheckerProc() {
	checkerProcs.mu.Lock()
	defer checkerProcs.mu.Unlock()
	checkerProcs.n--
	if checkerProcs.n == 0 {
		runtime.GOMAXPROCS(checkerProcs.base)
	}
}
