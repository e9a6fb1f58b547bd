package quant

import (
	"fmt"
	"math"
)

// Q80 is a row of activations quantized as llama.cpp's Q8_0 (what its CPU
// kernels multiply Q8_0, Q5_0 and Q4_0 weights with): per 32 elements a
// scale d (fp16, kept here as the float32 it rounds to) and 32 int8
// values q with x ≈ d·q. [DotQ80] multiplies a weight row with it in
// integers. The zero value is ready for Quantize; a Q80 is not safe for
// concurrent use while it is being quantized, and safe to read
// concurrently afterwards.
type Q80 struct {
	d  []float32
	ds []float32 // per block d·Σq (the kernels' offsets come off through it)
	q  []int8
}

// Len is the number of elements quantized.
func (x *Q80) Len() int { return len(x.q) }

// Quantize sets x to the Q8_0 form of v (len(v) a multiple of 32),
// reusing x's memory: ggml-cpu's x86 quantize_row_q8_0 (the scale is the
// value of largest magnitude over 127, stored as fp16; the values are
// v·127/amax rounded to nearest even; an all-zero block has scale 0).
func (x *Q80) Quantize(v []float32) error {
	if len(v)%QK8_0 != 0 {
		return fmt.Errorf("%w: Q8_0 quantization of %d values, not a multiple of %d", ErrSize, len(v), QK8_0)
	}
	nb := len(v) / QK8_0
	x.d = grow(x.d, nb)
	x.ds = grow(x.ds, nb)
	x.q = grow(x.q, len(v))
	q80Blocks(v, x.q, x.d)
	for b := range nb {
		q := x.q[b*QK8_0 : (b+1)*QK8_0]
		var sum int32
		for _, v := range q {
			sum += int32(v)
		}
		x.ds[b] = x.d[b] * float32(sum)
	}
	return nil
}

// q80Block quantizes the 32 values of v into q as ggml-cpu's x86
// quantize_row_q8_0 does and returns the scale (rounded to fp16): in
// assembly at the AVX-512 level (the same bits), in Go elsewhere and for
// blocks holding an Inf or NaN.
func q80Block(v []float32, q []int8) float32 {
	var d [1]float32
	q80Blocks(v[:QK8_0], q[:QK8_0], d[:])
	return d[0]
}

// q80Blocks is q80Block for the len(d) blocks of v (and of q), each
// block's scale written to d: one assembly call for all of them at the
// AVX-512 level (which leaves each block's largest magnitude in d), Go
// where the assembly does not run or meets an Inf or NaN.
func q80Blocks(v []float32, q []int8, d []float32) {
	if q80BlocksAsm(v, q, d) {
		for b, amax := range d {
			d[b] = q80Scale(amax)
		}
		return
	}
	for b := range d {
		d[b] = q80BlockGo(v[b*QK8_0:(b+1)*QK8_0], q[b*QK8_0:(b+1)*QK8_0])
	}
}

// q80Scale is the scale of a Q8_0 block of largest magnitude amax,
// rounded to fp16 as it is stored.
func q80Scale(amax float32) float32 { return F16ToF32(F32ToF16(amax / 127)) }

// q80BlockGo is q80Block in Go.
func q80BlockGo(v []float32, q []int8) float32 {
	var amax float32
	for _, f := range v {
		amax = max(amax, float32(math.Abs(float64(f))))
	}
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	for i, f := range v {
		q[i] = int8(math.RoundToEven(float64(f * id)))
	}
	return q80Scale(amax)
}

// RoundQ8_0 replaces x (len a multiple of 32; a shorter tail is left
// as it is) by its Q8_0 quantization dequantized: what llama.cpp's CPU
// kernels multiply Q8_0, Q5_0 and Q4_0 weights with, the values of
// [Q80.Quantize] as floats. Safe for concurrent use on distinct x.
func RoundQ8_0(x []float32) {
	var q [QK8_0]int8
	for b := 0; b+QK8_0 <= len(x); b += QK8_0 {
		d := q80Block(x[b:b+QK8_0], q[:])
		for i, v := range q {
			x[b+i] = d * float32(v)
		}
	}
}

// SupportsQ80 reports whether DotQ80 computes rows of type t: Q8_0, Q5_0
// and Q4_0.
func SupportsQ80(t Type) bool { return t == Q8_0 || t == Q5_0 || t == Q4_0 }

// IntegerDots reports whether DotQ8K and DotQ80 run in assembly here
// (AVX-512 VNNI at package simd's AVX-512 level). Elsewhere they run the
// same integer arithmetic in Go, which is slower than Dot's float
// kernels: callers that want speed use them only when this is true.
func IntegerDots() bool { return integerAsm() }

// IntegerGEMV reports whether DotQ80Many and DotQ80RowsMany (t one of
// SupportsQ80) or DotQ8KMany and DotQ8KRowsMany (SupportsQ8K) run rows of
// type t in assembly here: where IntegerDots is true (AVX-512 VNNI), and
// at package simd's AVX2 level (VPMADDUBSW, as llama.cpp's AVX2 kernels).
// A decode step uses them when this is true.
func IntegerGEMV(t Type) bool { return integerGEMV(t) }

