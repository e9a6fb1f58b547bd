package model

import (
	"fmt"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/tp"
)

// shard is a tensor-parallel model's place in its group (nil on a whole
// model).
type shard struct {
	rank, world int
	reducer     tp.AllReducer
	full        Config // the whole model's configuration (Config returns it)
}

// NewShard builds rank reducer.Rank()'s slice of the model of cfg in the
// Megatron layout (docs/design.md §11): the whole model's weights are
// generated from cfg.Seed exactly as New does, then the rank keeps its
// query heads, its KV heads (Heads/world and KVHeads/world, contiguous), the
// matching columns of the QKV projection and rows of the output projection,
// and FFNDim/world of the SwiGLU gate/up columns with the matching rows of
// the down projection. Embedding, LM head and norms are replicated. The
// attention output and the MLP output are partial sums, all-reduced every
// layer through reducer, and the CacheBlend check layer's per-token deviation
// is all-reduced too, so every rank keeps the same residual stream, selects
// the same tokens and returns the same logits (within float rounding of the
// whole model's). Every rank of the group must make the same calls with the
// same inputs, in the same order; a failed all-reduce fails the call with an
// error wrapping the tp error (tp.ErrPeerDead...).
//
// Heads, KVHeads and FFNDim must be multiples of the world size. A world of
// one is the whole model. The shard's KV memory holds its KV heads only
// (KVLayout); Config still describes the whole model.
func NewShard(cfg Config, reducer tp.AllReducer) (*Model, error) {
	if reducer == nil {
		return nil, fmt.Errorf("%w: nil all-reducer", ErrBadConfig)
	}
	whole, err := New(cfg)
	if err != nil {
		return nil, err
	}
	world, rank := reducer.Size(), reducer.Rank()
	if world == 1 {
		return whole, nil
	}
	c := whole.cfg
	switch {
	case world < 1 || rank < 0 || rank >= world:
		return nil, fmt.Errorf("%w: rank %d of world size %d", ErrBadConfig, rank, world)
	case c.Heads%world != 0 || c.KVHeads%world != 0 || c.FFNDim%world != 0:
		return nil, fmt.Errorf("%w: Heads %d, KVHeads %d and FFNDim %d must be multiples of the world size %d",
			ErrBadConfig, c.Heads, c.KVHeads, c.FFNDim, world)
	}
	m := &Model{
		cfg:        c,
		headDim:    whole.headDim,
		group:      whole.group,
		embed:      whole.embed,
		embedScale: whole.embedScale,
		finalNorm:  whole.finalNorm,
		rope:       whole.rope,
		table:      whole.table,
		tp:         &shard{rank: rank, world: world, reducer: reducer, full: c},
		free:       make(chan *workspace, maxFreeWS),
		team:       newTeam(c.Threads),
	}
	m.cfg.Heads /= world
	m.cfg.KVHeads /= world
	m.cfg.FFNDim /= world
	m.qDim = m.cfg.Heads * m.headDim
	m.kvDim = m.cfg.KVHeads * m.headDim
	m.qkvDim = m.qDim + 2*m.kvDim
	d, f := c.Dim, m.cfg.FFNDim
	q0, kv0, f0 := rank*m.qDim, rank*m.kvDim, rank*f
	m.layers = make([]layerWeights, c.Layers)
	for l, w := range whole.layers {
		lw := &m.layers[l]
		lw.attnNorm, lw.mlpNorm = w.attnNorm, w.mlpNorm
		lw.wqkv = make([]float32, d*m.qkvDim)
		lw.wgu = make([]float32, d*2*f)
		for i := range d {
			src := w.wqkv[i*whole.qkvDim : (i+1)*whole.qkvDim]
			dst := lw.wqkv[i*m.qkvDim : (i+1)*m.qkvDim]
			copy(dst[:m.qDim], src[q0:q0+m.qDim])
			copy(dst[m.qDim:m.qDim+m.kvDim], src[whole.qDim+kv0:whole.qDim+kv0+m.kvDim])
			copy(dst[m.qDim+m.kvDim:], src[whole.qDim+whole.kvDim+kv0:whole.qDim+whole.kvDim+kv0+m.kvDim])
			gsrc := w.wgu[i*2*c.FFNDim : (i+1)*2*c.FFNDim]
			gdst := lw.wgu[i*2*f : (i+1)*2*f]
			copy(gdst[:f], gsrc[f0:f0+f])
			copy(gdst[f:], gsrc[c.FFNDim+f0:c.FFNDim+f0+f])
		}
		lw.wo = w.wo[q0*d : (q0+m.qDim)*d]
		lw.wdown = w.wdown[f0*d : (f0+f)*d]
	}
	m.packWeights()
	return m, nil
}

// Rank is the model's tensor-parallel rank (0 for a whole model).
func (m *Model) Rank() int {
	if m.tp == nil {
		return 0
	}
	return m.tp.rank
}

// WorldSize is the number of ranks the model is sharded over (1 for a
// whole model).
func (m *Model) WorldSize() int {
	if m.tp == nil {
		return 1
	}
	return m.tp.world
}

// KVLayout is the layout of this model's (this rank's) KV memory for a pool
// of numBlocks blocks of blockSize tokens: the rank's KV heads only.
func (m *Model) KVLayout(numBlocks, blockSize int) kvcache.Layout {
	return kvcache.Layout{
		NumLayers: m.cfg.Layers,
		NumBlocks: numBlocks,
		BlockSize: blockSize,
		KVHeads:   m.cfg.KVHeads,
		HeadDim:   m.headDim,
	}
}

// allReduce sums buf over the group (nothing on a whole model).
func (m *Model) allReduce(buf []float32) error {
	if m.tp == nil {
		return nil
	}
	if err := m.tp.reducer.AllReduce(buf); err != nil {
		return fmt.Errorf("model: rank %d all-reduce: %w", m.tp.rank, err)
	}
	return nil
}

// agreeReused makes every rank use the same reused positions: a position is
// reused (prefix or loaded) only when every rank loaded it. It returns the
// agreed prefix and ranges (sorted, disjoint); a whole model returns its
// input.
func (m *Model) agreeReused(ws *workspace, total, prefix int, ranges []reuseplan.Range) (int, []reuseplan.Range, error) {
	if m.tp == nil {
		return prefix, ranges, nil
	}
	mask := ws.f32(bufMask, total)
	clear(mask)
	for p := range prefix {
		mask[p] = 1
	}
	for _, r := range ranges {
		for p := r.Start; p < r.End; p++ {
			mask[p] = 1
		}
	}
	if err := m.allReduce(mask); err != nil {
		return 0, nil, err
	}
	all := float32(m.tp.world)
	np := 0
	for np < total && mask[np] == all {
		np++
	}
	var out []reuseplan.Range
	for p := np; p < total; {
		if mask[p] != all {
			p++
			continue
		}
		s := p
		for p < total && mask[p] == all {
			p++
		}
		out = append(out, reuseplan.Range{Start: s, End: p})
	}
	return np, out, nil
}
