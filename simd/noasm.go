//go:build !amd64 || noasm

package simd

// registerAsm has nothing to register without the amd64 assembly.
func registerAsm() {}

// rotF32Asm has no assembly to run.
func rotF32Asm(Level, []float32, []float32, []float32, []float32) bool { return false }

// rotF64Asm has no assembly to run.
func rotF64Asm(Level, []float32, []float32, []float64, []float64) bool { return false }

// Prefetch is a hint that brings b's cache lines closer on amd64; without
// the assembly it does nothing.
func Prefetch(b []byte) {}
