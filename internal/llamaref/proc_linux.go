package llamaref

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill the child when the Go process dies.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
