package model

import (
	"testing"

	"github.com/cacheblend/cacheblend/quant"
	"github.com/cacheblend/cacheblend/simd"
)

// BenchmarkQGemm compares, on one 2048×2048 projection of a 512-token
// prefill, the product with a weight computed from its file bytes (qgemm:
// Q8_0, F16) against the packed F32 weight (the built-in model's path).
func BenchmarkQGemm(b *testing.B) {
	const m, k, n = 512, 2048, 2048
	a := randMat(1, m*k)
	w := randMat(2, n*k) // n rows of k
	c := make([]float32, m*n)
	tm := newTeam(2)
	b.Run("packed-F32", func(b *testing.B) {
		pw := weightT(w, simd.PackB(k, n, w, k, true), n, k)
		b.ReportAllocs()
		for b.Loop() {
			gemm(tm, dense(c, m, n), dense(a, m, k), pw, true, false)
		}
		b.ReportMetric(2*m*k*n/b.Elapsed().Seconds()*float64(b.N)/1e9, "GFLOP/s")
	})
	for _, typ := range []quant.Type{quant.F32, quant.F16, quant.Q8_0, quant.Q4_K} {
		b.Run(typ.String(), func(b *testing.B) {
			data, err := quant.QuantizeRows(typ, w, k)
			if err != nil {
				b.Fatal(err)
			}
			q, err := newQmat(typ, k, n, data)
			if err != nil {
				b.Fatal(err)
			}
			qw := mat{rows: n, cols: k, stride: k, q: q}
			b.ReportAllocs()
			for b.Loop() {
				gemm(tm, dense(c, m, n), dense(a, m, k), qw, true, false)
			}
			b.ReportMetric(2*m*k*n/b.Elapsed().Seconds()*float64(b.N)/1e9, "GFLOP/s")
		})
	}
}
