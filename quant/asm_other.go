//go:build !amd64 || noasm

package quant

// useAsm installs nothing: this build has only the pure-Go kernels.
func useAsm() {}

// asmLevel names the kernels in use.
func asmLevel() string { return "go" }

// dotQ8KAsm has no assembly to run.
func dotQ8KAsm(Type, []byte, *Q8K) (float32, bool) { return 0, false }

// dotQ80Asm has no assembly to run.
func dotQ80Asm(Type, []byte, *Q80, int) (float32, bool) { return 0, false }

// integerAsm: no assembly here.
func integerAsm() bool { return false }

// integerGEMM: no assembly here.
func integerGEMM() bool { return false }

// integerGEMV: no assembly here.
func integerGEMV(Type) bool { return false }

// dotQ8KRowsAsm has no assembly to run.
func dotQ8KRowsAsm(Type, []byte, *Q8KRows, []float32) bool { return false }

// dotQ80RowsAsm has no assembly to run.
func dotQ80RowsAsm(Type, []byte, *Q80Rows, []float32) bool { return false }

// gemmAsm has no assembly to run.
func gemmAsm(Type, []uint32, []uint32, *float32, int, int) bool {
	return false
}

// dotQ80ManyAsm has no assembly to run.
func dotQ80ManyAsm(Type, [][]byte, *Q80, []float32) bool { return false }

// dotQ8KManyAsm has no assembly to run.
func dotQ8KManyAsm(Type, [][]byte, *Q8K, []float32) bool { return false }

// dotHalfManyAsm has no assembly to run.
func dotHalfManyAsm(Type, [][]byte, []float32, []float32) bool { return false }

// q8kBlockAsm has no assembly to run.
func q8kBlockAsm([]float32, *[QK_K]int8) (float32, bool) { return 0, false }

// q80BlocksAsm has no assembly to run.
func q80BlocksAsm([]float32, []int8, []float32) bool { return false }

// halfTileAsm: no assembly here.
func halfTileAsm(Type, int) bool { return false }

// halfTile is never called (halfTileAsm is false).
func halfTile(Type, tileForm, *[]byte, *float32, int, int, *float32, *byte, int) {}

// dotQ80RowsManyAsm has no assembly to run.
func dotQ80RowsManyAsm(Type, [][]byte, *Q80Rows, []float32) bool { return false }

// dotQ8KRowsManyAsm has no assembly to run.
func dotQ8KRowsManyAsm(Type, [][]byte, *Q8KRows, []float32) bool { return false }

// hasVBMI: no assembly here.
var hasVBMI bool

// streamAhead: no assembly here, nothing asks ahead.
var streamAhead int64

// avxVNNI: no assembly here.
var avxVNNI int

// roundF16Asm has no assembly to run.
func roundF16Asm([]float32) int { return 0 }
