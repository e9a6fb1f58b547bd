package quant

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cacheblend/cacheblend/simd"
)

// manyRows returns count rows of n elements of t cut from a matrix of
// 2·count rows in a shuffled order, every other one a column slice of a
// wider row (as a stacked, permuted or tensor-parallel weight's rows lie).
func manyRows(r *rand.Rand, t Type, n, count int) [][]byte {
	rb, _ := t.RowBytes(n)
	wide := make([]byte, 0, 2*count*2*rb)
	for range 2 * count {
		wide = append(wide, randomRow(r, t, 2*n)...)
	}
	ws := make([][]byte, count)
	for i, j := range r.Perm(2 * count)[:count] {
		off := j * 2 * rb
		if i%2 == 1 {
			off += rb // the second half of the wide row
		}
		ws[i] = wide[off : off+rb : off+rb]
	}
	return ws
}

// TestDotMany checks DotMany, DotQ80Many and DotQ8KMany against their
// one-row functions: the same kernels, so the same bits, at every level,
// for every row count (the kernels loop over rows) and lengths whose
// block counts are odd (the Q8_0 formats' Go path).
func TestDotMany(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	atEachLevel(t, func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			types []Type
			ns    []int
			dot   func(t Type, ws [][]byte, x []float32, out []float32)
			one   func(t Type, w []byte, x []float32) float32
		}{
			{"DotMany", []Type{F32, F16, BF16, Q8_0, Q4_K, Q6_K}, []int{256, 512, 2048},
				DotMany, Dot},
			{"DotQ80Many", []Type{Q8_0, Q5_0, Q4_0}, []int{32, 96, 576, 960},
				func(t Type, ws [][]byte, x []float32, out []float32) {
					var q Q80
					if err := q.Quantize(x); err != nil {
						panic(err)
					}
					DotQ80Many(t, ws, &q, out)
				},
				func(t Type, w []byte, x []float32) float32 {
					var q Q80
					if err := q.Quantize(x); err != nil {
						panic(err)
					}
					return DotQ80(t, w, &q)
				}},
			{"DotQ8KMany", []Type{Q4_K, Q6_K}, []int{256, 768, 2048},
				func(t Type, ws [][]byte, x []float32, out []float32) {
					var q Q8K
					if err := q.Quantize(x); err != nil {
						panic(err)
					}
					DotQ8KMany(t, ws, &q, out)
				},
				func(t Type, w []byte, x []float32) float32 {
					var q Q8K
					if err := q.Quantize(x); err != nil {
						panic(err)
					}
					return DotQ8K(t, w, &q)
				}},
		} {
			for _, typ := range tc.types {
				for _, n := range tc.ns {
					for _, count := range []int{1, 2, 7, 64} {
						t.Run(fmt.Sprintf("%s/%s/n%d/rows%d", tc.name, typ, n, count), func(t *testing.T) {
							ws := manyRows(r, typ, n, count)
							x := gaussOutliers(r, n, 1)
							out := make([]float32, count+1)
							out[count] = 42 // past the rows: untouched
							tc.dot(typ, ws, x, out)
							for i, w := range ws {
								if want := tc.one(typ, w, x); math.Float32bits(out[i]) != math.Float32bits(want) {
									t.Fatalf("row %d: %g, want %g", i, out[i], want)
								}
							}
							if out[count] != 42 {
								t.Fatalf("out[%d] written: %g", count, out[count])
							}
						})
					}
				}
			}
		}
	})
}

