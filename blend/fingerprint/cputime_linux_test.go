//go:build linux

package fingerprint

import (
	"syscall"
	"time"
)

// threadCPU is the CPU time consumed by the calling OS thread (the caller
// locks its goroutine to the thread), so per-core throughput can be measured
// on a machine shared with other work.
func threadCPU() (time.Duration, bool) {
	const rusageThread = 1 // RUSAGE_THREAD
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
