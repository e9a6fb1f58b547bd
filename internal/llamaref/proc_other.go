//go:build !linux

package llamaref

import "os/exec"

func setProcAttr(cmd *exec.Cmd) {}
