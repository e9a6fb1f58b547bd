package simd

import "math"

var negInf = float32(math.Inf(-1))

// genericNR is the pure-Go micro-tile width.
const genericNR = 16

// genericImpl is the pure-Go table: the reference the assembly is tested
// against, and the kernels of CPUs without AVX2.
func genericImpl() *impl {
	im := &impl{level: Generic, nr: genericNR, mrMax: 4, peak: peakGo, peakFLOP: 8 * 2,
		dot: dotGo, dotRows: dotRowsGo, axpyRows: axpyRowsGo, axpy: axpyGo, scale: scaleGo, sumsq: sumsqGo, mulScale: mulScaleGo,
		maxf: maxGo, expSum: expSumGo, swiglu: swigluGo}
	im.kern = make([]kernelFn, im.mrMax+1)
	im.kernU = make([]kernelUFn, im.mrMax+1)
	for mr := 1; mr <= im.mrMax; mr++ {
		im.kern[mr] = func(k int, a, b []float32, ldb int, c []float32, ldc int, acc bool) {
			kernGo(mr, k, a, mr, 1, b, ldb, c, ldc, acc)
		}
		im.kernU[mr] = func(k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
			kernGo(mr, k, a, 1, lda, b, ldb, c, ldc, acc)
		}
	}
	return im
}

// kernGo is the pure-Go micro-kernel: c[mr×16] (+)= a·b in 2×4 register
// tiles, element (i, p) of a at a[p*ps+i*is] (packed: ps = mr, is = 1; in
// place: ps = 1, is = lda).
func kernGo(mr, k int, a []float32, ps, is int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	i := 0
	for ; i+2 <= mr; i += 2 {
		for j := 0; j < genericNR; j += 4 {
			var s00, s01, s02, s03, s10, s11, s12, s13 float32
			for p := range k {
				x0, x1 := a[p*ps+i*is], a[p*ps+(i+1)*is]
				bb := b[p*ldb+j : p*ldb+j+4 : p*ldb+j+4]
				s00 += x0 * bb[0]
				s01 += x0 * bb[1]
				s02 += x0 * bb[2]
				s03 += x0 * bb[3]
				s10 += x1 * bb[0]
				s11 += x1 * bb[1]
				s12 += x1 * bb[2]
				s13 += x1 * bb[3]
			}
			c0 := c[i*ldc+j : i*ldc+j+4 : i*ldc+j+4]
			c1 := c[(i+1)*ldc+j : (i+1)*ldc+j+4 : (i+1)*ldc+j+4]
			if acc {
				s00 += c0[0]
				s01 += c0[1]
				s02 += c0[2]
				s03 += c0[3]
				s10 += c1[0]
				s11 += c1[1]
				s12 += c1[2]
				s13 += c1[3]
			}
			c0[0], c0[1], c0[2], c0[3] = s00, s01, s02, s03
			c1[0], c1[1], c1[2], c1[3] = s10, s11, s12, s13
		}
	}
	for ; i < mr; i++ {
		for j := 0; j < genericNR; j += 4 {
			var s0, s1, s2, s3 float32
			for p := range k {
				x := a[p*ps+i*is]
				bb := b[p*ldb+j : p*ldb+j+4 : p*ldb+j+4]
				s0 += x * bb[0]
				s1 += x * bb[1]
				s2 += x * bb[2]
				s3 += x * bb[3]
			}
			cr := c[i*ldc+j : i*ldc+j+4 : i*ldc+j+4]
			if acc {
				s0 += cr[0]
				s1 += cr[1]
				s2 += cr[2]
				s3 += cr[3]
			}
			cr[0], cr[1], cr[2], cr[3] = s0, s1, s2, s3
		}
	}
}

// peakGo runs eight independent scalar multiply-add chains n times.
func peakGo(n int) {
	var s0, s1, s2, s3, s4, s5, s6, s7 float32
	x, y := float32(0), float32(0)
	for range n {
		s0 += x * y
		s1 += x * y
		s2 += x * y
		s3 += x * y
		s4 += x * y
		s5 += x * y
		s6 += x * y
		s7 += x * y
	}
	sink = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7
}

