package quant

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestDotQ80 checks Quantize against quantize_row_q8_0 written out and
// DotQ80 at every level against Σ dequant(w)·d·q in float64 (refElem's
// dequantization), on an odd number of blocks (the Go tail after the
// assembly's pairs), rows with outliers and a block of zeros.
func TestDotQ80(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	atEachLevel(t, func(t *testing.T) {
		for _, typ := range []Type{Q8_0, Q5_0, Q4_0} {
			for _, tc := range []struct {
				name string
				n    int
				x    func(n int) []float32
			}{
				{"1 block", 32, func(n int) []float32 { return gauss(r, n, 1) }},
				{"3 blocks", 96, func(n int) []float32 { return gauss(r, n, 1) }},
				{"64 blocks", 2048, func(n int) []float32 { return gauss(r, n, 0.3) }},
				{"outliers", 960, func(n int) []float32 { return gaussOutliers(r, n, 1) }},
				{"zero block", 128, func(n int) []float32 { x := gauss(r, n, 1); clear(x[32:64]); return x }},
			} {
				t.Run(fmt.Sprintf("%s/%s", typ, tc.name), func(t *testing.T) {
					for trial := range 20 {
						w := randomRow(r, typ, tc.n)
						x := tc.x(tc.n)
						var q Q80
						if err := q.Quantize(x); err != nil {
							t.Fatal(err)
						}
						if q.Len() != tc.n {
							t.Fatalf("Len = %d, want %d", q.Len(), tc.n)
						}
						var want, mag float64
						for b := 0; b < tc.n; b += QK8_0 {
							var amax float32
							for _, v := range x[b : b+QK8_0] {
								amax = max(amax, float32(math.Abs(float64(v))))
							}
							if d := F16ToF32(F32ToF16(amax / 127)); d != q.d[b/QK8_0] {
								t.Fatalf("block %d scale %g, want %g", b/QK8_0, q.d[b/QK8_0], d)
							}
							for i := b; i < b+QK8_0; i++ {
								var wq int8
								if amax != 0 {
									wq = int8(math.RoundToEven(float64(x[i] * (127 / amax))))
								}
								if q.q[i] != wq {
									t.Fatalf("element %d quantized to %d, want %d", i, q.q[i], wq)
								}
								p := float64(refElem(typ, w, i)) * float64(q.d[b/QK8_0]) * float64(wq)
								want += p
								mag += math.Abs(p)
							}
						}
						got := float64(DotQ80(typ, w, &q))
						if math.Abs(got-want) > 1e-5*(mag+1) {
							t.Fatalf("trial %d: DotQ80 = %g, want %g (Σ|terms| %g)", trial, got, want, mag)
						}
					}
				})
			}
		}
	})
}

func TestQ80Errors(t *testing.T) {
	var q Q80
	if err := q.Quantize(make([]float32, 100)); err == nil {
		t.Fatal("Quantize of 100 values: no error")
	}
	for _, tc := range []struct {
		t    Type
		want bool
	}{{Q8_0, true}, {Q5_0, true}, {Q4_0, true}, {Q4_1, false}, {Q4_K, false}, {F16, false}} {
		if SupportsQ80(tc.t) != tc.want {
			t.Errorf("SupportsQ80(%s) = %v, want %v", tc.t, !tc.want, tc.want)
		}
	}
	if err := q.Quantize(make([]float32, 64)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"type", func() { DotQ80(Q4_K, make([]byte, 144), &q) }},
		{"size", func() { DotQ80(Q8_0, make([]byte, 34), &q) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			tc.f()
		})
	}
}

// BenchmarkDotQ80 is a 2048×2048 matrix-vector product per type, in
// integers against the float kernel on the same row.
func BenchmarkDotQ80(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const k, rows = 2048, 2048
	x := gauss(r, k, 1)
	var q Q80
	if err := q.Quantize(x); err != nil {
		b.Fatal(err)
	}
	for _, typ := range []Type{Q8_0, Q5_0, Q4_0} {
		w := randomRow(r, typ, k*rows)
		rb := len(w) / rows
		for _, kind := range []string{"Q80", "float"} {
			b.Run(typ.String()+"-"+kind, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					for j := range rows {
						if kind == "Q80" {
							DotQ80(typ, w[j*rb:(j+1)*rb], &q)
						} else {
							Dot(typ, w[j*rb:(j+1)*rb], x)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(k*rows), "ns/weight")
			})
		}
	}
}

