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

// NewShard builds rank reducer.Rank()'s slice of the built-in model of cfg
// (New(cfg), then Shard).
func NewShard(cfg Config, reducer tp.AllReducer) (*Model, error) {
	whole, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return whole.Shard(reducer)
}

// Shard returns rank reducer.Rank()'s slice of m in the Megatron layout
// (docs/design.md §11): the rank keeps its query heads, its KV heads
// (Heads/world and KVHeads/world, contiguous), the matching rows of the QKV
// projection and columns of the output projection, and FFNDim/world of the
// SwiGLU gate/up rows with the matching columns of the down projection.
// Embedding, LM head and norms are shared with m. The attention output and
// the MLP output are partial sums, all-reduced every layer through reducer,
// and the CacheBlend check layer's per-token deviation is all-reduced too,
// so every rank keeps the same residual stream, selects the same tokens and
// returns the same logits (within float rounding of the whole model's; looser
// for weights whose products round their activations, see the package doc).
// Every rank of the group must make the same calls with the same inputs, in
// the same order; a failed all-reduce fails the call with an error wrapping
// the tp error (tp.ErrPeerDead...).
//
// Heads, KVHeads and FFNDim must be multiples of the world size, and for a
// quantized weight the cut of the output and down projections must fall on
// its blocks. A world of one is m itself. The shard's KV memory holds its KV
// heads only (KVLayout); Config still describes the whole model.
func (m *Model) Shard(reducer tp.AllReducer) (*Model, error) {
	if reducer == nil {
		return nil, fmt.Errorf("%w: nil all-reducer", ErrBadConfig)
	}
	if m.tp != nil {
		return nil, fmt.Errorf("%w: the model is already a shard", ErrBadConfig)
	}
	whole := m
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
	s := &Model{
		cfg:       c,
		headDim:   whole.headDim,
		group:     whole.group,
		embed:     whole.embed,
		output:    whole.output,
		finalNorm: whole.finalNorm,
		rope:      whole.rope,
		file:      whole.file,
		tp:        &shard{rank: rank, world: world, reducer: reducer, full: c},
		free:      make(chan *workspace, maxFreeWS),
		team:      newTeam(c.Threads),
	}
	s.cfg.Heads /= world
	s.cfg.KVHeads /= world
	s.cfg.FFNDim /= world
	s.qDim = s.cfg.Heads * s.headDim
	s.kvDim = s.cfg.KVHeads * s.headDim
	s.qkvDim = s.qDim + 2*s.kvDim
	f := s.cfg.FFNDim
	q0, kv0, f0 := rank*s.qDim, rank*s.kvDim, rank*f
	qkvRows := [][2]int{{q0, q0 + s.qDim}, {whole.qDim + kv0, whole.qDim + kv0 + s.kvDim},
		{whole.qDim + whole.kvDim + kv0, whole.qDim + whole.kvDim + kv0 + s.kvDim}}
	s.layers = make([]layerWeights, c.Layers)
	var err error
	for l, w := range whole.layers {
		lw := &s.layers[l]
		lw.attnNorm, lw.mlpNorm = w.attnNorm, w.mlpNorm
		if lw.qkv, err = selectRows(w.qkv, qkvRows); err != nil {
			return nil, fmt.Errorf("layer %d Q/K/V: %w", l, err)
		}
		if w.qkvBias != nil {
			for _, r := range qkvRows {
				lw.qkvBias = append(lw.qkvBias, w.qkvBias[r[0]:r[1]]...)
			}
		}
		if lw.gu, err = selectRows(w.gu, w.guRanges(f0, f0+f, c.FFNDim)); err != nil {
			return nil, fmt.Errorf("layer %d gate/up: %w", l, err)
		}
		if lw.wo, err = selectCols(w.wo, q0, q0+s.qDim); err != nil {
			return nil, fmt.Errorf("layer %d output projection: %w", l, err)
		}
		if lw.down, err = selectCols(w.down, f0, f0+f); err != nil {
			return nil, fmt.Errorf("layer %d down projection: %w", l, err)
		}
	}
	return s, nil
}

// selectRows returns the rows of the ranges of weight w (rows = outputs),
// one range after the other.
func selectRows(w mat, ranges [][2]int) (mat, error) {
	if w.q != nil {
		parts := make([]*qmat, len(ranges))
		for i, r := range ranges {
			parts[i] = w.q.sliceRows(r[0], r[1])
		}
		q, err := stack(parts...)
		if err != nil {
			return mat{}, err
		}
		return mat{rows: q.n, cols: q.in, stride: q.in, q: q}, nil
	}
	var data []float32
	for _, r := range ranges {
		data = append(data, w.data[r[0]*w.stride:r[1]*w.stride]...)
	}
	n := len(data) / w.cols
	a := dense(data, n, w.cols)
	a.pk, a.pkT = packT(data, n, w.cols), true
	return a, nil
}

// selectCols returns weight w (rows = outputs) cut to input columns
// [c0, c1).
func selectCols(w mat, c0, c1 int) (mat, error) {
	if w.q != nil {
		q, err := w.q.sliceCols(c0, c1)
		if err != nil {
			return mat{}, err
		}
		return mat{rows: q.n, cols: q.in, stride: q.in, q: q}, nil
	}
	k := c1 - c0
	data := make([]float32, w.rows*k)
	for r := range w.rows {
		copy(data[r*k:(r+1)*k], w.data[r*w.stride+c0:r*w.stride+c1])
	}
	a := dense(data, w.rows, k)
	a.pk, a.pkT = packT(data, w.rows, k), true
	return a, nil
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
// of numBlocks blocks of blockSize tokens of element type dt: the rank's KV
// heads only. The model runs on memory of any element type (F16 halves
// the cache and the bytes a decode step reads from it).
func (m *Model) KVLayout(numBlocks, blockSize int, dt kvcache.DType) kvcache.Layout {
	return kvcache.Layout{
		NumLayers: m.cfg.Layers,
		NumBlocks: numBlocks,
		BlockSize: blockSize,
		KVHeads:   m.cfg.KVHeads,
		HeadDim:   m.headDim,
		DType:     dt,
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
// reused (prefix or loaded) only when every rank loaded it, and the agreed
// prefix is the run from position 0 that every rank has as prefix — a
// reused range that starts where the prefix ends stays a range (it is
// re-RoPE'd and blended, not taken as exact). It returns the agreed prefix
// and ranges (sorted, disjoint); a whole model returns its input.
func (m *Model) agreeReused(ws *workspace, total, prefix int, ranges []reuseplan.Range) (int, []reuseplan.Range, error) {
	if m.tp == nil {
		return prefix, ranges, nil
	}
	// One all-reduce of two masks: [0, total) loaded, [total, 2·total) prefix.
	mask := ws.f32(bufMask, 2*total)
	clear(mask)
	for p := range prefix {
		mask[p] = 1
		mask[total+p] = 1
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
	for np < total && mask[np] == all && mask[total+np] == all {
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
