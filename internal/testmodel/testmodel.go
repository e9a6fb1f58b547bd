package testmodel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/quant"
)

// Spec describes a test model. Zero fields take the defaults in brackets.
type Spec struct {
	Arch      string     // "llama" or "qwen2" [llama]
	Name      string     // general.name [testmodel-<arch>]
	Layers    int        // [2]
	Dim       int        // [64]
	Heads     int        // [4]
	KVHeads   int        // [2]
	FFNDim    int        // [128]
	CtxLen    int        // [4096]
	Type      quant.Type // the type of the 2-D weights [F32]; norms stay F32
	EmbedType quant.Type // token_embd's type [Type]
	OutType   quant.Type // output.weight's type [Type]
	Tied      bool       // no output.weight: the LM head is the embedding
	RopeFreqs bool       // write rope_freqs.weight (Llama 3.1 style factors)
	Theta     float64    // rope.freq_base [10000]
	Seed      uint64     // [1]
	// VocabFile is a GGUF file whose tokenizer.* keys are copied (a
	// llama.cpp ggml-vocab-*.gguf). Required.
	VocabFile string
	// Template, when set, is written as tokenizer.chat_template.
	Template string
	// MixContext makes CacheBlend wrong by construction: every layer's
	// queries are zero (each token attends uniformly over all tokens before
	// it) and the attention's output dominates the residual stream, so a
	// token's KV above the first layer is an average of everything before
	// it, and a document's KV computed alone is not its KV in a prompt.
	MixContext bool
	// TensorType, when set, chooses the type of each 2-D weight (a
	// llama-quantize mixture such as Q4_K_M): it gets the tensor's name, its
	// row length and row count, and returns 0 to keep the type Type,
	// EmbedType or OutType would give.
	TensorType func(name string, in, out int) quant.Type
}

func (s Spec) withDefaults() Spec {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if s.Arch == "" {
		s.Arch = "llama"
	}
	if s.Name == "" {
		s.Name = "testmodel-" + s.Arch
	}
	def(&s.Layers, 2)
	def(&s.Dim, 64)
	def(&s.Heads, 4)
	def(&s.KVHeads, 2)
	def(&s.FFNDim, 128)
	def(&s.CtxLen, 4096)
	if s.EmbedType == 0 && s.Type != 0 {
		s.EmbedType = s.Type
	}
	if s.OutType == 0 && s.Type != 0 {
		s.OutType = s.Type
	}
	if s.Theta == 0 {
		s.Theta = 10000
	}
	if s.Seed == 0 {
		s.Seed = 1
	}
	return s
}

