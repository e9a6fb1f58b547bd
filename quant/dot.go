package quant

import (
	"encoding/binary"
	"math"

	"github.com/cacheblend/cacheblend/simd"
)

// The pure-Go dot kernels: one block per iteration through fixed-size
// array views (no bounds checks inside a block), several independent
// partial sums, and the block's scales applied once per sub-block:
// Σ (d·q − m)·x = d·Σ q·x − m·Σ x. Each takes whole rows (len(row) checked
// by the caller) and allocates nothing. The amd64 build replaces some of
// them with assembly (dot_amd64.go); these stay the reference and the
// fallback.

func dotF32(row []byte, x []float32) float32 {
	if w, ok := f32View(row); ok {
		return simd.Dot(x, w)
	}
	var s float32
	for i, v := range x {
		s += math.Float32frombits(binary.LittleEndian.Uint32(row[4*i:])) * v
	}
	return s
}

func dotF16(row []byte, x []float32) float32 {
	row = row[:2*len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		b := (*[8]byte)(row[2*i:])
		xx := (*[4]float32)(x[i:])
		s0 += f16Table[uint16(b[0])|uint16(b[1])<<8] * xx[0]
		s1 += f16Table[uint16(b[2])|uint16(b[3])<<8] * xx[1]
		s2 += f16Table[uint16(b[4])|uint16(b[5])<<8] * xx[2]
		s3 += f16Table[uint16(b[6])|uint16(b[7])<<8] * xx[3]
	}
	for ; i < len(x); i++ {
		s0 += half(row[2*i:]) * x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func bf16At(b []byte) float32 {
	return math.Float32frombits((uint32(b[0]) | uint32(b[1])<<8) << 16)
}

func dotBF16(row []byte, x []float32) float32 {
	row = row[:2*len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		b := (*[8]byte)(row[2*i:])
		xx := (*[4]float32)(x[i:])
		s0 += bf16At(b[0:]) * xx[0]
		s1 += bf16At(b[2:]) * xx[1]
		s2 += bf16At(b[4:]) * xx[2]
		s3 += bf16At(b[6:]) * xx[3]
	}
	for ; i < len(x); i++ {
		s0 += bf16At(row[2*i:]) * x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func dotQ8_0(row []byte, x []float32) float32 {
	var sum float32
	for len(x) >= 32 {
		b := (*[34]byte)(row)
		xx := (*[32]float32)(x)
		var s0, s1, s2, s3 float32
		for j := 0; j < 32; j += 4 {
			s0 += float32(int8(b[2+j])) * xx[j]
			s1 += float32(int8(b[3+j])) * xx[j+1]
			s2 += float32(int8(b[4+j])) * xx[j+2]
			s3 += float32(int8(b[5+j])) * xx[j+3]
		}
		sum += half(b[0:]) * ((s0 + s1) + (s2 + s3))
		row, x = row[34:], x[32:]
	}
	return sum
}

// dotNib32 returns Σ (q[j]&15)·x[j] and Σ (q[j]>>4)·x[j+16] and Σ x over a
// 32-element block whose 16 bytes q hold element j in the low nibble and
// j+16 in the high one (Q4_0, Q4_1, and the low bits of Q5_0, Q5_1).
func dotNib32(q *[16]byte, x *[32]float32) (qx, sx float32) {
	var a0, a1, b0, b1, x0, x1 float32
	for j := 0; j < 16; j += 2 {
		q0, q1 := q[j], q[j+1]
		a0 += float32(q0&15) * x[j]
		a1 += float32(q1&15) * x[j+1]
		b0 += float32(q0>>4) * x[j+16]
		b1 += float32(q1>>4) * x[j+17]
		x0 += x[j] + x[j+16]
		x1 += x[j+1] + x[j+17]
	}
	return (a0 + a1) + (b0 + b1), x0 + x1
}

func dotQ4_0(row []byte, x []float32) float32 {
	var sum float32
	for len(x) >= 32 {
		b := (*[18]byte)(row)
		q := (*[16]byte)(b[2:])
		xx := (*[32]float32)(x)
		var a0, a1, b0, b1 float32
		for j := 0; j < 16; j += 2 {
			q0, q1 := int32(q[j]), int32(q[j+1])
			a0 += float32(q0&15-8) * xx[j]
			a1 += float32(q1&15-8) * xx[j+1]
			b0 += float32(q0>>4-8) * xx[j+16]
			b1 += float32(q1>>4-8) * xx[j+17]
		}
		sum += half(b[0:]) * ((a0 + a1) + (b0 + b1))
		row, x = row[18:], x[32:]
	}
	return sum
}

func dotQ4_1(row []byte, x []float32) float32 {
	var sum float32
	for len(x) >= 32 {
		b := (*[20]byte)(row)
		qx, sx := dotNib32((*[16]byte)(b[4:]), (*[32]float32)(x))
		sum += half(b[0:])*qx + half(b[2:])*sx
		row, x = row[20:], x[32:]
	}
	return sum
}

// dotNib5 returns Σ q·x and Σ x over a 32-element block of 5-bit quants:
// the low 4 bits as in dotNib32, the fifth bit of element j in bit j of
// qh (Q5_0, Q5_1).
func dotNib5(q *[16]byte, qh uint32, x *[32]float32) (qx, sx float32) {
	var a0, a1, b0, b1, x0, x1 float32
	hi := qh >> 16
	for j := 0; j < 16; j += 2 {
		q0, q1 := uint32(q[j]), uint32(q[j+1])
		a0 += float32(q0&15|(qh>>j&1)<<4) * x[j]
		a1 += float32(q1&15|(qh>>(j+1)&1)<<4) * x[j+1]
		b0 += float32(q0>>4|(hi>>j&1)<<4) * x[j+16]
		b1 += float32(q1>>4|(hi>>(j+1)&1)<<4) * x[j+17]
		x0 += x[j] + x[j+16]
		x1 += x[j+1] + x[j+17]
	}
	return (a0 + a1) + (b0 + b1), x0 + x1
}

func dotQ5_0(row []byte, x []float32) float32 {
	var sum float32
	for len(x) >= 32 {
		b := (*[22]byte)(row)
		qx, sx := dotNib5((*[16]byte)(b[6:]), binary.LittleEndian.Uint32(b[2:6]), (*[32]float32)(x))
		sum += half(b[0:]) * (qx - 16*sx)
		row, x = row[22:], x[32:]
	}
	return sum
}

func dotQ5_1(row []byte, x []float32) float32 {
	var sum float32
	for len(x) >= 32 {
		b := (*[24]byte)(row)
		qx, sx := dotNib5((*[16]byte)(b[8:]), binary.LittleEndian.Uint32(b[4:8]), (*[32]float32)(x))
		sum += half(b[0:])*qx + half(b[2:])*sx
		row, x = row[24:], x[32:]
	}
	return sum
}

// dotLoHi64 returns, for 32 bytes q over 64 elements (low nibbles the
// first 32, high nibbles the last 32), Σ lo·x[0:32], Σ hi·x[32:64],
// Σ x[0:32] and Σ x[32:64].
func dotLoHi64(q *[32]byte, x *[64]float32) (lo, hi, slo, shi float32) {
	var a0, a1, b0, b1, c0, c1, e0, e1 float32
	for l := 0; l < 32; l += 2 {
		q0, q1 := q[l], q[l+1]
		x0, x1, y0, y1 := x[l], x[l+1], x[l+32], x[l+33]
		a0 += float32(q0&15) * x0
		a1 += float32(q1&15) * x1
		b0 += float32(q0>>4) * y0
		b1 += float32(q1>>4) * y1
		c0 += x0
		c1 += x1
		e0 += y0
		e1 += y1
	}
	return a0 + a1, b0 + b1, c0 + c1, e0 + e1
}

func dotQ4_K(row []byte, x []float32) float32 {
	var sum float32
	for len(x) >= QK_K {
		b := (*[144]byte)(row)
		xx := (*[QK_K]float32)(x)
		d, dmin := half(b[0:]), half(b[2:])
		sc, mn := scalesK4((*[12]byte)(b[4:16]))
		var qs, ms float32
		for g := range 4 {
			lo, hi, slo, shi := dotLoHi64((*[32]byte)(b[16+32*g:]), (*[64]float32)(xx[64*g:]))
			qs += float32(sc[2*g])*lo + float32(sc[2*g+1])*hi
			ms += float32(mn[2*g])*slo + float32(mn[2*g+1])*shi
		}
		sum += d*qs - dmin*ms
		row, x = row[144:], x[QK_K:]
	}
	return sum
}

func dotQ5_K(row []byte, x []float32) float32 {
	var sum float32
	for len(x) >= QK_K {
		b := (*[176]byte)(row)
		xx := (*[QK_K]float32)(x)
		d, dmin := half(b[0:]), half(b[2:])
		sc, mn := scalesK4((*[12]byte)(b[4:16]))
		qh := (*[32]byte)(b[16:48])
		var qs, ms float32
		for g := range 4 {
			// Bit 2g of qh[l] is the fifth bit of element l (low nibble),
			// bit 2g+1 that of element l+32 (high nibble).
			q := (*[32]byte)(b[48+32*g:])
			x64 := (*[64]float32)(xx[64*g:])
			sh := uint(2 * g)
			var a0, a1, b0, b1, c0, c1, e0, e1 float32
			for l := 0; l < 32; l += 2 {
				q0, q1 := q[l], q[l+1]
				h0, h1 := qh[l]>>sh, qh[l+1]>>sh
				x0, x1, y0, y1 := x64[l], x64[l+1], x64[l+32], x64[l+33]
				a0 += float32(q0&15|(h0&1)<<4) * x0
				a1 += float32(q1&15|(h1&1)<<4) * x1
				b0 += float32(q0>>4|(h0&2)<<3) * y0
				b1 += float32(q1>>4|(h1&2)<<3) * y1
				c0 += x0
				c1 += x1
				e0 += y0
				e1 += y1
			}
			qs += float32(sc[2*g])*(a0+a1) + float32(sc[2*g+1])*(b0+b1)
			ms += float32(mn[2*g])*(c0+c1) + float32(mn[2*g+1])*(e0+e1)
		}
		sum += d*qs - dmin*ms
		row, x = row[176:], x[QK_K:]
	}
	return sum
}

func dotQ6_K(row []byte, x []float32) float32 {
	var sum float32
	for len(x) >= QK_K {
		b := (*[210]byte)(row)
		xx := (*[QK_K]float32)(x)
		var acc float32
		for n := range 2 {
			ql := (*[64]byte)(b[64*n:])
			qh := (*[32]byte)(b[128+32*n:])
			sc := (*[8]byte)(b[192+8*n:])
			xn := (*[128]float32)(xx[128*n:])
			for is := range 2 {
				var s1, s2, s3, s4 float32
				for l := 16 * is; l < 16*is+16; l++ {
					h := qh[l]
					s1 += float32(int32(ql[l]&0xf|(h&3)<<4)-32) * xn[l]
					s2 += float32(int32(ql[l+32]&0xf|((h>>2)&3)<<4)-32) * xn[l+32]
					s3 += float32(int32(ql[l]>>4|((h>>4)&3)<<4)-32) * xn[l+64]
					s4 += float32(int32(ql[l+32]>>4|(h>>6)<<4)-32) * xn[l+96]
				}
				acc += float32(int8(sc[is]))*s1 + float32(int8(sc[is+2]))*s2 +
					float32(int8(sc[is+4]))*s3 + float32(int8(sc[is+6]))*s4
			}
		}
		sum += half(b[208:]) * acc
		row, x = row[210:], x[QK_K:]
	}
	return sum
}
