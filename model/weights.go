package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/quant"
	"github.com/cacheblend/cacheblend/rope"
)

// layerWeights holds one transformer layer. Every matrix is the transposed
// right operand of its product (rows = outputs, cols = inputs, as a GGUF
// file stores it): F32 ones copied and packed for simd's GEMM, other types
// computed from the file (qmat).
type layerWeights struct {
	attnNorm []float32 // [Dim]
	qkv      mat       // [(Heads+2·KVHeads)·HeadDim × Dim]: Q | K | V rows
	qkvBias  []float32 // [(Heads+2·KVHeads)·HeadDim] or nil
	wo       mat       // [Dim × Heads·HeadDim]
	mlpNorm  []float32 // [Dim]
	gu       mat       // [2·FFNDim × Dim]: gate | up rows, in halves when split
	down     mat       // [Dim × FFNDim]
	// split, when positive, is where a prefill chunk's MLP is cut in two
	// (FFNDim columns [0, split) and [split, FFNDim)): gu's rows are then
	// gate[:split] | up[:split] | gate[split:] | up[split:], so each half is
	// a contiguous view of gu, and downHalf holds down's two column ranges.
	split    int
	downHalf [2]mat
}

// guRanges returns the rows of lw.gu holding gate rows [f0, f1) followed by
// those holding up rows [f0, f1) (FFNDim ffn).
func (lw *layerWeights) guRanges(f0, f1, ffn int) [][2]int {
	s := lw.split
	if s <= 0 {
		return [][2]int{{f0, f1}, {ffn + f0, ffn + f1}}
	}
	// gate row j sits at j (j < s) or s + j (j ≥ s); up row j at s + j or
	// ffn + j.
	var gate, up [][2]int
	if f0 < s {
		e := min(f1, s)
		gate, up = append(gate, [2]int{f0, e}), append(up, [2]int{s + f0, s + e})
	}
	if f1 > s {
		b := max(f0, s)
		gate, up = append(gate, [2]int{s + b, s + f1}), append(up, [2]int{ffn + b, ffn + f1})
	}
	return append(gate, up...)
}

// Model is a Llama-architecture decoder: the built-in model (New, weights
// generated from Config.Seed) or a model file (Load). Weights are immutable
// after construction, so a Model is safe for concurrent use as long as
// concurrent calls write disjoint KV slots (each call spreads its own
// kernels over at most Config.Threads goroutines and waits for them before
// returning; a Model owns no background goroutines and needs no Close — a
// loaded model's file must stay open while it is used).
type Model struct {
	cfg     Config
	headDim int
	qDim    int // Heads·HeadDim
	kvDim   int // KVHeads·HeadDim
	qkvDim  int
	group   int // query heads per KV head

	embed     mat // [Vocab × Dim] token embeddings
	output    mat // [Vocab × Dim] LM head (the embedding when tied)
	layers    []layerWeights
	finalNorm []float32

	rope *rope.RoPE

	file *gguf.File // the file the weights come from (nil: none kept)

	// free keeps up to maxFreeWS workspaces between forward calls. Not a
	// sync.Pool: a GC would drop the buffers (tens of MiB for a long
	// prompt) and the next call would fault and zero them all again.
	free chan *workspace
	team *team // runs the parallel loops on cfg.Threads goroutines

	tp *shard // tensor-parallel slice (NewShard); nil: the whole model
}

// New builds the built-in model for cfg (zero fields take their defaults):
// its weights are generated deterministically from cfg.Seed with
// math/rand/v2's PCG, written as a llama GGUF file in memory (BuiltinGGUF)
// and loaded by Load, the same path as a model file.
func New(cfg Config) (*Model, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	data, err := BuiltinGGUF(cfg)
	if err != nil {
		return nil, err
	}
	f, err := gguf.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("model: the built-in model's file: %w", err)
	}
	return Load(f, cfg)
}

