package quant

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cacheblend/cacheblend/simd"
)

// q8kRef is quantize_row_q8_K written out for one block, in natural order.
func q8kRef(x []float32) (d float32, q []int8) {
	q = make([]int8, len(x))
	var amax, mx float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, mx = a, v
		}
	}
	if amax == 0 {
		return 0, q
	}
	iscale := -127 / mx
	for i, v := range x {
		q[i] = int8(min(127, math.RoundToEven(float64(iscale*v))))
	}
	return 1 / iscale, q
}

// TestDotQ8K checks DotQ8K at every level against Σ dequant(w)·d·q in
// float64 (refElem's dequantization, q8kRef's quantization), on rows with
// and without outliers, and a block of zeros.
func TestDotQ8K(t *testing.T) {
	levels := []simd.Level{simd.Generic}
	for _, l := range []simd.Level{simd.AVX2, simd.AVX512} {
		if simd.Supported(l) {
			levels = append(levels, l)
		}
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, l := range levels {
		for _, typ := range []Type{Q4_K, Q6_K} {
			for _, tc := range []struct {
				name string
				n    int
				x    func(n int) []float32
			}{
				{"1 block", 256, func(n int) []float32 { return gauss(r, n, 1) }},
				{"8 blocks", 2048, func(n int) []float32 { return gauss(r, n, 0.3) }},
				{"outliers", 1024, func(n int) []float32 { return gaussOutliers(r, n, 1) }},
				{"zero block", 512, func(n int) []float32 { x := gauss(r, n, 1); clear(x[256:]); return x }},
			} {
				t.Run(fmt.Sprintf("%v/%s/%s", l, typ, tc.name), func(t *testing.T) {
					prev, err := simd.SetLevel(l)
					if err != nil {
						t.Fatal(err)
					}
					defer simd.SetLevel(prev)
					for trial := range 20 {
						w := randomRow(r, typ, tc.n)
						x := tc.x(tc.n)
						var q Q8K
						if err := q.Quantize(x); err != nil {
							t.Fatal(err)
						}
						var want, mag float64
						for b := 0; b < tc.n; b += QK_K {
							d, qs := q8kRef(x[b : b+QK_K])
							if d != q.d[b/QK_K] {
								t.Fatalf("block %d scale %g, want %g", b/QK_K, q.d[b/QK_K], d)
							}
							for i, v := range qs {
								p := float64(refElem(typ, w, b+i)) * float64(d) * float64(v)
								want += p
								mag += math.Abs(p)
							}
						}
						got := float64(DotQ8K(typ, w, &q))
						if math.Abs(got-want) > 1e-5*(mag+1) {
							t.Fatalf("trial %d: DotQ8K = %g, want %g (Σ|terms| %g)", trial, got, want, mag)
						}
					}
				})
			}
		}
	}
}

func TestQ8KErrors(t *testing.T) {
	var q Q8K
	if err := q.Quantize(make([]float32, 100)); err == nil {
		t.Fatal("Quantize of 100 values: no error")
	}
	if SupportsQ8K(Q8_0) || !SupportsQ8K(Q4_K) || !SupportsQ8K(Q6_K) {
		t.Fatal("SupportsQ8K: want Q4_K and Q6_K")
	}
}

func BenchmarkDotQ8K(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const k, rows = 2048, 2048
	w := randomRow(r, Q4_K, k*rows)
	rb := len(w) / rows
	x := gauss(r, k, 1)
	var q Q8K
	if err := q.Quantize(x); err != nil {
		b.Fatal(err)
	}
	b.Run("Q4_K-Q8K", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for j := range rows {
				DotQ8K(Q4_K, w[j*rb:(j+1)*rb], &q)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(k*rows), "ns/weight")
	})
	b.Run("float", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for j := range rows {
				Dot(Q4_K, w[j*rb:(j+1)*rb], x)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(k*rows), "ns/weight")
	})
}

// TestDotQ8KRows checks DotQ8KRows at every level against DotQ8K row by
// row, for 1 to 4 rows of Q4_K and Q6_K weights.
func TestDotQ8KRows(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	atEachLevel(t, func(t *testing.T) {
		for _, typ := range []Type{Q4_K, Q6_K} {
			for _, n := range []int{256, 2048} {
				for rows := 1; rows <= Q8KRowsMax; rows++ {
					t.Run(fmt.Sprintf("%s/n%d/rows%d", typ, n, rows), func(t *testing.T) {
						for trial := range 10 {
							w := randomRow(r, typ, n)
							xs := make([][]float32, rows)
							for i := range xs {
								xs[i] = gaussOutliers(r, n, float64(i+1))
							}
							var batch Q8KRows
							if err := batch.Quantize(xs...); err != nil {
								t.Fatal(err)
							}
							if batch.Rows() != rows {
								t.Fatalf("Rows = %d, want %d", batch.Rows(), rows)
							}
							out := make([]float32, rows)
							DotQ8KRows(typ, w, &batch, out)
							for i, x := range xs {
								var q Q8K
								if err := q.Quantize(x); err != nil {
									t.Fatal(err)
								}
								want := DotQ8K(typ, w, &q)
								if math.Abs(float64(out[i]-want)) > 1e-5*(1+math.Abs(float64(want))) {
									t.Fatalf("trial %d row %d: %g, want %g", trial, i, out[i], want)
								}
							}
						}
					})
				}
			}
		}
	})
	var b Q8KRows
	if err := b.Quantize(); err == nil {
		t.Error("Quantize of no rows: no error")
	}
	if err := b.Quantize(make([]float32, 256), make([]float32, 512)); err == nil {
		t.Error("Quantize of rows of two lengths: no error")
	}
}
