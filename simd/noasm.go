//go:build !amd64 || noasm

package simd

// registerAsm has nothing to register without the amd64 assembly.
func registerAsm() {}
