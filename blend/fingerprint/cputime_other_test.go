//go:build !linux

package fingerprint

import "time"

func threadCPU() (time.Duration, bool) { return 0, false }
