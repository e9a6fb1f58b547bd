package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func randVec(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 3))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// levels are the assembly levels this machine runs (each is compared with
// the pure-Go reference); the test fails, rather than skips, when the CPU
// has none, since there is then nothing to compare.
func levels(t *testing.T) []Level {
	t.Helper()
	var ls []Level
	for _, l := range []Level{AVX2, AVX512} {
		if Supported(l) {
			ls = append(ls, l)
		}
	}
	return ls
}

// withLevel runs fn with the kernels switched to l.
func withLevel(t testing.TB, l Level, fn func()) {
	t.Helper()
	prev, err := SetLevel(l)
	if err != nil {
		t.Fatalf("SetLevel(%v): %v", l, err)
	}
	defer SetLevel(prev)
	fn()
}

func closeTo(got, want, rel float64) bool {
	return math.Abs(got-want) <= rel*(1+math.Abs(want))
}

func TestLevelsAndEnv(t *testing.T) {
	tests := []struct {
		env  string
		want Level
	}{
		{"off", Generic},
		{"OFF", Generic},
		{"generic", Generic},
		{"", Best()},
		{"auto", Best()},
		{"avx2", min(AVX2, Best())},
		{"avx512", Best()},
	}
	for _, tc := range tests {
		t.Run("env="+tc.env, func(t *testing.T) {
			if got := fromEnv(tc.env); got != tc.want {
				t.Fatalf("fromEnv(%q) = %v, want %v", tc.env, got, tc.want)
			}
		})
	}
	if _, err := SetLevel(Level(99)); err == nil {
		t.Fatal("SetLevel(99) succeeded")
	}
	if !Supported(Generic) || Supported(Level(-1)) {
		t.Fatal("Supported: Generic must be, -1 must not be")
	}
}

func TestVectorKernels(t *testing.T) {
	sizes := []int{0, 1, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257}
	for _, l := range append([]Level{Generic}, levels(t)...) {
		for _, n := range sizes {
			for _, off := range []int{0, 1, 3} {
				t.Run(fmt.Sprintf("%v/n%d/off%d", l, n, off), func(t *testing.T) {
					a := randVec(1, n+off)[off:]
					b := randVec(2, n+off)[off:]
					g := randVec(3, n+off)[off:]
					var dot, ss float64
					mx := math.Inf(-1)
					for i := range n {
						dot += float64(a[i]) * float64(b[i])
						ss += float64(a[i]) * float64(a[i])
						mx = math.Max(mx, float64(a[i]))
					}
					withLevel(t, l, func() {
						if got := Dot(a, b); !closeTo(float64(got), dot, 1e-5) {
							t.Errorf("Dot = %g, want %g", got, dot)
						}
						if got := SumSquares(a); !closeTo(float64(got), ss, 1e-5) {
							t.Errorf("SumSquares = %g, want %g", got, ss)
						}
						if got := Max(a); float64(got) != mx {
							t.Errorf("Max = %g, want %g", got, mx)
						}
						y := append([]float32(nil), b...)
						Axpy(0.5, a, y)
						for i := range n {
							if want := float64(b[i]) + 0.5*float64(a[i]); !closeTo(float64(y[i]), want, 1e-6) {
								t.Fatalf("Axpy[%d] = %g, want %g", i, y[i], want)
							}
						}
						Scale(y, -2)
						for i := range n {
							if want := -2 * (float64(b[i]) + 0.5*float64(a[i])); !closeTo(float64(y[i]), want, 1e-6) {
								t.Fatalf("Scale[%d] = %g, want %g", i, y[i], want)
							}
						}
						dst := make([]float32, n)
						MulScale(dst, a, g, 0.25)
						for i := range n {
							if want := float64(a[i]) * 0.25 * float64(g[i]); !closeTo(float64(dst[i]), want, 1e-6) {
								t.Fatalf("MulScale[%d] = %g, want %g", i, dst[i], want)
							}
						}
						SwiGLU(dst, a, g)
						for i := range n {
							x := float64(a[i])
							if want := x / (1 + math.Exp(-x)) * float64(g[i]); !closeTo(float64(dst[i]), want, 2e-5) {
								t.Fatalf("SwiGLU[%d] = %g, want %g", i, dst[i], want)
							}
						}
						inPlace := append([]float32(nil), a...)
						SwiGLU(inPlace, inPlace, g) // dst = g, as the model's MLP calls it
						for i := range n {
							if math.Float32bits(inPlace[i]) != math.Float32bits(dst[i]) {
								t.Fatalf("SwiGLU in place [%d] = %g, want %g", i, inPlace[i], dst[i])
							}
						}
						e := append([]float32(nil), a...)
						k, offv := float32(0.7*log2e), float32(mx*0.7*log2e)
						sum := ExpSum(e, k, offv)
						var want float64
						for i := range n {
							w := math.Exp(0.7 * (float64(a[i]) - mx))
							want += w
							if !closeTo(float64(e[i]), w, 1e-5) {
								t.Fatalf("ExpSum[%d] = %g, want %g", i, e[i], w)
							}
						}
						if !closeTo(float64(sum), want, 1e-5) {
							t.Errorf("ExpSum sum = %g, want %g", sum, want)
						}
					})
				})
			}
		}
	}
}

