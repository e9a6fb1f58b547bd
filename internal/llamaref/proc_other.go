//go:build !linux

package llamaref

import "os/exec"

func setProcAttr(cmd *exec.Cmd) {}

// CPUBackend names the llama.cpp CPU backend the child loaded; "" where /proc is missing.
func (r *Ref) CPUBackend() string { return "" }
