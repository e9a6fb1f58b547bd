//go:build !linux

package worker

import "errors"

// lowerThreadPriority is not available off Linux: the checker thread keeps
// the default priority.
func lowerThreadPriority() error {
	return errors.New("per-thread priority is only set on Linux")
}
