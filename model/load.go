package model

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/quant"
	"github.com/cacheblend/cacheblend/rope"
)

// Architectures Load supports (the file's general.architecture).
const (
	ArchLlama = "llama" // Llama 2/3.x, Mistral, SmolLM, TinyLlama
	ArchQwen2 = "qwen2" // Qwen2 / Qwen2.5: Q/K/V biases, NeoX RoPE
)

// ErrUnsupported is wrapped by Load's errors for a file it cannot run (an
// architecture, a tensor type or a metadata value outside what the model
// computes); the message names it.
var ErrUnsupported = errors.New("model: unsupported model file")

// Load builds a model from a GGUF file: the architecture, the shapes, the
// RoPE parameters and the weights come from f; cfg supplies what a file
// does not decide (CheckLayer, RecompRatio, Threads, and MaxPositions, which
// caps the file's context length when set; zero fields are defaults). F32
// weights are packed once for simd's GEMM; every other type is computed
// from f's memory (f must stay open as long as the model is used).
//
// Supported: architectures llama and qwen2 (dense, no experts), weights of
// the types quant.Type.Supported reports, RoPE scaling none or linear, and
// rope_freqs.weight (Llama 3.1+ frequency factors). Anything else is an
// error wrapping ErrUnsupported that names it.
func Load(f *gguf.File, cfg Config) (*Model, error) {
	arch := f.Architecture()
	switch arch {
	case ArchLlama, ArchQwen2:
	case "":
		return nil, fmt.Errorf("%w: no general.architecture", ErrUnsupported)
	default:
		return nil, fmt.Errorf("%w: architecture %q (supported: %s, %s)", ErrUnsupported, arch, ArchLlama, ArchQwen2)
	}
	key := func(k string) string { return arch + "." + k }
	must := func(k string) (int, error) {
		v, err := f.Uint(key(k))
		if err != nil {
			return 0, fmt.Errorf("model: %w", err)
		}
		if v == 0 || v > 1<<24 {
			return 0, fmt.Errorf("%w: %s = %d", ErrUnsupported, key(k), v)
		}
		return int(v), nil
	}
	opt := func(k string, def int) (int, error) {
		if _, ok := f.Get(key(k)); !ok {
			return def, nil
		}
		return must(k)
	}
	var c Config
	var err error
	if c.Layers, err = must("block_count"); err != nil {
		return nil, err
	}
	if c.Dim, err = must("embedding_length"); err != nil {
		return nil, err
	}
	if c.Heads, err = must("attention.head_count"); err != nil {
		return nil, err
	}
	if c.KVHeads, err = opt("attention.head_count_kv", c.Heads); err != nil {
		return nil, err
	}
	if c.FFNDim, err = must("feed_forward_length"); err != nil {
		return nil, err
	}
	ctxLen, err := opt("context_length", DefaultMaxPositions)
	if err != nil {
		return nil, err
	}
	if n, _ := opt("expert_count", 0); n > 0 {
		return nil, fmt.Errorf("%w: mixture of experts (%s = %d)", ErrUnsupported, key("expert_count"), n)
	}
	if c.Heads%c.KVHeads != 0 || c.Dim%c.Heads != 0 {
		return nil, fmt.Errorf("%w: %d heads, %d KV heads, width %d", ErrUnsupported, c.Heads, c.KVHeads, c.Dim)
	}
	hd := c.Dim / c.Heads
	for _, k := range []string{"rope.dimension_count", "attention.key_length", "attention.value_length"} {
		if v, err := opt(k, hd); err != nil {
			return nil, err
		} else if v != hd {
			return nil, fmt.Errorf("%w: %s = %d, only %d (width/heads) is supported", ErrUnsupported, key(k), v, hd)
		}
	}
	c.RoPETheta = 10000
	if _, ok := f.Get(key("rope.freq_base")); ok {
		if c.RoPETheta, err = f.Float(key("rope.freq_base")); err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
	}
	c.NormEps = 1e-5
	if _, ok := f.Get(key("attention.layer_norm_rms_epsilon")); ok {
		if c.NormEps, err = f.Float(key("attention.layer_norm_rms_epsilon")); err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
	}
	if c.RoPETheta <= 0 || math.IsNaN(c.RoPETheta) || math.IsInf(c.RoPETheta, 0) || !(c.NormEps > 0 && c.NormEps < 1) {
		return nil, fmt.Errorf("%w: rope.freq_base %v, layer_norm_rms_epsilon %v", ErrUnsupported, c.RoPETheta, c.NormEps)
	}
	c.RoPEFreqScale = 1
	if v, ok := f.Get(key("rope.scaling.type")); ok {
		switch v {
		case "none":
		case "linear":
			fac, err := f.Float(key("rope.scaling.factor"))
			if err != nil || !(fac >= 1 && fac < 1e6) {
				return nil, fmt.Errorf("%w: linear RoPE scaling factor %v (%v)", ErrUnsupported, fac, err)
			}
			c.RoPEFreqScale = 1 / fac
		default:
			return nil, fmt.Errorf("%w: RoPE scaling %v (supported: none, linear)", ErrUnsupported, v)
		}
	}
	c.Arch = arch
	c.Name, _ = f.String("general.name")

	emb, ok := f.Tensor("token_embd.weight")
	if !ok {
		return nil, fmt.Errorf("%w: no token_embd.weight", ErrUnsupported)
	}
	if len(emb.Dims) != 2 || emb.Dims[0] != uint64(c.Dim) || emb.Dims[1] == 0 || emb.Dims[1] > 1<<22 {
		return nil, fmt.Errorf("%w: token_embd.weight has shape %v, want [%d, vocab]", ErrUnsupported, emb.Dims, c.Dim)
	}
	c.Vocab = int(emb.Dims[1])
	c.MaxPositions = ctxLen
	if cfg.MaxPositions > 0 && cfg.MaxPositions < ctxLen {
		c.MaxPositions = cfg.MaxPositions
	}
	c.CheckLayer, c.RecompRatio, c.Threads = cfg.CheckLayer, cfg.RecompRatio, cfg.Threads
	c.Seed = cfg.Seed
	c = c.withDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}

	ld := loader{f: f}
	m := &Model{cfg: c, free: make(chan *workspace, maxFreeWS), team: newTeam(c.Threads), file: f}
	m.headDim = hd
	m.qDim = c.Heads * hd
	m.kvDim = c.KVHeads * hd
	m.qkvDim = m.qDim + 2*m.kvDim
	m.group = c.Heads / c.KVHeads

	var factors []float64
	if t, ok := f.Tensor("rope_freqs.weight"); ok {
		ff, err := ld.vector(t.Name, hd/2)
		if err != nil {
			return nil, err
		}
		factors = make([]float64, len(ff))
		for i, v := range ff {
			if !(v > 0) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("%w: rope_freqs.weight[%d] = %v", ErrUnsupported, i, v)
			}
			factors[i] = float64(v)
		}
	}
	m.rope = rope.NewWith(hd, c.RoPETheta, rope.Options{FreqScale: c.RoPEFreqScale, FreqFactors: factors})

	if m.embed, err = ld.matrix("token_embd.weight", c.Dim, c.Vocab, false); err != nil {
		return nil, err
	}
	if _, ok := f.Tensor("output.weight"); ok {
		if m.output, err = ld.matrix("output.weight", c.Dim, c.Vocab, true); err != nil {
			return nil, err
		}
	} else {
		m.output = m.embed // tied
		if m.output.q == nil {
			m.output.pk = packT(m.output.data, c.Vocab, c.Dim)
			m.output.pkT = true
		}
	}
	if m.finalNorm, err = ld.vector("output_norm.weight", c.Dim); err != nil {
		return nil, err
	}
	m.layers = make([]layerWeights, c.Layers)
	for l := range m.layers {
		if err := ld.layer(m, l); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// loader reads a file's tensors, checking each one's shape.
type loader struct {
	f *gguf.File
}

// tensor returns the named tensor after checking it is 2-D [in, out] (ne0
// = in) of a supported type, or 1-D [in] when out is 0.
func (ld loader) tensor(name string, in, out int) (*gguf.TensorInfo, []byte, error) {
	t, ok := ld.f.Tensor(name)
	if !ok {
		return nil, nil, fmt.Errorf("%w: missing tensor %s", ErrUnsupported, name)
	}
	want := []uint64{uint64(in)}
	if out > 0 {
		want = append(want, uint64(out))
	}
	if len(t.Dims) != len(want) || t.Dims[0] != want[0] || (out > 0 && t.Dims[1] != want[1]) {
		return nil, nil, fmt.Errorf("%w: tensor %s has shape %v, want %v", ErrUnsupported, name, t.Dims, want)
	}
	if !t.Type.Supported() {
		return nil, nil, fmt.Errorf("%w: tensor %s has type %s", ErrUnsupported, name, t.Type)
	}
	return t, ld.f.Data(t), nil
}

// vector reads a 1-D tensor of n values as float32 (a copy).
func (ld loader) vector(name string, n int) ([]float32, error) {
	t, data, err := ld.tensor(name, n, 0)
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	if err := quant.DequantizeRow(t.Type, data, out); err != nil {
		return nil, fmt.Errorf("model: tensor %s: %w", name, err)
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%w: tensor %s[%d] = %v", ErrUnsupported, name, i, v)
		}
	}
	return out, nil
}