// TestDotQ80Rows checks DotQ80Rows at every level against DotQ80 row by
// row, for 1 to 4 rows, on lengths with and without a tail of blocks
// after the whole quads.
func TestDotQ80Rows(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	atEachLevel(t, func(t *testing.T) {
		for _, typ := range []Type{Q8_0, Q5_0, Q4_0} {
			for _, n := range []int{32, 96, 128, 960, 2048} {
				for rows := 1; rows <= Q80RowsMax; rows++ {
					t.Run(fmt.Sprintf("%s/n%d/rows%d", typ, n, rows), func(t *testing.T) {
						for trial := range 10 {
							w := randomRow(r, typ, n)
							xs := make([][]float32, rows)
							for i := range xs {
								xs[i] = gaussOutliers(r, n, float64(i+1))
							}
							var batch Q80Rows
							if err := batch.Quantize(xs...); err != nil {
								t.Fatal(err)
							}
							if batch.Rows() != rows {
								t.Fatalf("Rows = %d, want %d", batch.Rows(), rows)
							}
							out := make([]float32, rows)
							DotQ80Rows(typ, w, &batch, out)
							for i, x := range xs {
								var q Q80
								if err := q.Quantize(x); err != nil {
									t.Fatal(err)
								}
								want := DotQ80(typ, w, &q)
								var mag float64 // Σ|terms|: float32 sums are exact to a part in 1e5 of it
								for e := range n {
									mag += math.Abs(float64(refElem(typ, w, e)) * float64(q.d[e/QK8_0]) * float64(q.q[e]))
								}
								if math.Abs(float64(out[i]-want)) > 1e-5*(1+mag) {
									t.Fatalf("trial %d row %d: %g, want %g (Σ|terms| %g)", trial, i, out[i], want, mag)
								}
							}
						}
					})
				}
			}
		}
	})
	var b Q80Rows
	if err := b.Quantize(); err == nil {
		t.Error("Quantize of no rows: no error")
	}
	if err := b.Quantize(make([]float32, 32), make([]float32, 64)); err == nil {
		t.Error("Quantize of rows of two lengths: no error")
	}
}

// BenchmarkDotRowsBatch is a 2048×2048 matrix times four activation rows:
// DotQ80Rows/DotQ8KRows (each weight block unpacked once) against four
// single-row integer dots; ns/weight is per weight and row.
func BenchmarkDotRowsBatch(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const k, rows = 2048, 2048
	xs := make([][]float32, 4)
	for i := range xs {
		xs[i] = gauss(r, k, 1)
	}
	var zr Q80Rows
	var kr Q8KRows
	if err := zr.Quantize(xs...); err != nil {
		b.Fatal(err)
	}
	if err := kr.Quantize(xs...); err != nil {
		b.Fatal(err)
	}
	for _, typ := range []Type{Q8_0, Q5_0, Q4_K, Q6_K} {
		w := randomRow(r, typ, k*rows)
		for _, batched := range []bool{true, false} {
			name := typ.String() + "-single"
			if batched {
				name = typ.String() + "-rows"
			}
			b.Run(name, func(b *testing.B) {
				out := make([]float32, 4)
				b.ReportAllocs()
				for b.Loop() {
					batchDots(typ, w, rows, &zr, &kr, out, batched)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(k*rows*4), "ns/weight")
			})
		}
	}
}

// batchDots is BenchmarkDotRowsBatch's work: every row of w times the
// batch, batched or one activation row at a time.
func batchDots(typ Type, w []byte, rows int, zr *Q80Rows, kr *Q8KRows, out []float32, batched bool) {
	rb := len(w) / rows
	for j := range rows {
		wr := w[j*rb : (j+1)*rb]
		switch {
		case batched && SupportsQ80(typ):
			DotQ80Rows(typ, wr, zr, out)
		case batched:
			DotQ8KRows(typ, wr, kr, out)
		case SupportsQ80(typ):
			for i := range out {
				out[i] = DotQ80(typ, wr, &zr.rows[i])
			}
		default:
			for i := range out {
				out[i] = DotQ8K(typ, wr, &kr.rows[i])
			}
		}
	}
}

// TestRoundMatchesQuantize checks that RoundQ8_0 and RoundQ8K give the
// values Q80.Quantize and Q8K.Quantize hold, as floats, and leave a tail
// shorter than a block alone.
func TestRoundMatchesQuantize(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	x := gaussOutliers(r, 512, 1)
	clear(x[256:288])
	var z Q80
	var k Q8K
	if err := z.Quantize(x); err != nil {
		t.Fatal(err)
	}
	if err := k.Quantize(x); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		round func([]float32)
		want  func(i int) float32
	}{
		{"Q8_0", RoundQ8_0, func(i int) float32 { return z.d[i/QK8_0] * float32(z.q[i]) }},
		{"Q8_K", RoundQ8K, func(i int) float32 { return k.d[i/QK_K] * float32(k.qn[i]) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := append(append([]float32(nil), x...), 0.5)
			tc.round(y)
			for i := range x {
				if y[i] != tc.want(i) {
					t.Fatalf("element %d rounded to %g, want %g", i, y[i], tc.want(i))
				}
			}
			if y[len(x)] != 0.5 {
				t.Fatalf("tail changed to %g", y[len(x)])
			}
		})
	}
}
