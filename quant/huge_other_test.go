//go:build !unix

package quant

import "testing"

// weightMemory returns n zeroed bytes (on Unix, in huge pages as a model's
// resident weights are).
func weightMemory(_ testing.TB, n int) []byte { return make([]byte, n) }