// qmatrix reads a 2-D tensor [in, out] as out rows of in elements.
func (ld loader) qmatrix(name string, in, out int) (*qmat, error) {
	t, data, err := ld.tensor(name, in, out)
	if err != nil {
		return nil, err
	}
	q, err := newQmat(t.Type, in, out, data)
	if err != nil {
		return nil, fmt.Errorf("model: tensor %s: %w", name, err)
	}
	return q, nil
}

// matrix reads a weight [in, out] (out rows of in elements) as the
// transposed right operand of products: F32 rows are copied and, when pack,
// packed; other types stay in the file's memory.
func (ld loader) matrix(name string, in, out int, pack bool) (mat, error) {
	q, err := ld.qmatrix(name, in, out)
	if err != nil {
		return mat{}, err
	}
	return fromQ(q, pack), nil
}

// fromQ turns q into a weight mat: an F32 q becomes a float32 copy (packed
// when pack), any other type stays a qmat.
func fromQ(q *qmat, pack bool) mat {
	n, k := q.n, q.in
	if q.mixed || q.t != quant.F32 {
		return mat{rows: n, cols: k, stride: k, q: q}
	}
	data := make([]float32, n*k)
	for r := range n {
		copy(data[r*k:(r+1)*k], f32s(q.rowAt(r)))
	}
	a := dense(data, n, k)
	if pack {
		a.pk, a.pkT = packT(data, n, k), true
	}
	return a
}