// IntegerGEMM reports whether Gemm runs its tile kernels in assembly here:
// where IntegerDots is true (AVX-512 VNNI), and at package simd's AVX2
// level (VPMADDUBSW and VPMADDWD on half panels). Elsewhere it runs the
// same integer arithmetic in Go; a prefill uses it when this is true.
func IntegerGEMM() bool { return integerGEMM() }

// DotQ80 is Σ dequant(w)·(d·q) for a row w of type t (SupportsQ80) and
// activations x of the same length, computed as llama.cpp's
// ggml_vec_dot_q8_0_q8_0, ggml_vec_dot_q5_0_q8_0 and
// ggml_vec_dot_q4_0_q8_0 do: an integer dot per 32-element block, times
// the two blocks' scales, summed in float32. With AVX-512 VNNI (at package
// simd's AVX-512 level) it runs VPDPBUSD; elsewhere the same integer
// arithmetic in Go. It panics when t is not supported or the sizes
// disagree.
func DotQ80(t Type, w []byte, x *Q80) float32 {
	if !SupportsQ80(t) {
		panic("quant: DotQ80 of a " + t.String() + " row")
	}
	nb, ts := len(x.d), q80BlockBytes(t)
	if len(w) != nb*ts {
		panic(fmt.Sprintf("quant: DotQ80 of %d %s bytes against %d Q8_0 elements", len(w), t, len(x.q)))
	}
	even := nb &^ 1
	var s float32
	if even > 0 {
		if v, ok := dotQ80Asm(t, w, x, even); ok {
			s = v
		} else {
			even = 0
		}
	}
	for b := even; b < nb; b++ {
		s += dotQ80Block(t, w[b*ts:(b+1)*ts], x.q[b*QK8_0:(b+1)*QK8_0]) * x.d[b]
	}
	return s
}

// DotQ80Many sets out[i] = DotQ80(t, ws[i], x) for every row of ws (out
// must hold len(ws) values): the decode product of one activation row
// against a task's weight rows, wherever they lie (a stacked, permuted or
// column-sliced weight's rows). With AVX-512 VNNI all the rows go through
// one kernel call when x has an even number of blocks, so no Go code runs
// between two rows; elsewhere it is DotQ80 per row, and the results are the
// same either way. It panics like DotQ80, and when out is too short. Safe
// for concurrent use; does not allocate.
func DotQ80Many(t Type, ws [][]byte, x *Q80, out []float32) {
	if len(out) < len(ws) {
		panic(fmt.Sprintf("quant: DotQ80Many of %d rows into %d", len(ws), len(out)))
	}
	if len(ws) == 0 {
		return
	}
	if !SupportsQ80(t) {
		panic("quant: DotQ80Many of " + t.String() + " rows")
	}
	nb, ts := len(x.d), q80BlockBytes(t)
	for _, w := range ws {
		if len(w) != nb*ts {
			panic(fmt.Sprintf("quant: DotQ80Many of %d %s bytes against %d Q8_0 elements", len(w), t, len(x.q)))
		}
	}
	if nb > 0 && nb%2 == 0 && dotQ80ManyAsm(t, ws, x, out) {
		return
	}
	for i, w := range ws {
		out[i] = DotQ80(t, w, x)
	}
}

// q80BlockBytes is the block size in bytes of a type DotQ80 computes (a
// switch: Type.TypeSize is a map lookup, too slow per weight row).
func q80BlockBytes(t Type) int {
	switch t {
	case Q5_0:
		return 22
	case Q4_0:
		return 18
	}
	return 34
}

// dotQ80Block is one block's integer dot times the weight block's scale.
func dotQ80Block(t Type, blk []byte, q []int8) float32 {
	var s int32
	switch t {
	case Q8_0:
		for i, v := range q {
			s += int32(int8(blk[2+i])) * int32(v)
		}
	case Q5_0:
		qh := uint32(blk[2]) | uint32(blk[3])<<8 | uint32(blk[4])<<16 | uint32(blk[5])<<24
		for i := range 16 {
			lo := int32(blk[6+i]&0xf|byte(qh>>i&1)<<4) - 16
			hi := int32(blk[6+i]>>4|byte(qh>>(i+16)&1)<<4) - 16
			s += lo*int32(q[i]) + hi*int32(q[16+i])
		}
	case Q4_0:
		for i := range 16 {
			s += (int32(blk[2+i]&0xf)-8)*int32(q[i]) + (int32(blk[2+i]>>4)-8)*int32(q[16+i])
		}
	}
	return half(blk) * float32(s)
}

// Q80RowsMax is the most rows a Q80Rows holds.
const Q80RowsMax = 4

