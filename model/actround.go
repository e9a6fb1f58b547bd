package model

import (
	"math"

	"github.com/cacheblend/cacheblend/quant"
)

// llama.cpp's CPU kernels never multiply a quantized weight by float32
// activations: each weight type has a "vec_dot type" the activations are
// converted to first (ggml-cpu's type_traits_cpu): F16 weights meet F16
// activations, BF16 meet BF16, the 32-element block types (Q4_0 … Q8_0)
// meet Q8_0 (an fp16 scale and 32 int8 per block), the K-quants meet Q8_K
// (a float32 scale and 256 int8 per block). The model does the same
// rounding (roundActivations) before its own dequantize-and-multiply, so
// that it computes what llama.cpp computes on the same file, not a more
// precise product that drifts from it: BF16 activations alone move
// log-probabilities by about 0.1.

// actRound is how activations are rounded before a product with a weight
// of some type.
type actRound int

const (
	roundNone actRound = iota
	roundF16
	roundBF16
	roundQ8_0
	roundQ8_K
)

// activationRounding is the rounding llama.cpp applies to the activations
// multiplied by a weight of type t.
func activationRounding(t quant.Type) actRound {
	switch t {
	case quant.F16:
		return roundF16
	case quant.BF16:
		return roundBF16
	case quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q8_0:
		return roundQ8_0
	case quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K:
		return roundQ8_K
	}
	return roundNone
}

// roundRow rounds x in place as r says.
func roundRow(r actRound, x []float32) {
	switch r {
	case roundF16:
		for i, v := range x {
			x[i] = quant.F16ToF32(quant.F32ToF16(v))
		}
	case roundBF16:
		for i, v := range x {
			x[i] = quant.BF16ToF32(quant.F32ToBF16(v))
		}
	case roundQ8_0:
		for b := 0; b+32 <= len(x); b += 32 {
			roundQ80(x[b : b+32])
		}
	case roundQ8_K:
		for b := 0; b+quant.QK_K <= len(x); b += quant.QK_K {
			roundQ8K(x[b : b+quant.QK_K])
		}
	}
}

// roundQ80 is ggml-cpu's x86 quantize_row_q8_0 and back: scale amax/127
// stored as fp16, values x·127/amax rounded to nearest even.
func roundQ80(x []float32) {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	dh := quant.F16ToF32(quant.F32ToF16(amax / 127))
	for i, v := range x {
		x[i] = dh * float32(math.RoundToEven(float64(v*id)))
	}
}

// roundQ8K is ggml's quantize_row_q8_K and back: the scale is -127/(the
// value of largest magnitude), values rounded to nearest even, capped at
// 127.
func roundQ8K(x []float32) {
	var amax, mx float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, mx = a, v
		}
	}
	if amax == 0 {
		clear(x)
		return
	}
	iscale := -127 / mx
	d := 1 / iscale
	for i, v := range x {
		q := min(127, float32(math.RoundToEven(float64(iscale*v))))
		x[i] = d * q
	}
}