// TestDotManyErrors: a row of the wrong length, a short out, an
// unsupported type panic; no rows is no work.
func TestDotManyErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	x := gauss(r, 256, 1)
	var q80 Q80
	var q8k Q8K
	if err := q80.Quantize(x); err != nil {
		t.Fatal(err)
	}
	if err := q8k.Quantize(x); err != nil {
		t.Fatal(err)
	}
	good := manyRows(r, Q8_0, 256, 3)
	bad := append(manyRows(r, Q8_0, 256, 2), make([]byte, 10))
	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"DotMany/short row", func() { DotMany(Q8_0, bad, x, make([]float32, 3)) }},
		{"DotMany/short out", func() { DotMany(Q8_0, good, x, make([]float32, 2)) }},
		{"DotMany/unsupported", func() { DotMany(Type(99), good, x, make([]float32, 3)) }},
		{"DotQ80Many/short row", func() { DotQ80Many(Q8_0, bad, &q80, make([]float32, 3)) }},
		{"DotQ80Many/short out", func() { DotQ80Many(Q8_0, good, &q80, make([]float32, 2)) }},
		{"DotQ80Many/K-quant", func() { DotQ80Many(Q4_K, manyRows(r, Q4_K, 256, 1), &q80, make([]float32, 1)) }},
		{"DotQ8KMany/short row", func() { DotQ8KMany(Q4_K, [][]byte{make([]byte, 10)}, &q8k, make([]float32, 1)) }},
		{"DotQ8KMany/Q8_0", func() { DotQ8KMany(Q8_0, good, &q8k, make([]float32, 3)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			tc.fn()
		})
	}
	// No rows: nothing to do, whatever out is.
	DotMany(Q8_0, nil, x, nil)
	DotQ80Many(Q8_0, nil, &q80, nil)
	DotQ8KMany(Q4_K, nil, &q8k, nil)
}

// BenchmarkDotMany is one activation row against 1,024 weight rows of
// k = 576 (SmolLM2-135M's width) and 2,048: the Many kernels against a
// loop of one-row calls; ns/weight is per weight.
func BenchmarkDotMany(b *testing.B) {
	r := rand.New(rand.NewPCG(25, 26))
	const rows = 1024
	for _, typ := range []Type{F16, Q8_0, Q5_0, Q4_K, Q6_K} {
		for _, k := range []int{576, 2048} {
			if typ.BlockSize() == QK_K && k%QK_K != 0 {
				continue
			}
			ws := manyRows(r, typ, k, rows)
			x := gauss(r, k, 1)
			var q80 Q80
			var q8k Q8K
			if err := q80.Quantize(x); err != nil {
				b.Fatal(err)
			}
			if k%QK_K == 0 {
				if err := q8k.Quantize(x); err != nil {
					b.Fatal(err)
				}
			}
			out := make([]float32, rows)
			one, many := func() {
				for i, w := range ws {
					out[i] = Dot(typ, w, x)
				}
			}, func() { DotMany(typ, ws, x, out) }
			switch {
			case SupportsQ80(typ):
				one = func() {
					for i, w := range ws {
						out[i] = DotQ80(typ, w, &q80)
					}
				}
				many = func() { DotQ80Many(typ, ws, &q80, out) }
			case SupportsQ8K(typ):
				one = func() {
					for i, w := range ws {
						out[i] = DotQ8K(typ, w, &q8k)
					}
				}
				many = func() { DotQ8KMany(typ, ws, &q8k, out) }
			}
			for _, c := range []struct {
				name string
				fn   func()
			}{{"one", one}, {"many", many}} {
				b.Run(fmt.Sprintf("%s/k%d/%s", typ, k, c.name), func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						c.fn()
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(rows*k), "ns/weight")
				})
			}
		}
	}
}

// TestDotTile checks DotTile against float64 dots of the dequantized rows
// for every count of activation rows the kernels take (one to four, one
// to eight in the two-row tiles of short rows) and more (several groups),
// and of weight rows (a partial last tile), with and without
// accumulation, and that nothing between the rows or past them is
// written. F16 and BF16 run the tile kernels at the AVX-512 level (k = 40
// does not: Dot per pair), rows of 32 and 896 columns the prefetching
// ones, 1,024 the others; Q8_0 is always Dot per pair.
func TestDotTile(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	atEachLevel(t, func(t *testing.T) {
		for _, typ := range []Type{F16, BF16, Q8_0} {
			for _, k := range []int{32, 40, 896, 1024} {
				if k%typ.BlockSize() != 0 {
					continue
				}
				for _, m := range []int{1, 2, 3, 4, 5, 6, 7, 8, 11, 17} {
					for _, n := range []int{1, 2, 3, 4, 9} {
						for _, acc := range []bool{false, true} {
							t.Run(fmt.Sprintf("%s/k%d/m%d/n%d/acc%v", typ, k, m, n, acc), func(t *testing.T) {
								ws := manyRows(r, typ, k, n)
								lda, ldd := k+5, n+3
								a := gaussOutliers(r, (m-1)*lda+k, 1)
								dst := make([]float32, m*ldd)
								for i := range dst {
									dst[i] = 42
								}
								DotTile(typ, ws, a, lda, m, k, dst, ldd, acc)
								deq := make([]float32, k)
								for j, w := range ws {
									if err := DequantizeRow(typ, w, deq); err != nil {
										t.Fatal(err)
									}
									for i := range m {
										var want, mag float64
										for c, v := range deq {
											want += float64(v) * float64(a[i*lda+c])
											mag += math.Abs(float64(v) * float64(a[i*lda+c]))
										}
										if acc {
											want += 42
										}
										if got := float64(dst[i*ldd+j]); math.Abs(got-want) > 1e-5*(mag+42) {
											t.Fatalf("[%d][%d] = %g, want %g", i, j, got, want)
										}
									}
								}
								for i := range m {
									for j := n; j < ldd; j++ {
										if dst[i*ldd+j] != 42 {
											t.Fatalf("[%d][%d] written past the rows: %g", i, j, dst[i*ldd+j])
										}
									}
								}
							})
						}
					}
				}
			}
		}
	})
}

