package model

import (
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
		quant.RoundF16(x)
	case roundBF16:
		for i, v := range x {
			x[i] = quant.BF16ToF32(quant.F32ToBF16(v))
		}
	case roundQ8_0:
		quant.RoundQ8_0(x)
	case roundQ8_K:
		quant.RoundQ8K(x)
	}
}