// Q80Rows is a few rows of activations (a decode batch), each quantized as
// Q80 and interleaved per four 32-element blocks, so that [DotQ80Rows]
// unpacks each weight block once for all of them. The zero value is ready
// for Quantize; it is not safe for concurrent use while it is being
// quantized, and safe to read concurrently afterwards.
type Q80Rows struct {
	rows  [Q80RowsMax]Q80
	r, nb int // rows, blocks interleaved (quads, then a last pair)
	q     []int8
	d, ds []float32
}

// Rows is the number of rows quantized.
func (x *Q80Rows) Rows() int { return x.r }

// Quantize sets x to the Q80 forms of 1 to Q80RowsMax rows of one length
// (a multiple of 32), reusing x's memory.
func (x *Q80Rows) Quantize(rows ...[]float32) error {
	if len(rows) == 0 || len(rows) > Q80RowsMax {
		return fmt.Errorf("%w: %d rows for a Q80Rows (1 to %d)", ErrSize, len(rows), Q80RowsMax)
	}
	for i, v := range rows {
		if len(v) != len(rows[0]) {
			return fmt.Errorf("%w: rows of %d and %d values", ErrSize, len(rows[0]), len(v))
		}
		if err := x.rows[i].Quantize(v); err != nil {
			return err
		}
	}
	R := len(rows)
	x.r, x.nb = R, len(rows[0])/QK8_0&^1
	if R == 1 {
		return nil // DotQ80Rows dots the one row's Q80
	}
	x.q = grow(x.q, R*x.nb*QK8_0)
	x.d = grow(x.d, R*x.nb)
	x.ds = grow(x.ds, R*x.nb)
	for b0 := 0; b0 < x.nb; {
		u := 4 // blocks per unit: quads, then a pair
		if x.nb-b0 < 4 {
			u = 2
		}
		for r := range R {
			src, i := &x.rows[r], R*b0+r*u
			copy(x.q[i*QK8_0:(i+u)*QK8_0], src.q[b0*QK8_0:])
			copy(x.d[i:i+u], src.d[b0:])
			copy(x.ds[i:i+u], src.ds[b0:])
		}
		b0 += u
	}
	return nil
}

// DotQ80RowsMany sets out[i·x.Rows()+r] to DotQ80(t, ws[i], row r of x)
// for every weight row of ws and row of x: DotQ80Rows over a task's
// weight rows, wherever they lie (see DotQ80Many), in one kernel call at
// the AVX-512 level with VNNI when x's blocks are all in the kernels'
// quads and pairs (an even count), so no Go code runs between two weight
// rows; at the AVX2 level (an even count) the same with AVX2 kernels;
// otherwise DotQ80Rows per row. The
// results are the same either way. It panics like DotQ80Rows, and when
// out is shorter than len(ws)·x.Rows(). Safe for concurrent use; does not
// allocate.
func DotQ80RowsMany(t Type, ws [][]byte, x *Q80Rows, out []float32) {
	if x.r == 0 || len(out) < len(ws)*x.r {
		panic(fmt.Sprintf("quant: DotQ80RowsMany of %d × %d rows into %d", len(ws), x.r, len(out)))
	}
	if len(ws) == 0 {
		return
	}
	if !SupportsQ80(t) {
		panic(fmt.Sprintf("quant: DotQ80RowsMany of %s weights", t))
	}
	rb := q80BlockBytes(t) * len(x.rows[0].d)
	for i, w := range ws {
		if len(w) != rb {
			panic(fmt.Sprintf("quant: DotQ80RowsMany: weight row %d has %d bytes, want %d", i, len(w), rb))
		}
	}
	if dotQ80RowsManyAsm(t, ws, x, out) {
		return
	}
	for i, w := range ws {
		DotQ80Rows(t, w, x, out[i*x.r:(i+1)*x.r])
	}
}

// DotQ80Rows sets out[r] to DotQ80(t, w, row r of x) for every row of x,
// reading each weight block once (AVX-512 VNNI; elsewhere DotQ80 per
// row). It panics when t is not supported, the sizes disagree or out is
// shorter than x.Rows().
func DotQ80Rows(t Type, w []byte, x *Q80Rows, out []float32) {
	if x.r == 0 || len(out) < x.r {
		panic(fmt.Sprintf("quant: DotQ80Rows of %d rows into %d", x.r, len(out)))
	}
	ts := q80BlockBytes(t)
	nb := len(x.rows[0].d)
	if !SupportsQ80(t) || len(w) != nb*ts || x.r == 1 || !dotQ80RowsAsm(t, w, x, out) {
		for r := range x.r {
			out[r] = DotQ80(t, w, &x.rows[r])
		}
		return
	}
	for b := x.nb; b < nb; b++ {
		blk := w[b*ts : (b+1)*ts]
		for r := range x.r {
			out[r] += dotQ80Block(t, blk, x.rows[r].q[b*QK8_0:(b+1)*QK8_0]) * x.rows[r].d[b]
		}
	}
}