// BenchmarkDotTile: a decode batch's product on one core, 1,024 F16 or
// BF16 weight rows against m activation rows: DotTile's tiles against
// the path they replaced in package model (each panel of 64 rows
// dequantized to float32, then simd.DotTile). GFLOP/s counts 2·m·k per
// weight row.
func BenchmarkDotTile(b *testing.B) {
	r := rand.New(rand.NewPCG(27, 28))
	const rows = 1024
	for _, typ := range []Type{F16, BF16} {
		for _, k := range []int{896, 2048} {
			ws := manyRows(r, typ, k, rows)
			for _, m := range []int{4, 8} {
				a := gauss(r, m*k, 1)
				dst := make([]float32, m*rows)
				panel := make([]float32, 64*k)
				for _, tc := range []struct {
					name string
					fn   func()
				}{
					{"tile", func() { DotTile(typ, ws, a, k, m, k, dst, rows, false) }},
					{"dequant", func() {
						for j0 := 0; j0 < rows; j0 += 64 {
							for j := range 64 {
								if err := DequantizeRow(typ, ws[j0+j], panel[j*k:(j+1)*k]); err != nil {
									b.Fatal(err)
								}
							}
							simd.DotTile(dst[j0:], rows, a, k, m, panel, k, 64, k)
						}
					}},
				} {
					b.Run(fmt.Sprintf("%s/k%d/m%d/%s", typ, k, m, tc.name), func(b *testing.B) {
						b.ReportAllocs()
						for b.Loop() {
							tc.fn()
						}
						b.ReportMetric(float64(b.N)*2*float64(m*k*rows)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
					})
				}
			}
		}
	}
}

// TestDotRowsMany checks DotQ80RowsMany and DotQ8KRowsMany against
// DotQ80Rows and DotQ8KRows row by row: the same kernels, so the same
// bits, at every level, for one to four activation rows, several weight
// row counts (300: more than one run of the AVX2 forms), and block
// counts the kernels do not take whole (1 and 3 blocks of 32: Go per
// row).
func TestDotRowsMany(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	atEachLevel(t, func(t *testing.T) {
		for _, tc := range []struct {
			types []Type
			ns    []int
		}{
			{[]Type{Q8_0, Q5_0, Q4_0}, []int{32, 96, 576, 960}},
			{[]Type{Q4_K, Q6_K}, []int{256, 768, 2048}},
		} {
			for _, typ := range tc.types {
				for _, n := range tc.ns {
					for _, R := range []int{1, 2, 3, 4} {
						for _, count := range []int{1, 2, 7, 64, 300} {
							t.Run(fmt.Sprintf("%s/n%d/x%d/rows%d", typ, n, R, count), func(t *testing.T) {
								ws := manyRows(r, typ, n, count)
								xs := make([][]float32, R)
								for i := range xs {
									xs[i] = gaussOutliers(r, n, 1)
								}
								out := make([]float32, count*R+1)
								out[count*R] = 42 // past the rows: untouched
								one := make([]float32, R)
								check := func(row func(w []byte, out []float32)) {
									for i, w := range ws {
										row(w, one)
										for k := range R {
											if got := out[i*R+k]; math.Float32bits(got) != math.Float32bits(one[k]) {
												t.Fatalf("weight row %d, activation row %d: %g, want %g", i, k, got, one[k])
											}
										}
									}
								}
								if SupportsQ80(typ) {
									var x Q80Rows
									if err := x.Quantize(xs...); err != nil {
										t.Fatal(err)
									}
									DotQ80RowsMany(typ, ws, &x, out)
									check(func(w []byte, o []float32) { DotQ80Rows(typ, w, &x, o) })
								} else {
									var x Q8KRows
									if err := x.Quantize(xs...); err != nil {
										t.Fatal(err)
									}
									DotQ8KRowsMany(typ, ws, &x, out)
									check(func(w []byte, o []float32) { DotQ8KRows(typ, w, &x, o) })
								}
								if out[count*R] != 42 {
									t.Fatalf("out[%d] written: %g", count*R, out[count*R])
								}
							})
						}
					}
				}
			}
		}
	})
}

// BenchmarkDotManyStream: DotQ80Many (Q8_0, Q5_0, Q4_0), DotQ8KMany (Q4_K,
// Q6_K) and DotMany (F16, BF16) over 512 MiB of contiguous weight rows of
// 576 columns (SmolLM2's width; for the K-quants 2,048, Llama-3.2-1B's, as
// 576 is not a whole number of their blocks) in huge pages, streamed from
// memory as a decode step streams a resident model's weights, on one core,
// with the VBMI kernels where the CPU has them and with the VNNI ones; the
// "cache" runs take the first 384 rows alone, which stay in L2. The rows
// are 1,024 random ones repeated: with 65,536 rows (24–110 MB) part of
// them stayed in this host's last-level cache from pass to pass (Q8_0 at
// 1,792 columns: 36–38 GB/s over 64 MiB, 23–26 over 512). The
// "ahead=0" runs ask for the lines they read (streamAhead 0: the
// requests' instructions without their prefetch).
func BenchmarkDotManyStream(b *testing.B) {
	r := rand.New(rand.NewPCG(31, 32))
	const distinct, inCache = 1024, 384
	for _, typ := range []Type{Q8_0, Q5_0, Q4_0, F16, BF16, Q4_K, Q6_K} {
		k := 576
		if typ.BlockSize() == QK_K {
			k = 2048 // Llama-3.2-1B's width: 576 is not a whole number of K-quant blocks
		}
		rb, _ := typ.RowBytes(k)
		rows := (512 << 20) / rb
		all := weightMemory(b, rows*rb)
		for i := range distinct {
			copy(all[i*rb:(i+1)*rb], randomRow(r, typ, k))
		}
		for o := distinct * rb; o < len(all); o += copy(all[o:], all[:distinct*rb]) {
		}
		ws := make([][]byte, rows)
		for i := range ws {
			ws[i] = all[i*rb : (i+1)*rb]
		}
		out := make([]float32, rows)
		report := func(b *testing.B, n int) {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n*k), "ns/weight")
			b.ReportMetric(float64(b.N)*float64(n*rb)/b.Elapsed().Seconds()/1e9, "GB/s")
		}
		// run runs dot over the stream and over the rows that stay in cache,
		// with the VBMI kernels chosen by vbmi (where the CPU has them).
		run := func(name string, vbmi bool, dot func(ws [][]byte)) {
			for _, place := range []struct {
				name  string
				ws    [][]byte
				ahead int64
			}{{"", ws, streamAhead}, {"/ahead=0", ws, 0}, {"/cache", ws[:inCache], streamAhead}} {
				b.Run(name+place.name, func(b *testing.B) {
					defer func(prev bool, ahead int64) { hasVBMI, streamAhead = prev, ahead }(hasVBMI, streamAhead)
					hasVBMI, streamAhead = vbmi, place.ahead
					b.ReportAllocs()
					for b.Loop() {
						dot(place.ws)
					}
					report(b, len(place.ws))
				})
			}
		}
		if SupportsQ8K(typ) {
			var x Q8K
			if err := x.Quantize(gauss(r, k, 1)); err != nil {
				b.Fatal(err)
			}
			run(typ.String(), hasVBMI, func(ws [][]byte) { DotQ8KMany(typ, ws, &x, out) })
			continue
		}
		if !SupportsQ80(typ) {
			xf := gauss(r, k, 1)
			run(typ.String(), hasVBMI, func(ws [][]byte) { DotMany(typ, ws, xf, out) })
			continue
		}
		var x Q80
		if err := x.Quantize(gauss(r, k, 1)); err != nil {
			b.Fatal(err)
		}
		for _, vb := range []bool{true, false} {
			if vb && !hasVBMI {
				continue
			}
			run(fmt.Sprintf("%s/vbmi=%v", typ, vb), vb, func(ws [][]byte) { DotQ80Many(typ, ws, &x, out) })
		}
	}
}

