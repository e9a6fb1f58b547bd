package quant

import (
	"fmt"
	"math"
)

// Q8K is a row of activations quantized as llama.cpp's Q8_K (what its CPU
// kernels multiply K-quant weights with): per 256 elements a float32 scale
// d and 256 int8 values q with x ≈ d·q, and per 32 elements the sum of the
// values, and per 16 (llama.cpp's bsums). [DotQ8K] multiplies a weight row with it in integers. The values
// are stored in the order the kernels read them. The zero value is ready
// for Quantize; a Q8K is not safe for concurrent use while it is being
// quantized, and safe to read concurrently afterwards.
type Q8K struct {
	n      int
	d      []float32
	q      []int8  // Q4_K kernel order: per 128, elements 0..31, 64..95, 32..63, 96..127
	qn     []int8  // natural order (the Q6_K kernel's)
	sums   []int32 // per 32
	sums16 []int32 // per 16
}

// Len is the number of elements quantized.
func (x *Q8K) Len() int { return x.n }

// Quantize sets x to the Q8_K form of v (len(v) a multiple of 256),
// reusing x's memory: ggml's quantize_row_q8_K (the scale is −127 over the
// value of largest magnitude, values rounded to nearest even and capped at
// 127; an all-zero block has scale 0).
func (x *Q8K) Quantize(v []float32) error {
	if len(v)%QK_K != 0 {
		return fmt.Errorf("%w: Q8_K quantization of %d values, not a multiple of %d", ErrSize, len(v), QK_K)
	}
	nb := len(v) / QK_K
	x.n = len(v)
	x.d = grow(x.d, nb)
	x.q = grow(x.q, len(v))
	x.sums = grow(x.sums, len(v)/32)
	x.sums16 = grow(x.sums16, len(v)/16)
	x.qn = grow(x.qn, len(v))
	var nat [QK_K]int8
	for b := range nb {
		x.d[b] = q8kBlock(v[b*QK_K:(b+1)*QK_K], &nat)
		for j := range QK_K / 16 {
			var s int32
			for _, q := range nat[16*j : 16*j+16] {
				s += int32(q)
			}
			x.sums16[b*QK_K/16+j] = s
		}
		for j := range QK_K / 32 {
			x.sums[b*QK_K/32+j] = x.sums16[b*QK_K/16+2*j] + x.sums16[b*QK_K/16+2*j+1]
		}
		copy(x.qn[b*QK_K:], nat[:])
		// Kernel order: per 128, elements 0..31, 64..95, 32..63, 96..127.
		out := x.q[b*QK_K : (b+1)*QK_K]
		for h := range 2 {
			src, dst := nat[128*h:], out[128*h:]
			copy(dst[0:32], src[0:32])
			copy(dst[32:64], src[64:96])
			copy(dst[64:96], src[32:64])
			copy(dst[96:128], src[96:128])
		}
	}
	return nil
}

// q8kBlock quantizes the 256 values of v into q as ggml's
// quantize_row_q8_K does and returns the scale: in assembly at the
// AVX-512 level (the same bits), in Go elsewhere and for blocks holding an
// Inf or NaN.
func q8kBlock(v []float32, q *[QK_K]int8) float32 {
	v = v[:QK_K]
	if d, ok := q8kBlockAsm(v, q); ok {
		return d
	}
	return q8kBlockGo(v, q)
}

// q8kBlockGo is q8kBlock in Go.
func q8kBlockGo(v []float32, q *[QK_K]int8) float32 {
	var amax, mx float32
	for _, f := range v {
		if a := float32(math.Abs(float64(f))); a > amax {
			amax, mx = a, f
		}
	}
	if amax == 0 {
		clear(q[:])
		return 0
	}
	iscale := -127 / mx
	for i, f := range v {
		q[i] = int8(min(127, math.RoundToEven(float64(iscale*f))))
	}
	return 1 / iscale
}

