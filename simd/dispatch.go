package simd

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
)

// Level is an instruction-set level of the kernels.
type Level int

// The kernel levels, from the pure-Go fallback to the widest vectors.
const (
	Generic Level = iota // pure Go, every CPU
	AVX2                 // AVX2 + FMA, 8-float vectors
	AVX512               // AVX-512 F/VL/BW/DQ, 16-float vectors
)

// String names the level as CB_SIMD spells it.
func (l Level) String() string {
	switch l {
	case Generic:
		return "off"
	case AVX2:
		return "avx2"
	case AVX512:
		return "avx512"
	}
	return fmt.Sprintf("Level(%d)", int(l))
}

// kernelFn computes a micro-tile c[mr×nr] (+)= a·b: a is packed [k][mr], b
// holds k rows of nr floats at stride ldb, c has stride ldc.
type kernelFn func(k int, a, b []float32, ldb int, c []float32, ldc int, acc bool)

// kernelUFn is kernelFn with a read in place: row i of the tile at
// a[i*lda:], element p at a[i*lda+p].
type kernelUFn func(k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool)

// impl is one level's dispatch table.
type impl struct {
	level    Level
	nr       int         // micro-tile width in floats
	mrMax    int         // micro-tile rows
	kern     []kernelFn  // index mr in [1, mrMax]
	kernU    []kernelUFn // the same, A unpacked
	peak     func(n int)
	peakFLOP float64 // FLOPs of one peak iteration

	dot      func(a, b []float32) float32
	dotRows  func(dst, q, k []float32, ldk int)
	axpyRows func(out, w, v []float32, ldv int)
	axpy     func(alpha float32, x, y []float32)
	scale    func(x []float32, s float32)
	sumsq    func(x []float32) float32
	mulScale func(dst, x, g []float32, s float32)
	maxf     func(x []float32) float32
	expSum   func(x []float32, k, off float32) float32
	swiglu   func(dst, g, u []float32)
	// dotTile4 is a 4×4 tile of DotTile (k a multiple of 16), nil where
	// the level has none.
	dotTile4 func(dst *float32, ldd int, a *float32, lda int, b *float32, ldb int, k int)
	// dotRowsH and axpyRowsH are DotRowsF16's and AxpyRowsF16's kernels,
	// nil where the level has none.
	dotRowsH  func(dst, q []float32, k []uint16, ldk int)
	axpyRowsH func(out, w []float32, v []uint16, ldv int)
}

// impls holds the tables this build and CPU support, by level; cur is the
// one in use.
var (
	impls [AVX512 + 1]*impl
	cur   atomic.Pointer[impl]
)

func init() {
	impls[Generic] = genericImpl()
	registerAsm()
	cur.Store(impls[fromEnv(os.Getenv("CB_SIMD"))])
}

// fromEnv maps a CB_SIMD value to a supported level: off/generic/go/none
// force pure Go, avx2 and avx512 cap the level, anything else is the best.
func fromEnv(v string) Level {
	want := Best()
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "off", "generic", "go", "none", "0", "false":
		want = Generic
	case "avx2":
		want = AVX2
	case "avx512":
		want = AVX512
	}
	for want > Generic && impls[want] == nil {
		want--
	}
	return want
}

// Best is the widest level this build supports on this CPU.
func Best() Level {
	for l := AVX512; l > Generic; l-- {
		if impls[l] != nil {
			return l
		}
	}
	return Generic
}

// Supported reports whether level l can run here.
func Supported(l Level) bool {
	return l >= Generic && l <= AVX512 && impls[l] != nil
}

// Current is the level the kernels use now.
func Current() Level { return cur.Load().level }

// SetLevel switches every kernel to level l (tests compare levels on one
// machine) and returns the previous level; it fails for a level the CPU or
// the build lacks. Calls already running finish on the level they started
// with.
func SetLevel(l Level) (Level, error) {
	if !Supported(l) {
		return Current(), fmt.Errorf("simd: level %v not supported on this CPU/build", l)
	}
	return cur.Swap(impls[l]).level, nil
}
