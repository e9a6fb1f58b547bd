package simd

import "math"

// Dot is Σ a[i]·b[i] over len(a) (b at least as long).
func Dot(a, b []float32) float32 { return cur.Load().dot(a, b[:len(a)]) }

// DotRows writes q·k[t*ldk:][:len(q)] into dst[t] for every t < len(dst):
// the scores of one query against keys stored as rows at stride ldk (a
// run of cache slots).
func DotRows(dst, q, k []float32, ldk int) { cur.Load().dotRows(dst, q, k, ldk) }

// DotRowsF16 is DotRows over rows of IEEE binary16 values (k holds their
// bit patterns; ldk counts them): dst[t] = q·k[t*ldk:][:len(q)] for t <
// len(dst), each half converted to float32 inside the kernel. When it
// reports true the results are bit for bit those of converting the rows
// to float32 and calling DotRows on them. It reports false and writes
// nothing where the level in use has no kernel for the shape (below
// AVX-512, or len(dst) or len(q) not a whole number of 16), and the
// caller converts the rows itself. It panics when k is too short.
func DotRowsF16(dst, q []float32, k []uint16, ldk int) bool {
	im := cur.Load()
	if im.dotRowsH == nil || len(dst) == 0 || len(dst)%16 != 0 || len(q) == 0 || len(q)%16 != 0 {
		return false
	}
	if len(k) < (len(dst)-1)*ldk+len(q) || ldk < len(q) {
		panic("simd: DotRowsF16 operand too short")
	}
	im.dotRowsH(dst, q, k, ldk)
	return true
}

// AxpyRowsF16 is AxpyRows over rows of IEEE binary16 values (v holds their
// bit patterns; ldv counts them): out += Σ_t w[t]·v[t*ldv:][:len(out)],
// each half converted to float32 inside the kernel. When it reports true
// the result is bit for bit that of converting the rows to float32 and
// calling AxpyRows on them. It reports false and changes nothing where the
// level in use has no kernel for the shape (below AVX-512, or len(out) not
// 16, 32, 48 or 64), and the caller converts the rows itself. It panics
// when v is too short.
func AxpyRowsF16(out, w []float32, v []uint16, ldv int) bool {
	im := cur.Load()
	if im.axpyRowsH == nil || len(out)%16 != 0 || len(out) == 0 || len(out) > 64 {
		return false
	}
	if len(w) == 0 {
		return true
	}
	if len(v) < (len(w)-1)*ldv+len(out) || ldv < len(out) {
		panic("simd: AxpyRowsF16 operand too short")
	}
	im.axpyRowsH(out, w, v, ldv)
	return true
}

// DotTile writes a[i*lda:][:k]·b[j*ldb:][:k] into dst[i*ldd+j] for every
// i < m and j < n: the product a·bᵀ of m rows and n rows that both run
// along k, as a GEMV of a few activation rows against weight rows needs it
// (no packing or transposition). At the AVX-512 level it runs 4×4 tiles
// that reuse every vector load for four FMAs, taking the rows of b four at
// a time as the outer loop (so they stay in L1 while the rows of a pass);
// elsewhere, and for the edges, DotRows per row of a. It panics when a
// slice is too short.
func DotTile(dst []float32, ldd int, a []float32, lda, m int, b []float32, ldb, n, k int) {
	if m <= 0 || n <= 0 {
		return
	}
	if len(a) < (m-1)*lda+k || len(b) < (n-1)*ldb+k || len(dst) < (m-1)*ldd+n || k < 0 {
		panic("simd: DotTile operand too short")
	}
	im := cur.Load()
	m4, n4, k16 := 0, 0, k&^15
	if im.dotTile4 != nil && k16 > 0 {
		m4, n4 = m&^3, n&^3
		for j := 0; j < n4; j += 4 {
			for i := 0; i < m4; i += 4 {
				im.dotTile4(&dst[i*ldd+j], ldd, &a[i*lda], lda, &b[j*ldb], ldb, k16)
				if k16 < k {
					for ii := i; ii < i+4; ii++ {
						for jj := j; jj < j+4; jj++ {
							dst[ii*ldd+jj] += im.dot(a[ii*lda+k16:ii*lda+k], b[jj*ldb+k16:jj*ldb+k])
						}
					}
				}
			}
		}
	}
	for i := range m {
		j0 := n4
		if i >= m4 {
			j0 = 0
		}
		if j0 < n {
			im.dotRows(dst[i*ldd+j0:i*ldd+n], a[i*lda:i*lda+k], b[j0*ldb:], ldb)
		}
	}
}