// RoundQ8K replaces x (len a multiple of 256; a shorter tail is left as
// it is) by its Q8_K quantization dequantized: what llama.cpp's CPU
// kernels multiply K-quant weights with, the values of [Q8K.Quantize] as
// floats. Safe for concurrent use on distinct x.
func RoundQ8K(x []float32) {
	var q [QK_K]int8
	for b := 0; b+QK_K <= len(x); b += QK_K {
		d := q8kBlock(x[b:b+QK_K], &q)
		for i, v := range q {
			x[b+i] = d * float32(v)
		}
	}
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// SupportsQ8K reports whether DotQ8K computes rows of type t (Q4_K and
// Q6_K).
func SupportsQ8K(t Type) bool { return t == Q4_K || t == Q6_K }

// DotQ8K is Σ dequant(w)·(d·q) for a row w of type t (SupportsQ8K) and
// activations x of the same length, computed as llama.cpp's
// ggml_vec_dot_q4_K_q8_K and ggml_vec_dot_q6_K_q8_K do: integer dots per
// sub-block, scaled by the block's integer scales, the mins (Q4_K) or the
// offset 32 (Q6_K) applied through x's sums, one float multiply per block.
// With AVX-512 VNNI (at package simd's AVX-512 level) it runs VPDPBUSD;
// elsewhere the same integer arithmetic in Go. It panics when t is not
// supported or the sizes disagree.
func DotQ8K(t Type, w []byte, x *Q8K) float32 {
	if !SupportsQ8K(t) {
		panic("quant: DotQ8K of a " + t.String() + " row")
	}
	nb, ts := x.n/QK_K, 144
	if t == Q6_K {
		ts = 210
	}
	if len(w) != nb*ts {
		panic(fmt.Sprintf("quant: DotQ8K of %d %s bytes against %d Q8_K elements", len(w), t, x.n))
	}
	if nb == 0 {
		return 0
	}
	if v, ok := dotQ8KAsm(t, w, x); ok {
		return v
	}
	if t == Q6_K {
		return dotQ6KQ8KGo(w, x)
	}
	return dotQ4KQ8KGo(w, x)
}

// DotQ8KMany sets out[i] = DotQ8K(t, ws[i], x) for every row of ws (out
// must hold len(ws) values): the decode product of one activation row
// against a task's weight rows, wherever they lie (a stacked, permuted or
// column-sliced weight's rows). With AVX-512 VNNI all the rows go through
// one kernel call, so no Go code runs between two rows; elsewhere it is
// DotQ8K per row, and the results are the same either way. It panics like
// DotQ8K, and when out is too short. Safe for concurrent use; does not
// allocate.
func DotQ8KMany(t Type, ws [][]byte, x *Q8K, out []float32) {
	if len(out) < len(ws) {
		panic(fmt.Sprintf("quant: DotQ8KMany of %d rows into %d", len(ws), len(out)))
	}
	if len(ws) == 0 {
		return
	}
	if !SupportsQ8K(t) {
		panic("quant: DotQ8KMany of " + t.String() + " rows")
	}
	nb, ts := x.n/QK_K, 144
	if t == Q6_K {
		ts = 210
	}
	for _, w := range ws {
		if len(w) != nb*ts {
			panic(fmt.Sprintf("quant: DotQ8KMany of %d %s bytes against %d Q8_K elements", len(w), t, x.n))
		}
	}
	if nb > 0 && dotQ8KManyAsm(t, ws, x, out) {
		return
	}
	for i, w := range ws {
		out[i] = DotQ8K(t, w, x)
	}
}

// dotQ6KQ8KGo is DotQ8K's Q6_K integer arithmetic in Go.
func dotQ6KQ8KGo(w []byte, x *Q8K) float32 {
	var sumf float32
	for b := range x.n / QK_K {
		blk := (*[210]byte)(w[b*210:])
		q := x.qn[b*QK_K:]
		var sumi int32
		for sub := range 16 {
			var s int32
			for e := 16 * sub; e < 16*sub+16; e++ {
				n, l := e/128, e%128
				ql, qh := blk[64*n:], blk[128+32*n:]
				var v byte
				switch l / 32 {
				case 0:
					v = ql[l]&0xf | (qh[l]&3)<<4
				case 1:
					v = ql[l]&0xf | (qh[l-32]>>2&3)<<4
				case 2:
					v = ql[l-64]>>4 | (qh[l-64]>>4&3)<<4
				case 3:
					v = ql[l-64]>>4 | (qh[l-96]>>6&3)<<4
				}
				s += int32(v) * int32(q[e])
			}
			sc := int32(int8(blk[192+sub]))
			sumi += sc * (s - 32*x.sums16[b*16+sub])
		}
		sumf += half(blk[208:]) * x.d[b] * float32(sumi)
	}
	return sumf
}

// dotQ4KQ8KGo is DotQ8K's integer arithmetic in Go.
func dotQ4KQ8KGo(w []byte, x *Q8K) float32 {
	var sumf, summ float32
	for b := range x.n / QK_K {
		blk := (*[144]byte)(w[b*144:])
		sc, mn := scalesK4((*[12]byte)(blk[4:16]))
		q := x.q[b*QK_K:]
		var sumi int32
		for h := range 2 {
			qs := blk[16+64*h : 16+64*h+64]
			xs := q[128*h : 128*h+128]
			var lo0, lo1, hi0, hi1 int32
			for l := range 32 {
				lo0 += int32(qs[l]&0xf) * int32(xs[l])
				lo1 += int32(qs[32+l]&0xf) * int32(xs[32+l])
				hi0 += int32(qs[l]>>4) * int32(xs[64+l])
				hi1 += int32(qs[32+l]>>4) * int32(xs[96+l])
			}
			sumi += int32(sc[4*h])*lo0 + int32(sc[4*h+1])*hi0 + int32(sc[4*h+2])*lo1 + int32(sc[4*h+3])*hi1
		}
		var mi int32
		for j := range 8 {
			mi += int32(mn[j]) * x.sums[b*8+j]
		}
		d := half(blk[0:]) * x.d[b]
		dmin := half(blk[2:]) * x.d[b]
		sumf += d * float32(sumi)
		summ += dmin * float32(mi)
	}
	return sumf - summ
}

// Q8KRowsMax is the most rows a Q8KRows holds.
const Q8KRowsMax = 4

// Q8KRows is a few rows of activations (a decode batch), each quantized
// as Q8K and interleaved per 256-element block, so that [DotQ8KRows]
// unpacks each weight block once for all of them. The zero value is
// ready for Quantize; it is not safe for concurrent use while it is being
// quantized, and safe to read concurrently afterwards.
type Q8KRows struct {
	rows         [Q8KRowsMax]Q8K
	r            int
	q, qn        []int8
	d            []float32
	sums, sums16 []int32
}

// Rows is the number of rows quantized.
func (x *Q8KRows) Rows() int { return x.r }

// Quantize sets x to the Q8K forms of 1 to Q8KRowsMax rows of one length
// (a multiple of 256), reusing x's memory.
func (x *Q8KRows) Quantize(rows ...[]float32) error {
	if len(rows) == 0 || len(rows) > Q8KRowsMax {
		return fmt.Errorf("%w: %d rows for a Q8KRows (1 to %d)", ErrSize, len(rows), Q8KRowsMax)
	}
	for i, v := range rows {
		if len(v) != len(rows[0]) {
			return fmt.Errorf("%w: rows of %d and %d values", ErrSize, len(rows[0]), len(v))
		}
		if err := x.rows[i].Quantize(v); err != nil {
			return err
		}
	}
	R, n := len(rows), len(rows[0])
	nb := n / QK_K
	x.r = R
	if R == 1 {
		return nil // DotQ8KRows dots the one row's Q8K
	}
	x.q = grow(x.q, R*n)
	x.qn = grow(x.qn, R*n)
	x.d = grow(x.d, R*nb)
	x.sums = grow(x.sums, R*n/32)
	x.sums16 = grow(x.sums16, R*n/16)
	for b := range nb {
		for r := range R {
			src, i := &x.rows[r], b*R+r
			copy(x.q[i*QK_K:(i+1)*QK_K], src.q[b*QK_K:])
			copy(x.qn[i*QK_K:(i+1)*QK_K], src.qn[b*QK_K:])
			x.d[i] = src.d[b]
			copy(x.sums[i*8:(i+1)*8], src.sums[b*8:])
			copy(x.sums16[i*16:(i+1)*16], src.sums16[b*16:])
		}
	}
	return nil
}

// DotQ8KRowsMany sets out[i·x.Rows()+r] to DotQ8K(t, ws[i], row r of x)
// for every weight row of ws and row of x: DotQ8KRows over a task's
// weight rows, wherever they lie (see DotQ8KMany), in one kernel call at
// the AVX-512 level with VNNI, so no Go code runs between two weight rows;
// at the AVX2 level the same with AVX2 kernels; otherwise DotQ8KRows per
// row. The results are the same
// either way. It panics like DotQ8KRows, and when out is shorter than
// len(ws)·x.Rows(). Safe for concurrent use; does not allocate.
func DotQ8KRowsMany(t Type, ws [][]byte, x *Q8KRows, out []float32) {
	if x.r == 0 || len(out) < len(ws)*x.r {
		panic(fmt.Sprintf("quant: DotQ8KRowsMany of %d × %d rows into %d", len(ws), x.r, len(out)))
	}
	if len(ws) == 0 {
		return
	}
	nb, ts := len(x.rows[0].d), 144
	if t == Q6_K {
		ts = 210
	}
	if !SupportsQ8K(t) {
		panic(fmt.Sprintf("quant: DotQ8KRowsMany of %s weights", t))
	}
	for i, w := range ws {
		if len(w) != nb*ts {
			panic(fmt.Sprintf("quant: DotQ8KRowsMany: weight row %d has %d bytes, want %d", i, len(w), nb*ts))
		}
	}
	if dotQ8KRowsManyAsm(t, ws, x, out) {
		return
	}
	for i, w := range ws {
		DotQ8KRows(t, w, x, out[i*x.r:(i+1)*x.r])
	}
}

// DotQ8KRows sets out[r] to DotQ8K(t, w, row r of x) for every row of x,
// reading each weight block once (AVX-512 VNNI; elsewhere DotQ8K per
// row). It panics when t is not supported, the sizes disagree or out is
// shorter than x.Rows().
func DotQ8KRows(t Type, w []byte, x *Q8KRows, out []float32) {
	if x.r == 0 || len(out) < x.r {
		panic(fmt.Sprintf("quant: DotQ8KRows of %d rows into %d", x.r, len(out)))
	}
	if x.r == 1 || !dotQ8KRowsAsm(t, w, x, out) {
		for r := range x.r {
			out[r] = DotQ8K(t, w, &x.rows[r])
		}
	}
}
