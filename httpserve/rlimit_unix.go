//go:build unix

package httpserve

import "syscall"

// fdLimit returns the process's open-file limit (RLIMIT_NOFILE, soft), or 0
// when unknown or unlimited. Go raises the soft limit to the hard one at
// start-up.
func fdLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	lim := uint64(rl.Cur)
	if lim >= 1<<40 { // RLIM_INFINITY
		return 0
	}
	return lim
}
