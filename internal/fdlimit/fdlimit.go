// Package fdlimit raises the process's open-file limit, for tests and
// tools that hold thousands of connections.
package fdlimit

import (
	"fmt"
	"syscall"
)

// Raise lifts the soft RLIMIT_NOFILE to at least need (up to the hard
// limit, which an unprivileged process cannot pass; root may raise it too)
// and returns the soft limit in force. It fails when need cannot be had.
// Child processes started afterwards inherit the limit.
func Raise(need uint64) (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("fdlimit: %w", err)
	}
	if rl.Cur >= need {
		return rl.Cur, nil
	}
	want := rl
	want.Cur = need
	if want.Max < need {
		want.Max = need // allowed for root only
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		want.Cur, want.Max = min(need, rl.Max), rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			return rl.Cur, fmt.Errorf("fdlimit: raise the open-file limit to %d: %w", need, err)
		}
	}
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("fdlimit: %w", err)
	}
	if rl.Cur < need {
		return rl.Cur, fmt.Errorf("fdlimit: open-file limit %d (hard %d), need %d", rl.Cur, rl.Max, need)
	}
	return rl.Cur, nil
}
