package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// allTypes are the computable types, in ggml order.
var allTypes = []Type{F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16}

// refElem decodes element e of a row of type t straight from the block
// layout of ggml-common.h, one element at a time with its own index
// arithmetic (independent of the block kernels), doing ggml's float32
// operations in ggml's order so the result must match bit for bit.
func refElem(t Type, row []byte, e int) float32 {
	bs, ts := t.BlockSize(), t.TypeSize()
	b := row[e/bs*ts : (e/bs+1)*ts]
	i := e % bs
	h := func(off int) float32 { return F16ToF32(binary.LittleEndian.Uint16(b[off:])) }
	switch t {
	case F32:
		return math.Float32frombits(binary.LittleEndian.Uint32(b))
	case F16:
		return h(0)
	case BF16:
		return math.Float32frombits(uint32(binary.LittleEndian.Uint16(b)) << 16)
	case Q8_0:
		return float32(int8(b[2+i])) * h(0)
	case Q4_0, Q4_1, Q5_0, Q5_1:
		qoff := 2 + 2*int(t-Q4_0) // Q4_0 2, Q4_1 4
		if t >= Q5_0 {
			qoff = 6 + 2*int(t-Q5_0) // Q5_0 6, Q5_1 8
		}
		q := int32(b[qoff+i%16] >> (4 * (i / 16)) & 15) // element i<16 low nibble, i≥16 high
		switch t {
		case Q5_0:
			q |= int32(binary.LittleEndian.Uint32(b[2:])>>i&1) << 4
		case Q5_1:
			q |= int32(binary.LittleEndian.Uint32(b[4:])>>i&1) << 4
		}
		switch t {
		case Q4_0:
			return float32(q-8) * h(0)
		case Q5_0:
			return float32(q-16) * h(0)
		}
		return float32(float32(q)*h(0)) + h(2)
	case Q4_K, Q5_K:
		sb := i / 32 // sub-block 0..7: scale sc[sb], min m[sb]
		var sc, m byte
		if sb < 4 {
			sc, m = b[4+sb]&63, b[8+sb]&63
		} else {
			sc = b[12+sb-4]&15 | b[4+sb-4]>>6<<4
			m = b[12+sb-4]>>4 | b[8+sb-4]>>6<<4
		}
		qs := 16
		if t == Q5_K {
			qs = 48
		}
		g, l := i/64, i%32
		q := b[qs+32*g+l] >> (4 * (sb % 2)) & 15
		if t == Q5_K && b[16+l]>>sb&1 != 0 { // qh[l] bit sb
			q += 16
		}
		d1 := h(0) * float32(sc)
		m1 := h(2) * float32(m)
		return float32(d1*float32(q)) - m1
	case Q6_K:
		n, r := i/128, i%128
		k, l := r/32, r%32
		lo := b[64*n+l+32*(k&1)] >> (4 * (k / 2)) & 15
		hi := b[128+32*n+l] >> (2 * k) & 3
		q := int32(lo|hi<<4) - 32
		sc := float32(int8(b[192+i/16]))
		return float32(h(208)*sc) * float32(q)
	}
	panic("refElem: type " + t.String())
}

func refRow(t Type, row []byte, n int) []float32 {
	y := make([]float32, n)
	for e := range y {
		y[e] = refElem(t, row, e)
	}
	return y
}

// sameBits reports whether a and b are equal bit for bit, any NaN
// matching any NaN.
func sameBits(a, b float32) bool {
	if a != a && b != b {
		return true
	}
	return math.Float32bits(a) == math.Float32bits(b)
}

// gauss returns n normal floats of standard deviation sd.
func gauss(r *rand.Rand, n int, sd float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * sd)
	}
	return x
}

// gaussOutliers is gauss with a 6-sigma outlier every 97 elements (as real
// weights have).
func gaussOutliers(r *rand.Rand, n int, sd float64) []float32 {
	x := gauss(r, n, sd)
	for i := 13; i < n; i += 97 {
		x[i] *= 6
	}
	return x
}

// randomRow returns the bytes of a row of n elements of t with random
// quants and scales that are finite halves of moderate size (so that every
// decoded value is finite).
func randomRow(r *rand.Rand, t Type, n int) []byte {
	rb, err := t.RowBytes(n)
	if err != nil {
		panic(err)
	}
	b := make([]byte, rb)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	ts := t.TypeSize()
	sane := func(off int) {
		binary.LittleEndian.PutUint16(b[off:], F32ToF16(float32(r.NormFloat64()*0.01)))
	}
	for blk := 0; blk < rb/ts; blk++ {
		o := blk * ts
		switch t {
		case F32:
			binary.LittleEndian.PutUint32(b[o:], math.Float32bits(float32(r.NormFloat64())))
		case F16:
			sane(o)
		case BF16:
			binary.LittleEndian.PutUint16(b[o:], F32ToBF16(float32(r.NormFloat64())))
		case Q8_0, Q4_0, Q5_0:
			sane(o)
		case Q4_1, Q5_1, Q4_K, Q5_K:
			sane(o)
			sane(o + 2)
		case Q6_K:
			sane(o + 208)
		}
	}
	return b
}

func relRMS(x, y []float32) float64 {
	var num, den float64
	for i := range x {
		d := float64(x[i]) - float64(y[i])
		num += d * d
		den += float64(x[i]) * float64(x[i])
	}
	return math.Sqrt(num / den)
}

func mustRowBytes(t testing.TB, typ Type, n int) int {
	t.Helper()
	rb, err := typ.RowBytes(n)
	if err != nil {
		t.Fatal(err)
	}
	return rb
}
