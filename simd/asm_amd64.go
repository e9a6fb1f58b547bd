//go:build amd64 && !noasm

package simd

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func peakFMA512(n int)

//go:noescape
func peakFMA256(n int)

//go:noescape
func dot512(a, b *float32, n int) float32

//go:noescape
func dot256(a, b *float32, n int) float32

//go:noescape
func dotRows512(dst, q, k *float32, ldk, n, hd int)

//go:noescape
func dotRows16_512(dst, q, k *float32, ldk, blocks, hd int)

//go:noescape
func dotRows16h_512(dst, q *float32, k *uint16, ldk, blocks, hd int)

//go:noescape
func axpyRows1h_512(out, w *float32, v *uint16, ldv, n int)

//go:noescape
func axpyRows2h_512(out, w *float32, v *uint16, ldv, n int)

//go:noescape
func axpyRows3h_512(out, w *float32, v *uint16, ldv, n int)

//go:noescape
func axpyRows4h_512(out, w *float32, v *uint16, ldv, n int)

//go:noescape
func dotTile4x4_512(dst *float32, ldd int, a *float32, lda int, b *float32, ldb int, k int)

//go:noescape
func axpyRows1_512(out, w, v *float32, ldv, n int)

//go:noescape
func axpyRows2_512(out, w, v *float32, ldv, n int)

//go:noescape
func axpyRows3_512(out, w, v *float32, ldv, n int)

//go:noescape
func axpyRows4_512(out, w, v *float32, ldv, n int)

//go:noescape
func dotRows256(dst, q, k *float32, ldk, n, hd int)

//go:noescape
func axpyRows512(out, w, v *float32, ldv, n, hd int)

//go:noescape
func axpyRows256(out, w, v *float32, ldv, n, hd int)

//go:noescape
func rotF32512(lo, hi *float32, cos, sin *float32, n int)

//go:noescape
func rotF32256(lo, hi *float32, cos, sin *float32, n int)

//go:noescape
func rotF64512(lo, hi *float32, cos, sin *float64, n int)

//go:noescape
func rotF64256(lo, hi *float32, cos, sin *float64, n int)

//go:noescape
func axpy512(alpha float32, x, y *float32, n int)

//go:noescape
func axpy256(alpha float32, x, y *float32, n int)

//go:noescape
func scale512(x *float32, n int, s float32)

//go:noescape
func scale256(x *float32, n int, s float32)

//go:noescape
func sumsq512(x *float32, n int) float32

//go:noescape
func sumsq256(x *float32, n int) float32

//go:noescape
func mulScale512(dst, x, gain *float32, n int, s float32)

//go:noescape
func mulScale256(dst, x, gain *float32, n int, s float32)

//go:noescape
func maxf512(x *float32, n int) float32

//go:noescape
func maxf256(x *float32, n int) float32

//go:noescape
func expSum512(x *float32, n int, k, off float32) float32

//go:noescape
func expSum256(x *float32, n int, k, off float32) float32

//go:noescape
func swiglu512(dst, gate, up *float32, n int)

//go:noescape
func swiglu256(dst, gate, up *float32, n int)

// asmKernel is the signature of the generated micro-kernels.
type asmKernel func(k int, a, b *float32, ldb int, c *float32, ldc int, acc int)

var (
	kerns512 = []asmKernel{nil, kern512_1, kern512_2, kern512_3, kern512_4, kern512_5, kern512_6,
		kern512_7, kern512_8, kern512_9, kern512_10, kern512_11, kern512_12}
	kerns256 = []asmKernel{nil, kern256_1, kern256_2, kern256_3, kern256_4, kern256_5, kern256_6}

	kernsU512 = []asmKernelU{nil, kernu512_1, kernu512_2, kernu512_3, kernu512_4, kernu512_5, kernu512_6,
		kernu512_7, kernu512_8, kernu512_9, kernu512_10, kernu512_11, kernu512_12}
	kernsU256 = []asmKernelU{nil, kernu256_1, kernu256_2, kernu256_3, kernu256_4, kernu256_5, kernu256_6}
)