func TestExpRange(t *testing.T) {
	for _, l := range append([]Level{Generic}, levels(t)...) {
		t.Run(l.String(), func(t *testing.T) {
			withLevel(t, l, func() {
				var xs []float32
				for x := float32(-87); x <= 87; x += 0.37 {
					xs = append(xs, x)
				}
				e := append([]float32(nil), xs...)
				ExpSum(e, log2e, 0)
				for i, x := range xs {
					want := math.Exp(float64(x))
					if rel := math.Abs(float64(e[i])-want) / want; rel > 1e-5 {
						t.Fatalf("exp(%g) = %g, want %g (rel %g)", x, e[i], want, rel)
					}
				}
				// Saturation: SwiGLU of very negative inputs is ~0, of very
				// positive inputs the identity.
				dst := make([]float32, 2)
				SwiGLU(dst, []float32{-200, 200}, []float32{1, 1})
				if math.Abs(float64(dst[0])) > 1e-30 || dst[1] != 200 {
					t.Fatalf("SwiGLU saturation = %v", dst)
				}
			})
		})
	}
}

// naiveGemm is c = a·b in float64 (b k×n, or n×k when trans).
func naiveGemm(m, n, k int, a []float32, lda int, b []float32, ldb int, trans bool) []float64 {
	c := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				var bv float32
				if trans {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += float64(a[i*lda+p]) * float64(bv)
			}
			c[i*n+j] = s
		}
	}
	return c
}

