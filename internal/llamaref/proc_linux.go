package llamaref

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// setProcAttr makes the kernel kill the child when the Go process dies.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// CPUBackend names the llama.cpp CPU backend the child loaded (the variant of the
// libggml-cpu-<variant>.so in its memory map, e.g. "zen4" or "haswell"), or "" when none is
// mapped or the map cannot be read.
func (r *Ref) CPUBackend() string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", r.cmd.Process.Pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if m := cpuLib.FindStringSubmatch(filepath.Base(line)); m != nil {
			return m[1]
		}
	}
	return ""
}