// asmKernelU is the signature of the generated in-place-A micro-kernels.
type asmKernelU func(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, acc int)

// registerAsm fills the AVX-512 and AVX2 tables the CPU supports.
func registerAsm() {
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		impls[AVX2] = asmImpl(AVX2, 16, kerns256, kernsU256, peakFMA256, 24*8*2,
			dot256, dotRows256, axpyRows256, axpy256, scale256, sumsq256, mulScale256, maxf256, expSum256, swiglu256)
	}
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512DQ && cpu.X86.HasFMA {
		impls[AVX512] = asmImpl(AVX512, 32, kerns512, kernsU512, peakFMA512, 24*16*2,
			dot512, dotRows512x, axpyRows512x, axpy512, scale512, sumsq512, mulScale512, maxf512, expSum512, swiglu512)
		impls[AVX512].dotTile4 = dotTile4x4_512
		impls[AVX512].dotRowsH = dotRowsH512
		impls[AVX512].axpyRowsH = axpyRowsH512
	}
}

// asmImpl wraps the pointer-based assembly in the slice-based table.
func asmImpl(l Level, nr int, ks []asmKernel, kus []asmKernelU, peak func(int), peakFLOP float64,
	dot func(a, b *float32, n int) float32,
	dotRows func(dst, q, k *float32, ldk, n, hd int),
	axpyRows func(out, w, v *float32, ldv, n, hd int),
	axpy func(alpha float32, x, y *float32, n int),
	scale func(x *float32, n int, s float32),
	sumsq func(x *float32, n int) float32,
	mulScale func(dst, x, g *float32, n int, s float32),
	maxf func(x *float32, n int) float32,
	expSum func(x *float32, n int, k, off float32) float32,
	swiglu func(dst, g, u *float32, n int),
) *impl {
	im := &impl{level: l, nr: nr, mrMax: len(ks) - 1, peak: peak, peakFLOP: peakFLOP}
	im.kern = make([]kernelFn, len(ks))
	im.kernU = make([]kernelUFn, len(ks))
	for mr := 1; mr < len(kus); mr++ {
		k := kus[mr]
		im.kernU[mr] = func(kk int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
			flag := 0
			if acc {
				flag = 1
			}
			var ap, bp *float32
			if kk > 0 {
				ap, bp = &a[0], &b[0]
			}
			k(kk, ap, lda, bp, ldb, &c[0], ldc, flag)
		}
	}
	for mr := 1; mr < len(ks); mr++ {
		k := ks[mr]
		im.kern[mr] = func(kk int, a, b []float32, ldb int, c []float32, ldc int, acc bool) {
			flag := 0
			if acc {
				flag = 1
			}
			var ap, bp *float32
			if kk > 0 {
				ap, bp = &a[0], &b[0]
			}
			k(kk, ap, bp, ldb, &c[0], ldc, flag)
		}
	}
	im.dotRows = func(dst, q, k []float32, ldk int) {
		if len(dst) == 0 || len(q) == 0 {
			clear(dst)
			return
		}
		_ = k[(len(dst)-1)*ldk+len(q)-1]
		dotRows(&dst[0], &q[0], &k[0], ldk, len(dst), len(q))
	}
	im.axpyRows = func(out, w, v []float32, ldv int) {
		if len(w) == 0 || len(out) == 0 {
			return
		}
		_ = v[(len(w)-1)*ldv+len(out)-1]
		axpyRows(&out[0], &w[0], &v[0], ldv, len(w), len(out))
	}
	im.dot = func(a, b []float32) float32 {
		if len(a) == 0 {
			return 0
		}
		return dot(&a[0], &b[:len(a)][0], len(a))
	}
	im.axpy = func(alpha float32, x, y []float32) {
		if len(x) == 0 {
			return
		}
		axpy(alpha, &x[0], &y[:len(x)][0], len(x))
	}
	im.scale = func(x []float32, s float32) {
		if len(x) > 0 {
			scale(&x[0], len(x), s)
		}
	}
	im.sumsq = func(x []float32) float32 {
		if len(x) == 0 {
			return 0
		}
		return sumsq(&x[0], len(x))
	}
	im.mulScale = func(dst, x, g []float32, s float32) {
		if len(g) == 0 {
			return
		}
		mulScale(&dst[:len(g)][0], &x[:len(g)][0], &g[0], len(g), s)
	}
	im.maxf = func(x []float32) float32 {
		if len(x) == 0 {
			return negInf
		}
		return maxf(&x[0], len(x))
	}
	im.expSum = func(x []float32, k, off float32) float32 {
		if len(x) == 0 {
			return 0
		}
		return expSum(&x[0], len(x), k, off)
	}
	im.swiglu = func(dst, g, u []float32) {
		if len(g) == 0 {
			return
		}
		swiglu(&dst[:len(g)][0], &g[0], &u[:len(g)][0], len(g))
	}
	return im
}

