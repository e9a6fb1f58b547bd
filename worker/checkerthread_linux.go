package worker

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// checkerNice is the checker thread's nice value: the lowest priority.
const checkerNice = 19

// lowerThreadPriority gives the calling OS thread (locked to its goroutine
// by the caller) the lowest scheduling priority. On Linux a nice value set
// for a thread id applies to that thread only.
func lowerThreadPriority() error {
	return syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), checkerNice)
}

// threadCPU is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID:
// the scheduler's own count, to the nanosecond; getrusage's may advance by
// whole ticks); ok is false when it cannot be read. The checker's goroutine
// is locked to its thread and computes on it alone (a one-thread model
// view), so the difference of two readings is what a comparison cost in CPU.
func threadCPU() (d time.Duration, ok bool) {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