// f32s views little-endian float32 bytes as floats (the file's tensors are
// aligned to at least 32 bytes; an unaligned slice is copied).
func f32s(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		out := make([]float32, len(b)/4)
		for i := range out {
			out[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
		}
		return out
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// layer reads layer l's tensors into m.layers[l].
func (ld loader) layer(m *Model, l int) error {
	c := m.cfg
	name := func(s string) string { return fmt.Sprintf("blk.%d.%s", l, s) }
	lw := &m.layers[l]
	var err error
	if lw.attnNorm, err = ld.vector(name("attn_norm.weight"), c.Dim); err != nil {
		return err
	}
	if lw.mlpNorm, err = ld.vector(name("ffn_norm.weight"), c.Dim); err != nil {
		return err
	}
	wq, err := ld.qmatrix(name("attn_q.weight"), c.Dim, m.qDim)
	if err != nil {
		return err
	}
	wk, err := ld.qmatrix(name("attn_k.weight"), c.Dim, m.kvDim)
	if err != nil {
		return err
	}
	wv, err := ld.qmatrix(name("attn_v.weight"), c.Dim, m.kvDim)
	if err != nil {
		return err
	}
	// Biases: qwen2 has them on Q, K and V; a llama file may.
	var bq, bk, bv []float32
	for _, b := range []struct {
		dst *[]float32
		t   string
		n   int
	}{{&bq, "attn_q.bias", m.qDim}, {&bk, "attn_k.bias", m.kvDim}, {&bv, "attn_v.bias", m.kvDim}} {
		if _, ok := ld.f.Tensor(name(b.t)); ok {
			if *b.dst, err = ld.vector(name(b.t), b.n); err != nil {
				return err
			}
		}
	}
	if c.Arch == ArchLlama {
		// The llama converter permutes Q and K rows so that llama.cpp's
		// adjacent-pair RoPE computes Hugging Face's rotate-half one; the
		// model (and the blend server's re-RoPE) rotate halves, so the rows
		// go back to the Hugging Face order.
		if wq, err = wq.unpermute(c.Heads, m.headDim); err != nil {
			return fmt.Errorf("layer %d Q: %w", l, err)
		}
		if wk, err = wk.unpermute(c.KVHeads, m.headDim); err != nil {
			return fmt.Errorf("layer %d K: %w", l, err)
		}
		bq = unpermuteRows(bq, c.Heads, m.headDim)
		bk = unpermuteRows(bk, c.KVHeads, m.headDim)
	}
	qkv, err := stack(wq, wk, wv)
	if err != nil {
		return fmt.Errorf("layer %d Q/K/V: %w", l, err)
	}
	lw.qkv = fromQ(qkv, true)
	if bq != nil || bk != nil || bv != nil {
		lw.qkvBias = make([]float32, m.qkvDim)
		copy(lw.qkvBias, bq)
		copy(lw.qkvBias[m.qDim:], bk)
		copy(lw.qkvBias[m.qDim+m.kvDim:], bv)
	}
	if lw.wo, err = ld.matrix(name("attn_output.weight"), m.qDim, c.Dim, true); err != nil {
		return err
	}
	gate, err := ld.qmatrix(name("ffn_gate.weight"), c.Dim, c.FFNDim)
	if err != nil {
		return err
	}
	up, err := ld.qmatrix(name("ffn_up.weight"), c.Dim, c.FFNDim)
	if err != nil {
		return err
	}
	if lw.down, err = ld.matrix(name("ffn_down.weight"), c.FFNDim, c.Dim, true); err != nil {
		return err
	}
	parts := []*qmat{gate, up}
	if lw.split = mlpSplit(gate, up, lw.down); lw.split > 0 {
		s := lw.split
		parts = []*qmat{gate.sliceRows(0, s), up.sliceRows(0, s), gate.sliceRows(s, c.FFNDim), up.sliceRows(s, c.FFNDim)}
		for h, r := range [][2]int{{0, s}, {s, c.FFNDim}} {
			if lw.downHalf[h], err = selectCols(lw.down, r[0], r[1]); err != nil {
				return fmt.Errorf("layer %d down projection: %w", l, err)
			}
		}
	}
	gu, err := stack(parts...)
	if err != nil {
		return fmt.Errorf("layer %d gate/up: %w", l, err)
	}
	lw.gu = fromQ(gu, true)
	return nil
}

// mlpSplit is where a prefill chunk's MLP is cut in two (see
// layerWeights.split), or 0 for no cut: only for weights computed from
// the file's rows (F32 ones are copied and packed, and a cut would copy
// them again), of at least splitMinFFN FFN columns, cut on the blocks of
// every row of down. The first half is the larger, so the decode path's
// silu(gate)·up of the second half, written after the first, never
// overlaps the gate values it reads.
func mlpSplit(gate, up *qmat, down mat) int {
	ffn := gate.n
	if down.q == nil || gate.t == quant.F32 || up.t == quant.F32 || ffn < splitMinFFN {
		return 0
	}
	bs := 1
	for _, sp := range down.q.spans {
		bs = max(bs, sp.t.BlockSize())
	}
	s := (ffn/2 + bs - 1) / bs * bs
	if s >= ffn {
		return 0
	}
	return s
}

// splitMinFFN is the narrowest MLP cut in halves. The halves cost a
// second pass over the down projection's tiles (2–4% of a prefill,
// measured on Qwen2.5-0.5B and SmolLM2-135M Q4_K_M when only MLPs of 4,096
// columns or more were cut; SmolLM2-135M Q4_K_M's 512-token prefill
// 2,239/2,386 tokens/s whole against 2,449/2,336 in halves, alternated)
// and halve a 512-row chunk's gate|up intermediate: 19–32 MiB at
// Qwen2.5-0.5B and Llama-3.2-1B, 6.0 MiB at SmolLM2-135M's 1,536 columns —
// 3% of that file's resident memory.
const splitMinFFN = 1536

// unpermuteRows undoes, for each of heads heads of hd rows, the llama
// converter's permutation: file row h·hd + 2i (+1) is Hugging Face row
// h·hd + i (+ hd/2). A nil or empty input is returned as is.
func unpermuteRows[T any](rows []T, heads, hd int) []T {
	if len(rows) == 0 {
		return rows
	}
	out := make([]T, len(rows))
	half := hd / 2
	for h := range heads {
		for i := range half {
			out[h*hd+i] = rows[h*hd+2*i]
			out[h*hd+half+i] = rows[h*hd+2*i+1]
		}
	}
	return out
}

// permuteRows is the llama converter's permutation (the inverse of
// unpermuteRows), used to write the built-in model as a llama file.
func permuteRows[T any](rows []T, heads, hd int) []T {
	out := make([]T, len(rows))
	half := hd / 2
	for h := range heads {
		for i := range half {
			out[h*hd+2*i] = rows[h*hd+i]
			out[h*hd+2*i+1] = rows[h*hd+half+i]
		}
	}
	return out
}