// BuiltinArch is general.name of the built-in model's file, and the value of
// its cacheblend.tokenizer key is BuiltinTokenizer: the byte tokenizer of
// package tokenizer (the file has no tokenizer.ggml.* keys).
const (
	BuiltinName      = "cacheblend-builtin"
	BuiltinTokenizer = "bytes"
)

// BuiltinGGUF writes the built-in model of cfg (defaults filled in) as a
// GGUF file of architecture llama with F32 tensors. The initialisation is
// scaled (1/√fan_in for input projections, an extra 1/√(2·Layers) on the
// projections that feed the residual stream) so that activations stay
// finite at every position below MaxPositions, and the untied LM head is
// scaled so the next-token distribution is peaked and depends on the prompt,
// like a trained model's (see TestBuiltinNotDegenerate).
func BuiltinGGUF(cfg Config) ([]byte, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hd := cfg.Dim / cfg.Heads
	qDim, kvDim := cfg.Heads*hd, cfg.KVHeads*hd
	qkvDim := qDim + 2*kvDim
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9E3779B97F4A7C15))
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
	// transpose turns a row-major [in × out] matrix into out rows of in.
	transpose := func(w []float32, in, out int) []float32 {
		t := make([]float32, in*out)
		for i := range in {
			for j := range out {
				t[j*in+i] = w[i*out+j]
			}
		}
		return t
	}
	d := cfg.Dim
	var tensors []gguf.WriteTensor
	add := func(name string, w []float32, dims ...uint64) {
		b := make([]byte, 4*len(w))
		for i, v := range w {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		tensors = append(tensors, gguf.WriteTensor{Name: name, Dims: dims, Type: quant.F32, Data: b})
	}
	resid := 1 / math.Sqrt(2*float64(cfg.Layers))
	embed := normal(cfg.Vocab*d, 2.5/math.Sqrt(float64(d)))
	// On input the embedding is scaled by √Dim/2 (as Gemma scales by √Dim):
	// the token's own identity then dominates the residual stream and the
	// context is a perturbation, as in a trained model, so K/V computed
	// without the preceding context are close to (not equal to) the
	// in-context ones — the regime CacheBlend repairs.
	scale := float32(math.Sqrt(float64(d)) / 2)
	in := make([]float32, len(embed))
	for i, v := range embed {
		in[i] = v * scale
	}
	add("token_embd.weight", in, uint64(d), uint64(cfg.Vocab))
	for l := range cfg.Layers {
		p := func(s string) string { return fmt.Sprintf("blk.%d.%s", l, s) }
		add(p("attn_norm.weight"), gains(d), uint64(d))
		// Q and K get a larger scale than 1/√Dim so that attention is
		// peaked enough to depend on context (which CacheBlend must repair).
		qk := normal(d*qkvDim, 1/math.Sqrt(float64(d)))
		for i := range d {
			row := qk[i*qkvDim : (i+1)*qkvDim]
			for j := range qDim + kvDim {
				row[j] *= 1.5
			}
		}
		rows := transpose(qk, d, qkvDim) // qkvDim rows of d
		rowsOf := func(r0, r1 int) [][]float32 {
			out := make([][]float32, 0, r1-r0)
			for r := r0; r < r1; r++ {
				out = append(out, rows[r*d:(r+1)*d])
			}
			return out
		}
		flat := func(rs [][]float32) []float32 {
			out := make([]float32, 0, len(rs)*d)
			for _, r := range rs {
				out = append(out, r...)
			}
			return out
		}
		// Written as the llama converter writes Q and K (permuted rows).
		add(p("attn_q.weight"), flat(permuteRows(rowsOf(0, qDim), cfg.Heads, hd)), uint64(d), uint64(qDim))
		add(p("attn_k.weight"), flat(permuteRows(rowsOf(qDim, qDim+kvDim), cfg.KVHeads, hd)), uint64(d), uint64(kvDim))
		add(p("attn_v.weight"), flat(rowsOf(qDim+kvDim, qkvDim)), uint64(d), uint64(kvDim))
		wo := normal(qDim*d, resid/math.Sqrt(float64(qDim)))
		add(p("attn_output.weight"), transpose(wo, qDim, d), uint64(qDim), uint64(d))
		add(p("ffn_norm.weight"), gains(d), uint64(d))
		gu := transpose(normal(d*2*cfg.FFNDim, 1/math.Sqrt(float64(d))), d, 2*cfg.FFNDim)
		add(p("ffn_gate.weight"), gu[:cfg.FFNDim*d], uint64(d), uint64(cfg.FFNDim))
		add(p("ffn_up.weight"), gu[cfg.FFNDim*d:], uint64(d), uint64(cfg.FFNDim))
		wdown := normal(cfg.FFNDim*d, resid/math.Sqrt(float64(cfg.FFNDim)))
		add(p("ffn_down.weight"), transpose(wdown, cfg.FFNDim, d), uint64(cfg.FFNDim), uint64(d))
	}
	add("output_norm.weight", gains(d), uint64(d))
	add("output.weight", normal(cfg.Vocab*d, builtinHeadStd/math.Sqrt(float64(d))), uint64(d), uint64(cfg.Vocab))
	kv := []gguf.KV{
		{Key: "general.architecture", Value: ArchLlama},
		{Key: "general.name", Value: BuiltinName},
		{Key: "general.alignment", Value: uint32(32)},
		{Key: "cacheblend.tokenizer", Value: BuiltinTokenizer},
		{Key: "cacheblend.seed", Value: cfg.Seed},
		{Key: "llama.context_length", Value: uint32(cfg.MaxPositions)},
		{Key: "llama.embedding_length", Value: uint32(d)},
		{Key: "llama.block_count", Value: uint32(cfg.Layers)},
		{Key: "llama.feed_forward_length", Value: uint32(cfg.FFNDim)},
		{Key: "llama.attention.head_count", Value: uint32(cfg.Heads)},
		{Key: "llama.attention.head_count_kv", Value: uint32(cfg.KVHeads)},
		{Key: "llama.rope.freq_base", Value: float32(cfg.RoPETheta)},
		{Key: "llama.rope.dimension_count", Value: uint32(hd)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
	}
	return gguf.Encode(kv, tensors)
}

// builtinHeadStd scales the built-in model's LM head (times 1/√Dim): large
// enough that the next-token distribution is peaked like a trained model's.
const builtinHeadStd = 4

// Config returns the model's configuration with every default filled in
// (the whole model's, on a shard: see KVLayout for the rank's KV memory).
func (m *Model) Config() Config {
	if m.tp != nil {
		return m.tp.full
	}
	return m.cfg
}

// RoPE returns the rotary embedding the model uses (the blend server must
// use the same one for re-RoPE).
func (m *Model) RoPE() *rope.RoPE { return m.rope }

// HeadDim is the dimension of one attention head.
func (m *Model) HeadDim() int { return m.headDim }

// Params is the number of weights (a tied embedding counted once).
func (m *Model) Params() int {
	n := m.embed.rows*m.embed.cols + len(m.finalNorm)
	if m.output.q != m.embed.q || m.output.q == nil && &m.output.data[0] != &m.embed.data[0] {
		n += m.output.rows * m.output.cols
	}
	for _, l := range m.layers {
		n += len(l.attnNorm) + len(l.mlpNorm) + len(l.qkvBias) +
			l.qkv.rows*l.qkv.cols + l.wo.rows*l.wo.cols + l.gu.rows*l.gu.cols + l.down.rows*l.down.cols
	}
	return n
}

// WithThreads returns a view of m whose kernels run on threads goroutines
// (1 or less: the caller's only, no goroutine started). It shares m's
// weights, which neither writes, and has its own workspaces. The worker's
// online quality check runs its full prefills on a one-thread view, on an
// OS thread of the lowest priority, so that they take only the CPU the
// request path leaves idle. Safe for concurrent use, like m.
func (m *Model) WithThreads(threads int) *Model {
	v := *m
	v.cfg.Threads = max(threads, 1)
	v.free = make(chan *workspace, maxFreeWS)
	v.team = newTeam(v.cfg.Threads)
	return &v
}
