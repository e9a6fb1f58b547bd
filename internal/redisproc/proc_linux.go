package redisproc

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel stop redis-server when the process that
// started it dies (a test binary or `cb up` killed with SIGKILL runs no
// cleanup): a server nobody can stop must not outlive its owner.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
