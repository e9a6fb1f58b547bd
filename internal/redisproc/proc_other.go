//go:build !linux

package redisproc

import "os/exec"

func setProcAttr(cmd *exec.Cmd) {}