// BenchmarkDotTileStream: DotTile's decode-batch product on one core with
// its weight rows streaming from memory (256 MiB of F16 or BF16 rows in
// huge pages, as a resident model's) against m activation rows, in runs of
// 64 rows as package model hands them over, with the prefetching kernels
// (prefetch=true) and without: the measurement behind tilePrefetchBytes.
func BenchmarkDotTileStream(b *testing.B) {
	r := rand.New(rand.NewPCG(33, 34))
	defer func(prev int) { tilePrefetchBytes = prev }(tilePrefetchBytes)
	for _, typ := range []Type{F16, BF16} {
		for _, k := range []int{576, 896, 2048} {
			rb, _ := typ.RowBytes(k)
			rows := (256 << 20) / rb / 64 * 64
			all := weightMemory(b, rows*rb)
			ws := make([][]byte, rows)
			for i := range ws {
				ws[i] = all[i*rb : (i+1)*rb]
				if i < 64 {
					copy(ws[i], randomRow(r, typ, k))
				} else {
					copy(ws[i], ws[i%64])
				}
			}
			for _, m := range []int{4, 8} {
				a := gauss(r, m*k, 1)
				dst := make([]float32, m*rows)
				for _, pf := range []bool{false, true} {
					b.Run(fmt.Sprintf("%s/k%d/m%d/prefetch=%v", typ, k, m, pf), func(b *testing.B) {
						tilePrefetchBytes = 0
						if pf {
							tilePrefetchBytes = 1 << 30
						}
						b.ReportAllocs()
						for b.Loop() {
							for j := 0; j < rows; j += 64 {
								DotTile(typ, ws[j:j+64], a, k, m, k, dst[j:], rows, false)
							}
						}
						b.ReportMetric(float64(b.N)*float64(rows*rb)/b.Elapsed().Seconds()/1e9, "GB/s")
						b.ReportMetric(float64(b.N)*2*float64(m*k*rows)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
					})
				}
			}
		}
	}
}

// TestDotEmptyRows: rows of no elements against activations of none dot
// to 0 at every level, in every one-row, Many and Rows form (a zero-width
// row must not make a kernel index the empty activations).
func TestDotEmptyRows(t *testing.T) {
	atEachLevel(t, func(t *testing.T) {
		for _, typ := range []Type{Q8_0, Q5_0, Q4_0, Q4_K, Q6_K} {
			for _, R := range []int{1, 2, 4} {
				xs := make([][]float32, R)
				for i := range xs {
					xs[i] = []float32{}
				}
				out := []float32{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}
				ws := [][]byte{{}, {}}
				if SupportsQ80(typ) {
					var x Q80Rows
					if err := x.Quantize(xs...); err != nil {
						t.Fatal(err)
					}
					DotQ80RowsMany(typ, ws, &x, out)
					var q Q80
					if err := q.Quantize(nil); err != nil {
						t.Fatal(err)
					}
					DotQ80Many(typ, ws, &q, out[2*R:])
				} else {
					var x Q8KRows
					if err := x.Quantize(xs...); err != nil {
						t.Fatal(err)
					}
					DotQ8KRowsMany(typ, ws, &x, out)
					var q Q8K
					if err := q.Quantize(nil); err != nil {
						t.Fatal(err)
					}
					DotQ8KMany(typ, ws, &q, out[2*R:])
				}
				for i, v := range out[:2*R+2] {
					if v != 0 {
						t.Fatalf("%s, %d rows: out[%d] = %g, want 0", typ, R, i, v)
					}
				}
			}
		}
	})
}