// AxpyRows adds Σ_t w[t]·v[t*ldv:][:len(out)] to out over t < len(w): the
// weighted sum of values stored as rows at stride ldv.
func AxpyRows(out, w, v []float32, ldv int) { cur.Load().axpyRows(out, w, v, ldv) }

// Axpy adds alpha·x to y element-wise (y at least as long as x).
func Axpy(alpha float32, x, y []float32) { cur.Load().axpy(alpha, x, y[:len(x)]) }

// Scale multiplies every element of x by s.
func Scale(x []float32, s float32) { cur.Load().scale(x, s) }

// SumSquares is Σ x[i]².
func SumSquares(x []float32) float32 { return cur.Load().sumsq(x) }

// MulScale writes x[i]·s·g[i] into dst[i] for i < len(g) (dst and x at
// least as long as g).
func MulScale(dst, x, g []float32, s float32) {
	cur.Load().mulScale(dst[:len(g)], x[:len(g)], g, s)
}

// RMSNorm writes x/rms(x)·gain into dst (x and dst at least len(gain)):
// rms(x) = √(Σx²/n + eps).
func RMSNorm(dst, x, gain []float32, eps float64) {
	im := cur.Load()
	x = x[:len(gain)]
	if len(x) == 0 {
		return
	}
	ss := im.sumsq(x)
	inv := float32(1 / math.Sqrt(float64(ss)/float64(len(x))+eps))
	im.mulScale(dst[:len(gain)], x, gain, inv)
}

// Max is the largest element of x (-Inf when x is empty).
func Max(x []float32) float32 { return cur.Load().maxf(x) }

// ExpSum replaces every x[i] by 2^(x[i]·k − off) and returns their sum:
// with k = scale·log2(e) and off = max·k it is the numerator of a softmax.
// The exponent is clamped to [-126, 126] (relative error below 6e-6).
func ExpSum(x []float32, k, off float32) float32 { return cur.Load().expSum(x, k, off) }

// SwiGLU writes silu(g[i])·u[i] = g[i]/(1+e^−g[i])·u[i] into dst[i] for
// i < len(g). dst may be g (each element is read before it is written).
func SwiGLU(dst, g, u []float32) { cur.Load().swiglu(dst[:len(g)], g, u[:len(g)]) }

// PeakLoop runs n iterations of the current level's peak loop (independent
// FMA chains at its widest vector width) and returns the FLOPs it did.
func PeakLoop(n int) float64 {
	im := cur.Load()
	im.peak(n)
	return float64(n) * im.peakFLOP
}

// Rotate and RotateF64 call the assembly directly (not through the
// dispatch table) so that callers' stack arrays of angles do not escape.

// Rotate rotates the pairs (lo[i], hi[i]) by the angles whose cosines and
// sines are cos[i] and sin[i] (RoPE's "rotate half": lo is the first half
// of a head, hi the second): lo' = lo·c − hi·s, hi' = lo·s + hi·c, in
// float32 with every product rounded (no fused multiply-add), so every
// level gives the same bits.
func Rotate(lo, hi, cos, sin []float32) {
	hi, cos, sin = hi[:len(lo)], cos[:len(lo)], sin[:len(lo)]
	if len(lo) == 0 || rotF32Asm(cur.Load().level, lo, hi, cos, sin) {
		return
	}
	rotF32Go(lo, hi, cos, sin)
}

// RotateF64 is Rotate with float64 angles and arithmetic, rounded to
// float32 once per result (bit for bit the same on every level).
func RotateF64(lo, hi []float32, cos, sin []float64) {
	hi, cos, sin = hi[:len(lo)], cos[:len(lo)], sin[:len(lo)]
	if len(lo) == 0 || rotF64Asm(cur.Load().level, lo, hi, cos, sin) {
		return
	}
	rotF64Go(lo, hi, cos, sin)
}
