//go:build !linux

package worker

import (
	"errors"
	"time"
)

// lowerThreadPriority is not available off Linux: the checker thread keeps
// the default priority.
func lowerThreadPriority() error {
	return errors.New("per-thread priority is only set on Linux")
}

// threadCPU cannot be read off Linux: the checker's budget then counts
// wall time.
func threadCPU() (time.Duration, bool) { return 0, false }
