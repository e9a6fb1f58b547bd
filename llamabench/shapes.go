package llamabench

import (
	"fmt"
	"strings"

	"github.com/cacheblend/cacheblend/quant"
)

// Shape is a model shape: the hyperparameters of a released model, filled
// with random weights by [Generate].
type Shape struct {
	Name      string  // e.g. "llama-3.2-1b"
	Arch      string  // "llama" or "qwen2"
	Dim       int     // embedding width
	Layers    int     // transformer blocks
	Heads     int     // query heads
	KVHeads   int     // key/value heads
	FFN       int     // feed-forward width
	Vocab     string  // llama.cpp vocabulary file (models/ggml-vocab-<Vocab>.gguf)
	Tied      bool    // the LM head is the embedding
	Theta     float64 // RoPE base
	RopeFreqs bool    // Llama 3.1+ frequency factors
}

// Shapes returns the shapes the benchmark knows, smallest first: the
// published configurations of SmolLM2-135M and -360M, Qwen2.5-0.5B and
// Llama-3.2-1B (each with its real vocabulary; SmolLM2's 49,152-token BPE
// vocabulary is StarCoder's size and kind).
func Shapes() []Shape {
	return []Shape{
		{Name: "smollm2-135m", Arch: "llama", Dim: 576, Layers: 30, Heads: 9, KVHeads: 3, FFN: 1536, Vocab: "starcoder", Tied: true, Theta: 100000},
		{Name: "smollm2-360m", Arch: "llama", Dim: 960, Layers: 32, Heads: 15, KVHeads: 5, FFN: 2560, Vocab: "starcoder", Tied: true, Theta: 100000},
		{Name: "qwen2.5-0.5b", Arch: "qwen2", Dim: 896, Layers: 24, Heads: 14, KVHeads: 2, FFN: 4864, Vocab: "qwen2", Tied: true, Theta: 1000000},
		{Name: "llama-3.2-1b", Arch: "llama", Dim: 2048, Layers: 16, Heads: 32, KVHeads: 8, FFN: 8192, Vocab: "llama-bpe", Tied: true, Theta: 500000, RopeFreqs: true},
	}
}

// ShapeByName returns the shape called name.
func ShapeByName(name string) (Shape, error) {
	var names []string
	for _, s := range Shapes() {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Shape{}, fmt.Errorf("llamabench: unknown shape %q (known: %s)", name, strings.Join(names, ", "))
}

// Formats are the file formats the benchmark writes: "f16", "q8_0" and
// "q4_k_m" (and "f32", not in the default set).
func Formats() []string { return []string{"f16", "q8_0", "q4_k_m"} }

// TensorType is the type llama-quantize gives the 2-D weight name (in
// elements per row) in a file of format (llama.cpp's llama_tensor_get_type
// for the "mostly" file types without an importance matrix): every weight at
// the format's type (layers is the model's block count, tied says the
// embedding is the LM head), except for Q4_K_M, where the LM head (output.weight,
// or token_embd.weight when tied) is Q6_K, and attn_v and ffn_down are Q6_K
// in the first and last eighth of the layers and every third layer between
// (use_more_bits). Rows that are not a multiple of 256 elements cannot hold
// K-quant blocks: Q4_K falls back to Q5_0 and Q6_K to Q8_0, as llama.cpp
// does (so every 896-wide matrix of Qwen2.5-0.5B is Q5_0 or Q8_0).
func TensorType(format, name string, in, layers int, tied bool) (quant.Type, error) {
	switch format {
	case "f32":
		return quant.F32, nil
	case "f16":
		return quant.F16, nil
	case "q8_0":
		return quant.Q8_0, nil
	case "q4_k_m":
	default:
		return 0, fmt.Errorf("llamabench: unknown format %q (known: f32, %s)", format, strings.Join(Formats(), ", "))
	}
	t := quant.Q4_K
	layer := -1
	var rest string
	if _, err := fmt.Sscanf(name, "blk.%d.%s", &layer, &rest); err != nil {
		layer = -1
	}
	moreBits := func(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }
	switch {
	case name == "output.weight":
		t = quant.Q6_K
	case name == "token_embd.weight" && tied: // the embedding is the LM head
		t = quant.Q6_K
	case layer >= 0 && (strings.HasPrefix(rest, "attn_v.") || strings.HasPrefix(rest, "ffn_down.")) && moreBits(layer, layers):
		t = quant.Q6_K
	}
	if in%256 != 0 {
		switch t {
		case quant.Q4_K:
			t = quant.Q5_0
		case quant.Q6_K:
			t = quant.Q8_0
		}
	}
	return t, nil
}