// sink keeps peakGo's chains from being optimised away.
var sink float32

func dotGo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		aa := a[i : i+4 : i+4]
		bb := b[i : i+4 : i+4]
		s0 += aa[0] * bb[0]
		s1 += aa[1] * bb[1]
		s2 += aa[2] * bb[2]
		s3 += aa[3] * bb[3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func dotRowsGo(dst, q, k []float32, ldk int) {
	for t := range dst {
		dst[t] = dotGo(q, k[t*ldk:t*ldk+len(q)])
	}
}

func axpyRowsGo(out, w, v []float32, ldv int) {
	for t, wt := range w {
		axpyGo(wt, v[t*ldv:t*ldv+len(out)], out)
	}
}

func axpyGo(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

func scaleGo(x []float32, s float32) {
	for i := range x {
		x[i] *= s
	}
}

func sumsqGo(x []float32) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		xx := x[i : i+4 : i+4]
		s0 += xx[0] * xx[0]
		s1 += xx[1] * xx[1]
		s2 += xx[2] * xx[2]
		s3 += xx[3] * xx[3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func mulScaleGo(dst, x, g []float32, s float32) {
	x = x[:len(g)]
	dst = dst[:len(g)]
	for i, gv := range g {
		dst[i] = x[i] * s * gv
	}
}

func maxGo(x []float32) float32 {
	mx := negInf
	for _, v := range x {
		if v > mx {
			mx = v
		}
	}
	return mx
}

// Coefficients of 2^f on [-1/2, 1/2] (Taylor series of e^(f·ln2), relative
// error below 6e-6 over the whole range); the assembly uses the same.
const (
	log2e  = 1.44269504088896341
	exp2c5 = 1.3333558e-3
	exp2c4 = 9.6181291e-3
	exp2c3 = 5.5504109e-2
	exp2c2 = 2.4022651e-1
	exp2c1 = 6.9314718e-1
)

// exp2Go is 2^t for t clamped to [-126, 126]: t = n + f with n the nearest
// integer, 2^f by a degree-5 polynomial, 2^n built in the exponent bits.
func exp2Go(t float32) float32 {
	t = min(max(t, -126), 126)
	n := int32(math.RoundToEven(float64(t)))
	f := t - float32(n)
	p := float32(exp2c5)
	p = p*f + exp2c4
	p = p*f + exp2c3
	p = p*f + exp2c2
	p = p*f + exp2c1
	p = p*f + 1
	return p * math.Float32frombits(uint32(n+127)<<23)
}

func expSumGo(x []float32, k, off float32) float32 {
	var sum float32
	for i, v := range x {
		e := exp2Go(v*k - off)
		x[i] = e
		sum += e
	}
	return sum
}

func swigluGo(dst, g, u []float32) {
	u = u[:len(g)]
	dst = dst[:len(g)]
	for i, gv := range g {
		dst[i] = gv / (1 + exp2Go(-gv*log2e)) * u[i]
	}
}

func rotF32Go(lo, hi, cos, sin []float32) {
	hi = hi[:len(lo)]
	cos = cos[:len(lo)]
	sin = sin[:len(lo)]
	for i, a := range lo {
		b := hi[i]
		c, s := cos[i], sin[i]
		lo[i] = a*c - b*s
		hi[i] = a*s + b*c
	}
}

func rotF64Go(lo, hi []float32, cos, sin []float64) {
	hi = hi[:len(lo)]
	cos = cos[:len(lo)]
	sin = sin[:len(lo)]
	for i := range lo {
		a, b := float64(lo[i]), float64(hi[i])
		c, s := cos[i], sin[i]
		lo[i] = float32(a*c - b*s)
		hi[i] = float32(a*s + b*c)
	}
}
