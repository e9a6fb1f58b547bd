package quant

import "math"

// f16Table maps every IEEE binary16 bit pattern to its float32 value: the
// pure-Go kernels decode halves with one load (256 KiB, built at start-up).
var f16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for h := range t {
		t[h] = math.Float32frombits(f16Bits(uint16(h)))
	}
	return &t
}()

// f16Bits is the float32 bit pattern of the IEEE half h (exact: every half
// is a float32; a NaN stays a NaN with its payload and the quiet bit set,
// as x86's F16C and ggml's software conversion give).
func f16Bits(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch exp {
	case 0:
		if man == 0 {
			return sign
		}
		// Subnormal: man·2^-24. Normalise so that bit 10 is the hidden bit.
		e := uint32(127 - 15 + 1)
		for man&0x400 == 0 {
			man <<= 1
			e--
		}
		return sign | e<<23 | (man&0x3ff)<<13
	case 0x1f:
		if man == 0 {
			return sign | 0x7f800000
		}
		return sign | 0x7fc00000 | man<<13
	}
	return sign | (exp+127-15)<<23 | man<<13
}

// F16ToF32 converts the IEEE binary16 bit pattern h to float32 (exact;
// infinities and signed zeros are kept, a NaN stays a quiet NaN).
func F16ToF32(h uint16) float32 { return f16Table[h] }

// F32ToF16 converts f to the nearest IEEE binary16 (round to nearest, ties
// to even; overflow gives ±Inf, tiny values round to subnormals or ±0, a
// NaN becomes the quiet NaN 0x7E00 with f's sign). It is ggml's
// ggml_compute_fp32_to_fp16 bit for bit (the same as x86's VCVTPS2PH with
// round-to-nearest).
func F32ToF16(f float32) uint16 {
	const scaleToInf = 0x1.0p+112
	const scaleToZero = 0x1.0p-110
	abs := math.Float32frombits(math.Float32bits(f) &^ 0x80000000)
	base := float32(abs*scaleToInf) * scaleToZero

	w := math.Float32bits(f)
	shl1 := w + w
	sign := w & 0x80000000
	bias := shl1 & 0xff000000
	if bias < 0x71000000 {
		bias = 0x71000000
	}
	base = math.Float32frombits((bias>>1)+0x07800000) + base
	bits := math.Float32bits(base)
	nonsign := (bits>>13)&0x7c00 + bits&0x0fff
	if shl1 > 0xff000000 {
		nonsign = 0x7e00
	}
	return uint16(sign>>16 | nonsign)
}

// BF16ToF32 converts the bfloat16 bit pattern h to float32: ggml's plain
// 16-bit shift (exact for every pattern, NaNs included).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 converts f to bfloat16 rounding to nearest, ties to even, as
// ggml's ggml_compute_fp32_to_bf16: a NaN is truncated and forced quiet,
// subnormals are kept, overflow rounds to ±Inf.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 64
	}
	return uint16((u + (0x7fff + (u>>16)&1)) >> 16)
}

// le16 reads a little-endian uint16 at b[0:2].
func le16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }

// half reads the little-endian IEEE half at b[0:2] as float32.
func half(b []byte) float32 { return f16Table[uint16(b[0])|uint16(b[1])<<8] }

// roundF16Chunk is how many floats the assembly of RoundF16 converts per
// kernel call (their halves in a stack buffer of twice as many bytes).
const roundF16Chunk = 512

// RoundF16 replaces every x[i] by F16ToF32(F32ToF16(x[i])) — its nearest
// half (ties to even, beyond ±65504 ±Inf), as a float32: what llama.cpp's
// CPU kernels multiply F16 weights with (a NaN stays a NaN, its payload
// as the CPU converts it). Where the CPU has F16C (package simd's AVX2 and
// AVX-512 levels) the elements go through VCVTPS2PH and VCVTPH2PS a chunk
// at a time (0.06 ns an element on an AMD EPYC at AVX-512, against 2.6 for
// the two conversions in Go: BenchmarkRoundF16), the tail in Go. Safe for
// concurrent use on distinct x; does not allocate.
func RoundF16(x []float32) {
	for i := roundF16Asm(x); i < len(x); i++ {
		x[i] = F16ToF32(F32ToF16(x[i]))
	}
}
