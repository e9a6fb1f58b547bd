package worker

import "syscall"

// checkerNice is the checker thread's nice value: the lowest priority.
const checkerNice = 19

// lowerThreadPriority gives the calling OS thread (locked to its goroutine
// by the caller) the lowest scheduling priority. On Linux a nice value set
// for a thread id applies to that thread only.
func lowerThreadPriority() error {
	return syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), checkerNice)
}
