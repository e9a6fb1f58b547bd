package simd_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cacheblend/cacheblend/quant"
	"github.com/cacheblend/cacheblend/simd"
)

// halfRows returns n random rows of hd halves at stride ld (the gaps
// filled too) and the same rows converted to float32.
func halfRows(seed uint64, n, hd, ld int) ([]uint16, []float32) {
	r := rand.New(rand.NewPCG(seed, 9))
	size := (n-1)*ld + hd
	h := make([]uint16, size)
	f := make([]float32, size)
	for i := range h {
		h[i] = quant.F32ToF16(float32(r.NormFloat64()))
		f[i] = quant.F16ToF32(h[i])
	}
	return h, f
}

func floats(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 5))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// eachLevel runs fn at every level this CPU supports, Generic included.
func eachLevel(t *testing.T, fn func(t *testing.T, l simd.Level)) {
	for _, l := range []simd.Level{simd.Generic, simd.AVX2, simd.AVX512} {
		if !simd.Supported(l) {
			continue
		}
		t.Run(l.String(), func(t *testing.T) {
			prev, err := simd.SetLevel(l)
			if err != nil {
				t.Fatal(err)
			}
			defer simd.SetLevel(prev)
			fn(t, l)
		})
	}
}

// TestDotRowsF16 checks that DotRowsF16 gives DotRows's bits on the rows
// converted, for every shape it takes, and refuses the others untouched.
func TestDotRowsF16(t *testing.T) {
	for _, tc := range []struct {
		n, hd, ld int
		kernel    bool // a shape the AVX-512 kernel takes
	}{
		{16, 64, 64, true},
		{16, 64, 192, true},
		{32, 16, 80, true},
		{48, 128, 320, true},
		{16, 48, 100, true},
		{15, 64, 192, false},
		{17, 64, 192, false},
		{16, 40, 192, false},
	} {
		t.Run(fmt.Sprintf("n%d_hd%d_ld%d", tc.n, tc.hd, tc.ld), func(t *testing.T) {
			h, f := halfRows(uint64(tc.n*1000+tc.hd), tc.n, tc.hd, tc.ld)
			q := floats(uint64(tc.hd), tc.hd)
			eachLevel(t, func(t *testing.T, l simd.Level) {
				want := make([]float32, tc.n)
				simd.DotRows(want, q, f, tc.ld)
				got := make([]float32, tc.n)
				for i := range got {
					got[i] = -7
				}
				ok := simd.DotRowsF16(got, q, h, tc.ld)
				if wantOK := tc.kernel && l == simd.AVX512; ok != wantOK {
					t.Fatalf("reported %v, want %v", ok, wantOK)
				}
				for i := range got {
					switch {
					case !ok && got[i] != -7:
						t.Fatalf("refused but wrote dst[%d] = %v", i, got[i])
					case ok && math.Float32bits(got[i]) != math.Float32bits(want[i]):
						t.Fatalf("dst[%d] = %v, want %v (DotRows on the converted rows)", i, got[i], want[i])
					}
				}
			})
		})
	}
}

// TestAxpyRowsF16 checks that AxpyRowsF16 adds AxpyRows's bits on the rows
// converted, for heads of 1 to 4 vectors and any number of rows, and
// refuses other heads untouched.
func TestAxpyRowsF16(t *testing.T) {
	for _, tc := range []struct {
		n, hd, ld int
		kernel    bool
	}{
		{0, 64, 192, true},
		{1, 64, 192, true},
		{3, 16, 16, true},
		{4, 32, 96, true},
		{5, 48, 64, true},
		{16, 64, 192, true},
		{17, 64, 320, true},
		{16, 80, 192, false},
		{16, 8, 192, false},
	} {
		t.Run(fmt.Sprintf("n%d_hd%d_ld%d", tc.n, tc.hd, tc.ld), func(t *testing.T) {
			h, f := halfRows(uint64(tc.n*1000+tc.hd+1), max(tc.n, 1), tc.hd, tc.ld)
			w := floats(uint64(tc.n+2), tc.n)
			start := floats(7, tc.hd)
			eachLevel(t, func(t *testing.T, l simd.Level) {
				want := append([]float32(nil), start...)
				simd.AxpyRows(want, w, f, tc.ld)
				got := append([]float32(nil), start...)
				ok := simd.AxpyRowsF16(got, w, h, tc.ld)
				if wantOK := tc.kernel && l == simd.AVX512; ok != wantOK {
					t.Fatalf("reported %v, want %v", ok, wantOK)
				}
				if !ok {
					want = start
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("out[%d] = %v, want %v (ok %v)", i, got[i], want[i], ok)
					}
				}
			})
		})
	}
}

// TestRowsF16ShortPanics checks that an operand shorter than the rows it
// names panics at the level that has the kernels (instead of reading past
// it), and is refused without a read at the others.
func TestRowsF16ShortPanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func() bool
	}{
		{"dot", func() bool {
			return simd.DotRowsF16(make([]float32, 16), make([]float32, 64), make([]uint16, 15*192+63), 192)
		}},
		{"axpy", func() bool {
			return simd.AxpyRowsF16(make([]float32, 64), make([]float32, 3), make([]uint16, 2*192+63), 192)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachLevel(t, func(t *testing.T, l simd.Level) {
				panicked, ok := false, false
				func() {
					defer func() { panicked = recover() != nil }()
					ok = tc.fn()
				}()
				if want := l == simd.AVX512; panicked != want || ok {
					t.Fatalf("panicked %v (want %v), reported %v", panicked, want, ok)
				}
			})
		})
	}
}

// TestPrefetch checks that Prefetch takes any slice — empty, unaligned, a
// length that is not a whole number of lines — without faulting or
// changing it.
func TestPrefetch(t *testing.T) {
	buf := make([]byte, 4096+3)
	for i := range buf {
		buf[i] = byte(i)
	}
	for _, tc := range []struct {
		name   string
		lo, hi int
	}{
		{"empty", 0, 0},
		{"one byte", 5, 6},
		{"unaligned", 3, 3 + 200},
		{"whole", 0, len(buf)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			simd.Prefetch(buf[tc.lo:tc.hi])
			for i, b := range buf {
				if b != byte(i) {
					t.Fatalf("buf[%d] changed to %d", i, b)
				}
			}
		})
	}
	simd.Prefetch(nil)
}