func TestGemm(t *testing.T) {
	tests := []struct {
		name    string
		m, n, k int
	}{
		{"1x1x1", 1, 1, 1},
		{"k1", 13, 40, 1},
		{"k0", 5, 7, 0},
		{"tile_12x32", 12, 32, 64},
		{"tile_6x16", 6, 16, 9},
		{"odd", 3, 5, 7},
		{"edges", 13, 33, 17},
		{"two_kc_blocks", 25, 70, 300},
		{"mc_edge", 150, 65, 31},
		{"nc_edge", 50, 530, 20},
		{"decode_m1", 1, 640, 128},
		{"decode_m16", 16, 256, 128},
		{"prefill_like", 96, 192, 128},
		{"packed_b_edges", 60, 70, 300},
	}
	for _, l := range append([]Level{Generic}, levels(t)...) {
		for _, tc := range tests {
			for _, trans := range []bool{false, true} {
				for _, padded := range []bool{false, true} {
					name := fmt.Sprintf("%v/%s/trans=%v/strided=%v", l, tc.name, trans, padded)
					t.Run(name, func(t *testing.T) {
						m, n, k := tc.m, tc.n, tc.k
						pad := 0
						if padded {
							pad = 5
						}
						lda, ldc := k+pad, n+pad+2
						ldb := n + pad
						if trans {
							ldb = k + pad
						}
						// Unaligned sub-slices: start one float in.
						a := randVec(1, 1+m*lda)[1:]
						brows := k
						if trans {
							brows = n
						}
						b := randVec(2, 1+brows*ldb+1)[1:]
						c := randVec(3, 1+m*ldc)[1:]
						c0 := append([]float32(nil), c...)
						want := naiveGemm(m, n, k, a, lda, b, ldb, trans)
						check := func(what string, acc bool) {
							t.Helper()
							for i := range m {
								for j := range n {
									w := want[i*n+j]
									if acc {
										w += float64(c0[i*ldc+j])
									}
									if got := float64(c[i*ldc+j]); !closeTo(got, w, 1e-4) {
										t.Fatalf("%s: c[%d,%d] = %g, want %g", what, i, j, got, w)
									}
								}
								for j := n; j < ldc && i*ldc+j < len(c); j++ {
									if c[i*ldc+j] != c0[i*ldc+j] {
										t.Fatalf("%s: wrote padding c[%d,%d]", what, i, j)
									}
								}
							}
						}
						withLevel(t, l, func() {
							Gemm(m, n, k, a, lda, b, ldb, trans, c, ldc, true)
							check("acc", true)
							Gemm(m, n, k, a, lda, b, ldb, trans, c, ldc, false)
							check("set", false)
							pb := PackB(k, n, b, ldb, trans)
							copy(c, c0)
							pb.Gemm(m, a, lda, 0, n, c, ldc, true)
							check("packed acc", true)
							if n > 32 {
								// A column range starting at a panel boundary.
								copy(c, c0)
								pb.Gemm(m, a, lda, 32, n, c[32:], ldc, false)
								for i := range m {
									for j := 32; j < n; j++ {
										if got := float64(c[i*ldc+j]); !closeTo(got, want[i*n+j], 1e-4) {
											t.Fatalf("packed range: c[%d,%d] = %g, want %g", i, j, got, want[i*n+j])
										}
									}
								}
							}
						})
					})
				}
			}
		}
	}
}

func TestPackedGemmRejectsUnalignedRange(t *testing.T) {
	pb := PackB(4, 64, randVec(1, 256), 64, false)
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for j0 = 3")
		}
	}()
	pb.Gemm(1, randVec(2, 4), 4, 3, 10, make([]float32, 10), 10, false)
}

// naiveAttention is the float64 causal attention of one head.
func naiveAttention(nr, hd int, q []float32, kt []float32, ctx int, v []float32, lim []int, scale float64) []float64 {
	out := make([]float64, nr*hd)
	for i := range nr {
		s := make([]float64, lim[i])
		mx := math.Inf(-1)
		for t := range lim[i] {
			var d float64
			for x := range hd {
				d += float64(q[i*hd+x]) * float64(kt[x*ctx+t])
			}
			s[t] = d * scale
			mx = math.Max(mx, s[t])
		}
		var sum float64
		for t := range s {
			s[t] = math.Exp(s[t] - mx)
			sum += s[t]
		}
		for t := range s {
			for x := range hd {
				out[i*hd+x] += s[t] / sum * float64(v[t*hd+x])
			}
		}
	}
	return out
}

