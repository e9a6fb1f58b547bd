package quant

import (
	"encoding/binary"
	"math"
)

// The dequantizers below are ggml's dequantize_row_* (ggml-quants.c) bit
// for bit: the same products in the same order, each rounded to float32
// (the explicit float32 conversions keep the compiler from fusing a
// multiply and an add). Each takes exactly one row: len(src) is the
// row's byte size for len(dst) elements, checked by the caller.

func dequantF32(src []byte, dst []float32) {
	if s, ok := f32View(src); ok {
		copy(dst, s)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func dequantF16(src []byte, dst []float32) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = f16Table[uint16(src[2*i])|uint16(src[2*i+1])<<8]
	}
}

func dequantBF16(src []byte, dst []float32) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits((uint32(src[2*i]) | uint32(src[2*i+1])<<8) << 16)
	}
}

// block_q8_0: d f16, qs [32]int8.
func dequantQ8_0(src []byte, dst []float32) {
	for len(dst) >= 32 {
		b := (*[34]byte)(src)
		y := (*[32]float32)(dst)
		d := half(b[0:])
		for j := 0; j < 32; j += 4 {
			y[j] = float32(int8(b[2+j])) * d
			y[j+1] = float32(int8(b[3+j])) * d
			y[j+2] = float32(int8(b[4+j])) * d
			y[j+3] = float32(int8(b[5+j])) * d
		}
		src, dst = src[34:], dst[32:]
	}
}

// block_q4_0: d f16, qs [16] (element j low nibble, j+16 high), value
// (q−8)·d.
func dequantQ4_0(src []byte, dst []float32) {
	for len(dst) >= 32 {
		b := (*[18]byte)(src)
		y := (*[32]float32)(dst)
		d := half(b[0:])
		for j := range 16 {
			q := b[2+j]
			y[j] = float32(int32(q&15)-8) * d
			y[j+16] = float32(int32(q>>4)-8) * d
		}
		src, dst = src[18:], dst[32:]
	}
}

// block_q4_1: d f16, m f16, qs [16], value q·d + m.
func dequantQ4_1(src []byte, dst []float32) {
	for len(dst) >= 32 {
		b := (*[20]byte)(src)
		y := (*[32]float32)(dst)
		d, m := half(b[0:]), half(b[2:])
		for j := range 16 {
			q := b[4+j]
			y[j] = float32(float32(q&15)*d) + m
			y[j+16] = float32(float32(q>>4)*d) + m
		}
		src, dst = src[20:], dst[32:]
	}
}

