package model

import (
	"math"
	"math/rand/v2"

	"github.com/cacheblend/cacheblend/rope"
	"github.com/cacheblend/cacheblend/simd"
)

// layerWeights holds one transformer layer. Matrices are row-major
// [in × out] so that a projection is x·W.
type layerWeights struct {
	attnNorm []float32 // [Dim]
	wqkv     []float32 // [Dim × (Heads+2·KVHeads)·HeadDim]: Q | K | V columns
	wo       []float32 // [Heads·HeadDim × Dim]
	mlpNorm  []float32 // [Dim]
	wgu      []float32 // [Dim × 2·FFNDim]: gate | up columns
	wdown    []float32 // [FFNDim × Dim]
}

// Model is a Llama-architecture decoder with weights generated from
// Config.Seed. Weights are immutable after New, so a Model is safe for
// concurrent use as long as concurrent calls write disjoint KV slots (each
// call spreads its own kernels over at most Config.Threads goroutines and
// waits for them before returning; a Model owns no background goroutines and
// needs no Close).
type Model struct {
	cfg     Config
	headDim int
	qDim    int // Heads·HeadDim
	kvDim   int // KVHeads·HeadDim
	qkvDim  int
	group   int // query heads per KV head

	embed      []float32 // [Vocab × Dim], also the tied LM head
	embedScale float32   // input embeddings are embed·embedScale
	layers     []layerWeights
	finalNorm  []float32

	rope  *rope.RoPE
	table rope.Table

	packed      []packedLayer // per layer, see packWeights
	embedPacked *simd.PackedB // the LM head Eᵀ

	// free keeps up to maxFreeWS workspaces between forward calls. Not a
	// sync.Pool: a GC would drop the buffers (tens of MiB for a long
	// prompt) and the next call would fault and zero them all again.
	free chan *workspace
	team *team // runs the parallel loops on cfg.Threads goroutines

	tp *shard // tensor-parallel slice (NewShard); nil: the whole model
}

// New builds a model for cfg (zero fields take their defaults), generating
// its weights deterministically from cfg.Seed with math/rand/v2's PCG. The
// initialisation is scaled (1/√fan_in for input projections, an extra
// 1/√(2·Layers) on the projections that feed the residual stream) so that
// activations stay finite at every position below MaxPositions.
func New(cfg Config) (*Model, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Model{cfg: cfg, free: make(chan *workspace, maxFreeWS), team: newTeam(cfg.Threads)}
	m.headDim = cfg.Dim / cfg.Heads
	m.qDim = cfg.Heads * m.headDim
	m.kvDim = cfg.KVHeads * m.headDim
	m.qkvDim = m.qDim + 2*m.kvDim
	m.group = cfg.Heads / cfg.KVHeads
	m.rope = rope.New(m.headDim, cfg.RoPETheta)
	m.table = rope.NewTable(m.rope, cfg.MaxPositions)

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
	d := cfg.Dim
	resid := 1 / math.Sqrt(2*float64(cfg.Layers))
	// The embedding is tied to the LM head: its scale sets the logit spread
	// (about 2.5 standard deviations for a unit-RMS final state).
	m.embed = normal(cfg.Vocab*d, 2.5/math.Sqrt(float64(d)))
	// On input the embedding is scaled by √Dim/2 (as Gemma scales by √Dim):
	// the token's own identity then dominates the residual stream and the
	// context is a perturbation, as in a trained model, so K/V computed
	// without the preceding context are close to (not equal to) the
	// in-context ones — the regime CacheBlend repairs.
	m.embedScale = float32(math.Sqrt(float64(d)) / 2)
	m.layers = make([]layerWeights, cfg.Layers)
	for l := range m.layers {
		lw := &m.layers[l]
		lw.attnNorm = gains(d)
		// Q and K get a larger scale than 1/√Dim so that attention is
		// peaked enough to depend on context (which CacheBlend must repair).
		qk := normal(d*m.qkvDim, 1/math.Sqrt(float64(d)))
		for i := range d {
			row := qk[i*m.qkvDim : (i+1)*m.qkvDim]
			for j := range m.qDim + m.kvDim {
				row[j] *= 1.5
			}
		}
		lw.wqkv = qk
		lw.wo = normal(m.qDim*d, resid/math.Sqrt(float64(m.qDim)))
		lw.mlpNorm = gains(d)
		lw.wgu = normal(d*2*cfg.FFNDim, 1/math.Sqrt(float64(d)))
		lw.wdown = normal(cfg.FFNDim*d, resid/math.Sqrt(float64(cfg.FFNDim)))
	}
	m.finalNorm = gains(d)
	m.packWeights()
	return m, nil
}

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

// Params is the number of weights (the tied embedding counted once).
func (m *Model) Params() int {
	n := len(m.embed) + len(m.finalNorm)
	for _, l := range m.layers {
		n += len(l.attnNorm) + len(l.wqkv) + len(l.wo) + len(l.mlpNorm) + len(l.wgu) + len(l.wdown)
	}
	return n
}