// Encode returns the model file of s.
func Encode(s Spec) ([]byte, error) {
	s = s.withDefaults()
	vf, err := gguf.Open(s.VocabFile)
	if err != nil {
		return nil, fmt.Errorf("testmodel: vocabulary: %w", err)
	}
	defer vf.Close()
	toks, err := vf.Strings("tokenizer.ggml.tokens")
	if err != nil {
		return nil, fmt.Errorf("testmodel: vocabulary: %w", err)
	}
	vocab := len(toks)
	a := s.Arch
	kv := []gguf.KV{
		{Key: "general.architecture", Value: a},
		{Key: "general.name", Value: s.Name},
		{Key: a + ".context_length", Value: uint32(s.CtxLen)},
		{Key: a + ".embedding_length", Value: uint32(s.Dim)},
		{Key: a + ".block_count", Value: uint32(s.Layers)},
		{Key: a + ".feed_forward_length", Value: uint32(s.FFNDim)},
		{Key: a + ".attention.head_count", Value: uint32(s.Heads)},
		{Key: a + ".attention.head_count_kv", Value: uint32(s.KVHeads)},
		{Key: a + ".rope.freq_base", Value: float32(s.Theta)},
		{Key: a + ".attention.layer_norm_rms_epsilon", Value: float32(1e-6)},
		{Key: a + ".rope.dimension_count", Value: uint32(s.Dim / s.Heads)},
	}
	for _, e := range vf.KV {
		if strings.HasPrefix(e.Key, "tokenizer.") && e.Key != "tokenizer.chat_template" {
			kv = append(kv, e)
		}
	}
	if s.Template != "" {
		kv = append(kv, gguf.KV{Key: "tokenizer.chat_template", Value: s.Template})
	}

	rng := rand.New(rand.NewPCG(s.Seed, s.Seed^0xC0FFEE))
	var tensors []gguf.WriteTensor
	var werr error
	add := func(name string, t quant.Type, w []float32, dims ...uint64) {
		if werr != nil {
			return
		}
		if s.TensorType != nil && len(dims) == 2 {
			if tt := s.TensorType(name, int(dims[0]), int(dims[1])); tt != 0 {
				t = tt
			}
		}
		if t == 0 {
			t = quant.F32
		}
		n, err := t.RowBytes(int(dims[0]))
		if err != nil {
			werr = fmt.Errorf("testmodel: %s: %w", name, err)
			return
		}
		rows := len(w) / int(dims[0])
		b := make([]byte, n*rows)
		if err := quant.Quantize(t, w, b); err != nil {
			werr = fmt.Errorf("testmodel: %s: %w", name, err)
			return
		}
		tensors = append(tensors, gguf.WriteTensor{Name: name, Dims: dims, Type: t, Data: b})
	}
	normal := func(n int, std float64) []float32 {
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(rng.NormFloat64() * std)
		}
		return w
	}
	gains := func(n int) []float32 {
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(1 + 0.1*rng.NormFloat64())
		}
		return w
	}
	d, hd := s.Dim, s.Dim/s.Heads
	qd, kvd := s.Heads*hd, s.KVHeads*hd
	du, qu, fu, vu := uint64(d), uint64(qd), uint64(s.FFNDim), uint64(vocab)
	inStd := 1 / math.Sqrt(float64(d))
	resid := 1 / math.Sqrt(2*float64(s.Layers))
	// Embeddings of unit RMS per element: the token's identity dominates the
	// residual stream, the context perturbs it.
	add("token_embd.weight", s.EmbedType, normal(vocab*d, 1), du, vu)
	if s.RopeFreqs {
		f := make([]float32, hd/2)
		for i := range f {
			f[i] = float32(1 + 3*float64(i)/float64(hd/2)) // low frequencies slowed, as Llama 3.1's factors do
		}
		add("rope_freqs.weight", quant.F32, f, uint64(hd/2))
	}
	qStd, outStd := 2*inStd, 2*resid/math.Sqrt(float64(qd))
	if s.MixContext {
		qStd, outStd = 0, 8/math.Sqrt(float64(qd))
	}
	for l := range s.Layers {
		p := func(x string) string { return fmt.Sprintf("blk.%d.%s", l, x) }
		add(p("attn_norm.weight"), quant.F32, gains(d), du)
		add(p("attn_q.weight"), s.Type, normal(qd*d, qStd), du, qu)
		add(p("attn_k.weight"), s.Type, normal(kvd*d, 2*inStd), du, uint64(kvd))
		add(p("attn_v.weight"), s.Type, normal(kvd*d, inStd), du, uint64(kvd))
		if a == "qwen2" {
			add(p("attn_q.bias"), quant.F32, normal(qd, 0.5), qu)
			add(p("attn_k.bias"), quant.F32, normal(kvd, 0.5), uint64(kvd))
			add(p("attn_v.bias"), quant.F32, normal(kvd, 0.1), uint64(kvd))
		}
		add(p("attn_output.weight"), s.Type, normal(d*qd, outStd), qu, du)
		add(p("ffn_norm.weight"), quant.F32, gains(d), du)
		add(p("ffn_gate.weight"), s.Type, normal(s.FFNDim*d, inStd), du, fu)
		add(p("ffn_up.weight"), s.Type, normal(s.FFNDim*d, inStd), du, fu)
		add(p("ffn_down.weight"), s.Type, normal(d*s.FFNDim, 2*resid/math.Sqrt(float64(s.FFNDim))), fu, du)
	}
	add("output_norm.weight", quant.F32, gains(d), du)
	if !s.Tied {
		// Logits of standard deviation about 7: a peaked distribution (the
		// top token takes about half the probability, as a trained
		// model's often does).
		add("output.weight", s.OutType, normal(vocab*d, 7*inStd), du, vu)
	}
	if werr != nil {
		return nil, werr
	}
	return gguf.Encode(kv, tensors)
}

// Write writes the model file of s to path.
func Write(path string, s Spec) error {
	b, err := Encode(s)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