func TestAttention(t *testing.T) {
	tests := []struct {
		name         string
		nr, hd, ctx  int
		firstLimit   int // row i attends over [0, firstLimit+i)
		stridedLimit bool
	}{
		{"decode_1row", 1, 32, 300, 300, false},
		{"one_key", 1, 16, 1, 1, false},
		{"prefill_causal", 64, 32, 64, 1, false},
		{"tail_rows", 13, 32, 700, 688, false},
		{"hd16", 20, 16, 150, 131, false},
		{"hd64_long", 12, 64, 1000, 989, false},
		{"sparse_rows", 9, 32, 900, 5, true},
	}
	for _, l := range append([]Level{Generic}, levels(t)...) {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%v/%s", l, tc.name), func(t *testing.T) {
				q := randVec(1, tc.nr*tc.hd)
				kt := randVec(2, tc.hd*tc.ctx)
				v := randVec(3, tc.ctx*tc.hd)
				lim := make([]int, tc.nr)
				for i := range lim {
					lim[i] = tc.firstLimit + i
					if tc.stridedLimit {
						lim[i] = tc.firstLimit + i*(tc.ctx-tc.firstLimit)/tc.nr
					}
				}
				scale := 2 / math.Sqrt(float64(tc.hd))
				want := naiveAttention(tc.nr, tc.hd, q, kt, tc.ctx, v, lim, scale)
				out := randVec(4, tc.nr*tc.hd)
				withLevel(t, l, func() {
					Attention(tc.nr, tc.hd, q, tc.hd, kt, tc.ctx, v, tc.hd, lim, float32(scale), out, tc.hd)
				})
				for i := range out {
					if !closeTo(float64(out[i]), want[i], 1e-4) {
						t.Fatalf("out[%d] = %g, want %g", i, out[i], want[i])
					}
				}
			})
		}
	}
}

func TestPeakLoop(t *testing.T) {
	for _, l := range append([]Level{Generic}, levels(t)...) {
		t.Run(l.String(), func(t *testing.T) {
			withLevel(t, l, func() {
				if f := PeakLoop(10); f <= 0 {
					t.Fatalf("PeakLoop(10) = %g FLOPs", f)
				}
				if f := PeakLoop(0); f != 0 {
					t.Fatalf("PeakLoop(0) = %g FLOPs", f)
				}
			})
		})
	}
}

func TestRowKernels(t *testing.T) {
	tests := []struct {
		name       string
		n, hd, ld  int
		sliceStart int
	}{
		{"empty", 0, 32, 64, 0},
		{"one_row", 1, 32, 32, 0},
		{"block16_hd32", 16, 32, 64, 0},
		{"odd_rows", 17, 32, 96, 1},
		{"hd16", 5, 16, 16, 3},
		{"hd24_tail", 9, 24, 40, 0},
		{"hd7", 4, 7, 7, 2},
		{"hd64", 33, 64, 128, 0},
		{"blocks_strided_unaligned", 50, 32, 72, 1},
		{"hd48_blocks", 32, 48, 48, 2},
	}
	for _, l := range append([]Level{Generic}, levels(t)...) {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%v/%s", l, tc.name), func(t *testing.T) {
				q := randVec(1, tc.hd)
				rows := randVec(2, tc.sliceStart+max(0, (tc.n-1)*tc.ld+tc.hd))[tc.sliceStart:]
				w := randVec(3, tc.n)
				out := randVec(4, tc.hd)
				want := make([]float64, tc.hd)
				for d := range want {
					want[d] = float64(out[d])
				}
				dst := make([]float32, tc.n)
				withLevel(t, l, func() {
					DotRows(dst, q, rows, tc.ld)
					AxpyRows(out, w, rows, tc.ld)
				})
				for r := range tc.n {
					var s float64
					for d := range tc.hd {
						s += float64(q[d]) * float64(rows[r*tc.ld+d])
						want[d] += float64(w[r]) * float64(rows[r*tc.ld+d])
					}
					if !closeTo(float64(dst[r]), s, 1e-5) {
						t.Fatalf("DotRows[%d] = %g, want %g", r, dst[r], s)
					}
				}
				for d := range tc.hd {
					if !closeTo(float64(out[d]), want[d], 1e-5) {
						t.Fatalf("AxpyRows[%d] = %g, want %g", d, out[d], want[d])
					}
				}
			})
		}
	}
}