// block_q5_0: d f16, qh uint32 (bit j: 5th bit of element j), qs [16],
// value (q−16)·d.
func dequantQ5_0(src []byte, dst []float32) {
	for len(dst) >= 32 {
		b := (*[22]byte)(src)
		y := (*[32]float32)(dst)
		d := half(b[0:])
		qh := binary.LittleEndian.Uint32(b[2:6])
		for j := range 16 {
			q := b[6+j]
			h0 := byte(qh>>j<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			y[j] = float32(int32(q&15|h0)-16) * d
			y[j+16] = float32(int32(q>>4|h1)-16) * d
		}
		src, dst = src[22:], dst[32:]
	}
}

// block_q5_1: d f16, m f16, qh uint32, qs [16], value q·d + m.
func dequantQ5_1(src []byte, dst []float32) {
	for len(dst) >= 32 {
		b := (*[24]byte)(src)
		y := (*[32]float32)(dst)
		d, m := half(b[0:]), half(b[2:])
		qh := binary.LittleEndian.Uint32(b[4:8])
		for j := range 16 {
			q := b[8+j]
			h0 := byte(qh>>j<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			y[j] = float32(float32(q&15|h0)*d) + m
			y[j+16] = float32(float32(q>>4|h1)*d) + m
		}
		src, dst = src[24:], dst[32:]
	}
}

// scaleMinK4 is ggml's get_scale_min_k4: the 6-bit scale and min of
// sub-block j (0..7) from the 12 packed bytes of a Q4_K/Q5_K block.
func scaleMinK4(j int, q *[12]byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// scalesK4 unpacks all eight (scale, min) pairs of a Q4_K/Q5_K block.
func scalesK4(q *[12]byte) (sc, m [8]uint8) {
	for j := range 4 {
		sc[j] = q[j] & 63
		m[j] = q[j+4] & 63
		sc[j+4] = q[j+8]&0xf | (q[j]>>6)<<4
		m[j+4] = q[j+8]>>4 | (q[j+4]>>6)<<4
	}
	return sc, m
}

// block_q4_K (144 bytes): d f16, dmin f16, scales [12] (8 six-bit scales
// and mins), qs [128]: 4 groups of 64 elements, each 32 bytes whose low
// nibbles are sub-block 2g and high nibbles sub-block 2g+1; value
// d·sc·q − dmin·m.
func dequantQ4_K(src []byte, dst []float32) {
	for len(dst) >= QK_K {
		b := (*[144]byte)(src)
		y := (*[QK_K]float32)(dst)
		d, dmin := half(b[0:]), half(b[2:])
		sc, mn := scalesK4((*[12]byte)(b[4:16]))
		for g := range 4 {
			d1, m1 := d*float32(sc[2*g]), dmin*float32(mn[2*g])
			d2, m2 := d*float32(sc[2*g+1]), dmin*float32(mn[2*g+1])
			q := (*[32]byte)(b[16+32*g:])
			y1 := (*[32]float32)(y[64*g:])
			y2 := (*[32]float32)(y[64*g+32:])
			for l := range 32 {
				y1[l] = float32(d1*float32(q[l]&0xf)) - m1
				y2[l] = float32(d2*float32(q[l]>>4)) - m2
			}
		}
		src, dst = src[144:], dst[QK_K:]
	}
}

// block_q5_K (176 bytes): d, dmin, scales [12], qh [32], qs [128]: as
// Q4_K with a fifth bit per element, bit 2g (low nibbles) or 2g+1 (high
// nibbles) of qh[l].
func dequantQ5_K(src []byte, dst []float32) {
	for len(dst) >= QK_K {
		b := (*[176]byte)(src)
		y := (*[QK_K]float32)(dst)
		d, dmin := half(b[0:]), half(b[2:])
		sc, mn := scalesK4((*[12]byte)(b[4:16]))
		qh := (*[32]byte)(b[16:48])
		for g := range 4 {
			d1, m1 := d*float32(sc[2*g]), dmin*float32(mn[2*g])
			d2, m2 := d*float32(sc[2*g+1]), dmin*float32(mn[2*g+1])
			q := (*[32]byte)(b[48+32*g:])
			y1 := (*[32]float32)(y[64*g:])
			y2 := (*[32]float32)(y[64*g+32:])
			for l := range 32 {
				h := qh[l] >> (2 * g)
				y1[l] = float32(d1*float32(q[l]&0xf|(h&1)<<4)) - m1
				y2[l] = float32(d2*float32(q[l]>>4|(h&2)<<3)) - m2
			}
		}
		src, dst = src[176:], dst[QK_K:]
	}
}

// block_q6_K (210 bytes): ql [128] (low 4 bits), qh [64] (high 2 bits),
// scales [16]int8, d f16. Two halves of 128 elements; in half n, for
// l < 32, ql[64n+l] holds elements l (low nibble) and l+64 (high),
// ql[64n+l+32] elements l+32 and l+96, and qh[32n+l] their high bits in
// bit pairs 0, 2, 4, 6 (for l, l+32, l+64, l+96); value
// d·scales[e/16]·(q−32).
func dequantQ6_K(src []byte, dst []float32) {
	for len(dst) >= QK_K {
		b := (*[210]byte)(src)
		y := (*[QK_K]float32)(dst)
		d := half(b[208:])
		for n := range 2 {
			ql := (*[64]byte)(b[64*n:])
			qh := (*[32]byte)(b[128+32*n:])
			sc := (*[8]byte)(b[192+8*n:])
			yy := (*[128]float32)(y[128*n:])
			for l := range 32 {
				is := l / 16
				h := qh[l]
				q1 := int32(ql[l]&0xf|(h&3)<<4) - 32
				q2 := int32(ql[l+32]&0xf|((h>>2)&3)<<4) - 32
				q3 := int32(ql[l]>>4|((h>>4)&3)<<4) - 32
				q4 := int32(ql[l+32]>>4|(h>>6)<<4) - 32
				yy[l] = float32(d*float32(int8(sc[is]))) * float32(q1)
				yy[l+32] = float32(d*float32(int8(sc[is+2]))) * float32(q2)
				yy[l+64] = float32(d*float32(int8(sc[is+4]))) * float32(q3)
				yy[l+96] = float32(d*float32(int8(sc[is+6]))) * float32(q4)
			}
		}
		src, dst = src[210:], dst[QK_K:]
	}
}