// rotF32Asm runs Rotate's assembly for level l (all slices of one
// non-zero length) and reports whether l has one.
func rotF32Asm(l Level, lo, hi, cos, sin []float32) bool {
	switch l {
	case AVX512:
		rotF32512(&lo[0], &hi[0], &cos[0], &sin[0], len(lo))
	case AVX2:
		rotF32256(&lo[0], &hi[0], &cos[0], &sin[0], len(lo))
	default:
		return false
	}
	return true
}

// rotF64Asm is rotF32Asm for RotateF64.
func rotF64Asm(l Level, lo, hi []float32, cos, sin []float64) bool {
	switch l {
	case AVX512:
		rotF64512(&lo[0], &hi[0], &cos[0], &sin[0], len(lo))
	case AVX2:
		rotF64256(&lo[0], &hi[0], &cos[0], &sin[0], len(lo))
	default:
		return false
	}
	return true
}

// dotRows512x is dotRows512 with whole blocks of 16 rows reduced together
// (dotRows16_512) when the head size is a multiple of 16.
func dotRows512x(dst, q, k *float32, ldk, n, hd int) {
	if blocks := n / 16; blocks > 0 && hd%16 == 0 {
		dotRows16_512(dst, q, k, ldk, blocks, hd)
		done := blocks * 16
		if n == done {
			return
		}
		dst = (*float32)(unsafe.Add(unsafe.Pointer(dst), 4*done))
		k = (*float32)(unsafe.Add(unsafe.Pointer(k), 4*done*ldk))
		n -= done
	}
	dotRows512(dst, q, k, ldk, n, hd)
}

// axpyRows512x is axpyRows512 with the head in registers (axpyRowsN_512)
// when it is 1 to 4 whole vectors.
func axpyRows512x(out, w, v *float32, ldv, n, hd int) {
	switch hd {
	case 16:
		axpyRows1_512(out, w, v, ldv, n)
	case 32:
		axpyRows2_512(out, w, v, ldv, n)
	case 48:
		axpyRows3_512(out, w, v, ldv, n)
	case 64:
		axpyRows4_512(out, w, v, ldv, n)
	default:
		axpyRows512(out, w, v, ldv, n, hd)
	}
}

// dotRowsH512 is DotRowsF16's kernel: whole blocks of 16 rows, hd a
// multiple of 16 (the caller checked both).
func dotRowsH512(dst, q []float32, k []uint16, ldk int) {
	dotRows16h_512(&dst[0], &q[0], &k[0], ldk, len(dst)/16, len(q))
}

// axpyRowsH512 is AxpyRowsF16's kernel: a head of 1 to 4 whole vectors
// (the caller checked).
func axpyRowsH512(out, w []float32, v []uint16, ldv int) {
	switch len(out) {
	case 16:
		axpyRows1h_512(&out[0], &w[0], &v[0], ldv, len(w))
	case 32:
		axpyRows2h_512(&out[0], &w[0], &v[0], ldv, len(w))
	case 48:
		axpyRows3h_512(&out[0], &w[0], &v[0], ldv, len(w))
	case 64:
		axpyRows4h_512(&out[0], &w[0], &v[0], ldv, len(w))
	}
}