func TestRotate(t *testing.T) {
	for _, n := range []int{0, 1, 3, 4, 7, 8, 15, 16, 17, 32, 33, 64, 100} {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			lo, hi := randVec(1, n+1)[1:], randVec(2, n)
			cos32, sin32 := make([]float32, n), make([]float32, n)
			cos64, sin64 := make([]float64, n), make([]float64, n)
			for i := range n {
				a := 0.37 * float64(i+1)
				sin64[i], cos64[i] = math.Sincos(a)
				sin32[i], cos32[i] = float32(sin64[i]), float32(cos64[i])
			}
			wantLo32, wantHi32 := append([]float32(nil), lo...), append([]float32(nil), hi...)
			rotF32Go(wantLo32, wantHi32, cos32, sin32)
			wantLo64, wantHi64 := append([]float32(nil), lo...), append([]float32(nil), hi...)
			rotF64Go(wantLo64, wantHi64, cos64, sin64)
			for _, l := range append([]Level{Generic}, levels(t)...) {
				withLevel(t, l, func() {
					l32, h32 := append([]float32(nil), lo...), append([]float32(nil), hi...)
					Rotate(l32, h32, cos32, sin32)
					l64, h64 := append([]float32(nil), lo...), append([]float32(nil), hi...)
					RotateF64(l64, h64, cos64, sin64)
					for i := range n {
						if l32[i] != wantLo32[i] || h32[i] != wantHi32[i] {
							t.Fatalf("%v: Rotate[%d] = (%g, %g), want (%g, %g) bit for bit", l, i, l32[i], h32[i], wantLo32[i], wantHi32[i])
						}
						if l64[i] != wantLo64[i] || h64[i] != wantHi64[i] {
							t.Fatalf("%v: RotateF64[%d] = (%g, %g), want (%g, %g) bit for bit", l, i, l64[i], h64[i], wantLo64[i], wantHi64[i])
						}
					}
				})
			}
			// The rotation itself is right (float64 reference).
			for i := range n {
				a, b := float64(lo[i]), float64(hi[i])
				if !closeTo(float64(wantLo64[i]), a*cos64[i]-b*sin64[i], 1e-6) {
					t.Fatalf("rotation %d wrong", i)
				}
			}
		})
	}
}

// TestDotTile checks DotTile at every level, on shapes with and without
// whole 4×4 tiles and 16-element chunks, against float64 dots.
func TestDotTile(t *testing.T) {
	cases := []struct {
		name     string
		m, n, k  int
		lda, ldb int
	}{
		{"4x4 k16", 4, 4, 16, 16, 16},
		{"8x64 k512 padded rows", 8, 64, 512, 512, 528},
		{"5x7 k100 edges", 5, 7, 100, 101, 103},
		{"3x2 below a tile", 3, 2, 64, 64, 64},
		{"12x20 k2048", 12, 20, 2048, 2048, 2064},
		{"k8 no chunk", 6, 6, 8, 8, 8},
	}
	for _, l := range append([]Level{Generic}, levels(t)...) {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%v/%s", l, tc.name), func(t *testing.T) {
				a := randVec(uint64(tc.m*tc.k+1), (tc.m-1)*tc.lda+tc.k)
				b := randVec(uint64(tc.n*tc.k+2), (tc.n-1)*tc.ldb+tc.k)
				ldd := tc.n + 3
				dst := make([]float32, (tc.m-1)*ldd+tc.n)
				withLevel(t, l, func() { DotTile(dst, ldd, a, tc.lda, tc.m, b, tc.ldb, tc.n, tc.k) })
				for i := range tc.m {
					for j := range tc.n {
						var want float64
						for p := range tc.k {
							want += float64(a[i*tc.lda+p]) * float64(b[j*tc.ldb+p])
						}
						if !closeTo(float64(dst[i*ldd+j]), want, 1e-4) {
							t.Fatalf("dst[%d][%d] = %g, want %g", i, j, dst[i*ldd+j], want)
						}
					}
				}
			})
		}
	}
}
