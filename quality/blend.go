package quality

import (
	"errors"
	"fmt"
	"time"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/reuseplan"
)

// Case is one CacheBlend prompt: Prefix, then the documents one after the
// other, then Question. Every document is reused: its KV is computed alone,
// from position 0, as a stored chunk is.
type Case struct {
	Prefix   []int32
	Docs     [][]int32
	Question []int32
}

// tokens is the whole prompt and the ranges of its documents.
func (c Case) tokens() ([]int32, []reuseplan.Range) {
	out := append([]int32(nil), c.Prefix...)
	var docs []reuseplan.Range
	for _, d := range c.Docs {
		docs = append(docs, reuseplan.Range{Start: len(out), End: len(out) + len(d)})
		out = append(out, d...)
	}
	return append(out, c.Question...), docs
}

// Options are the settings of one comparison. The zero value compares the
// first output token at the model's own check layer and ratio with
// CacheBlend's selection.
type Options struct {
	// Ratio is the recompute ratio; negative (model.UseConfig) is the
	// model's. Ratio 0 is full reuse without recompute.
	Ratio float64
	// Select and Seed choose the selection rule (model.BlendInput).
	Select model.Selection
	Seed   uint64
	// Positions is how many output positions are compared under teacher
	// forcing (both forwards fed the full prefill's greedy continuation);
	// 0 means 1.
	Positions int
	// KVType is the element type of the KV memory both forwards run on
	// (the zero value F32; the worker serves F16 by default).
	KVType kvcache.DType
}

// blockSize is the block size of the comparison's private KV memory.
const blockSize = 16

// Blend runs c through m twice in a KV memory of its own and compares the
// next-token distributions: a full prefill of the prompt, and CacheBlend —
// each document's KV computed alone at positions 0.., moved to its place in
// the prompt with K re-rotated by the shift (the blend server's scatter),
// then the selective-recompute forward. Over opt.Positions K > 1 positions
// both are fed the full prefill's first K-1 greedy tokens (Served).
//
// It allocates a KV memory for the prompt and its documents and is not
// meant for a request's critical path. m must be a whole (unsharded) model.
func Blend(m *model.Model, c Case, opt Options) (Report, error) {
	if m.WorldSize() > 1 {
		return Report{}, errors.New("quality: blend check on a sharded model")
	}
	if len(c.Docs) == 0 {
		return Report{}, errors.New("quality: a case without documents reuses nothing")
	}
	prompt, docs := c.tokens()
	per := blocksFor(len(prompt))
	total := per
	for _, d := range c.Docs {
		total += blocksFor(len(d))
	}
	kv, err := kvcache.Create("", m.KVLayout(total, blockSize, opt.KVType))
	if err != nil {
		return Report{}, fmt.Errorf("quality: KV memory: %w", err)
	}
	defer kv.Close()
	blend, next := blocks(0, per), per
	for i, d := range c.Docs {
		stored := blocks(next, blocksFor(len(d)))
		next += len(stored)
		if _, err := m.Prefill(kv, model.PrefillInput{Tokens: d, BlockTable: stored}); err != nil {
			return Report{}, fmt.Errorf("quality: document %d alone: %w", i, err)
		}
		MoveKV(m, kv, stored, blend, docs[i].Start, len(d))
	}
	t0 := time.Now()
	logits, _, err := m.BlendForward(kv, model.BlendInput{
		Tokens: prompt, BlockTable: blend, Reused: docs, CheckLayer: model.UseConfig,
		RecompRatio: opt.Ratio, Select: opt.Select, SelectSeed: opt.Seed,
	})
	took := time.Since(t0)
	if err != nil {
		return Report{}, fmt.Errorf("quality: blend: %w", err)
	}
	r, err := Served(m, kv, blend, prompt, logits, opt.Positions)
	r.BlendTime = took
	return r, err
}

// Served compares a prompt's KV as a request was served — in kv under the
// block table bt, with logits the forward's next-token logits — with a full
// prefill of the prompt, over k positions (0 means 1): the full prefill's
// first k-1 greedy tokens are fed to both (teacher forcing) and the
// distributions at each position compared. It is a Checker used once.
func Served(m *model.Model, kv *kvcache.Memory, bt []int32, prompt []int32, logits []float32, k int) (Report, error) {
	c := NewChecker(m, kv.Layout().DType)
	defer c.Close()
	if err := c.Snapshot(kv, bt, prompt, logits, k); err != nil {
		return Report{}, err
	}
	return c.Compare()
}

// Checker compares served prompts with full prefills in a KV memory of
// its own, kept between checks (grown when a prompt needs more): Snapshot
// copies what a request was served (cheap: a copy of the prompt's KV),
// Compare later does the expensive part. A Checker is not safe for
// concurrent use; Snapshot and Compare alternate.
type Checker struct {
	m      *model.Model
	dt     kvcache.DType
	own    *kvcache.Memory
	prompt []int32
	logits []float32
	k      int
}

// NewChecker returns a Checker for m (a whole model) whose copies of the
// served KV are of element type dt (the served memory's); its memory is
// allocated by Reserve or the first Snapshot.
func NewChecker(m *model.Model, dt kvcache.DType) *Checker { return &Checker{m: m, dt: dt} }

// Close releases the Checker's KV memory.
func (c *Checker) Close() error {
	if c.own == nil {
		return nil
	}
	err := c.own.Close()
	c.own = nil
	return err
}

// Snapshot copies the prompt's KV as served — in kv under bt — and its
// next-token logits, for a comparison over k positions (0 means 1). kv and
// bt are only read, and not after Snapshot returns.
func (c *Checker) Snapshot(kv *kvcache.Memory, bt []int32, prompt []int32, logits []float32, k int) error {
	k = max(k, 1)
	n, l := len(prompt), kv.Layout()
	per := blocksFor(n + k)
	ol := c.m.KVLayout(2*per, blockSize, c.dt)
	switch {
	case n == 0 || kvcache.Capacity(bt, l.BlockSize) < n:
		return fmt.Errorf("quality: %d prompt tokens, block table holds %d", n, kvcache.Capacity(bt, l.BlockSize))
	case l.NumLayers != ol.NumLayers || l.KVHeads != ol.KVHeads || l.HeadDim != ol.HeadDim || l.DType != ol.DType:
		return fmt.Errorf("quality: KV memory of layout %+v for a model of %+v", l, ol)
	case len(logits) != c.m.Config().Vocab:
		return fmt.Errorf("%w: %d logits over a vocabulary of %d", ErrShape, len(logits), c.m.Config().Vocab)
	}
	for _, b := range bt[:blocksFor2(n, l.BlockSize)] {
		if b < 0 || int(b) >= l.NumBlocks {
			return fmt.Errorf("quality: block %d outside the KV memory's %d", b, l.NumBlocks)
		}
	}
	if err := c.grow(ol); err != nil {
		return err
	}
	copyServed(c.m, kv, bt, c.own, blocks(per, per), n)
	c.prompt, c.logits, c.k = append(c.prompt[:0], prompt...), append(c.logits[:0], logits...), k
	return nil
}

// Reserve allocates the Checker's memory for prompts of up to tokens
// tokens compared over k positions, and touches every page of it, so that
// a Snapshot of such a prompt only copies: the allocation and the page
// faults (tens of milliseconds for a few thousand tokens) happen here, off
// the request whose KV Snapshot copies.
func (c *Checker) Reserve(tokens, k int) error {
	per := blocksFor(max(tokens, 1) + max(k, 1))
	if err := c.grow(c.m.KVLayout(2*per, blockSize, c.dt)); err != nil {
		return err
	}
	for l := range c.own.Layout().NumLayers {
		clear(c.own.Plane(l, kvcache.Keys))
		clear(c.own.Plane(l, kvcache.Values))
	}
	return nil
}

// grow replaces the Checker's memory with one of layout l when it holds
// fewer blocks.
func (c *Checker) grow(l kvcache.Layout) error {
	if c.own != nil && c.own.Layout().NumBlocks >= l.NumBlocks {
		return nil
	}
	c.Close()
	own, err := kvcache.Create("", l)
	if err != nil {
		return fmt.Errorf("quality: KV memory: %w", err)
	}
	c.own = own
	return nil
}

// Compare runs the full prefill of the last snapshot's prompt and the
// teacher-forced positions, and compares.
func (c *Checker) Compare() (Report, error) {
	if c.own == nil || len(c.prompt) == 0 {
		return Report{}, errors.New("quality: compare without a snapshot")
	}
	m, prompt, k := c.m, c.prompt, c.k
	n := len(prompt)
	per := blocksFor(n + k)
	full, served := blocks(0, per), blocks(per, per)
	t0 := time.Now()
	ref, err := m.Prefill(c.own, model.PrefillInput{Tokens: prompt, BlockTable: full})
	fullTime := time.Since(t0)
	if err != nil {
		return Report{}, fmt.Errorf("quality: full prefill: %w", err)
	}
	v := m.Config().Vocab
	refs, gots := append(make([]float32, 0, k*v), ref...), append(make([]float32, 0, k*v), c.logits...)
	for pos := n; pos < n+k-1; pos++ {
		tok := int32(Argmax(ref)) // the full prefill's greedy continuation
		outs, err := m.Decode(c.own, []model.DecodeInput{{Token: tok, Pos: pos, BlockTable: full}, {Token: tok, Pos: pos, BlockTable: served}})
		if err != nil {
			return Report{}, fmt.Errorf("quality: teacher-forced step %d: %w", pos-n+1, err)
		}
		ref = outs[0]
		refs, gots = append(refs, outs[0]...), append(gots, outs[1]...)
	}
	r, err := Compare(refs, gots, v)
	r.FullTime = fullTime
	return r, err
}

func blocksFor(n int) int { return blocksFor2(n, blockSize) }

func blocksFor2(n, bs int) int { return (n + bs - 1) / bs }

// copyServed copies positions [0, n) of every layer from kv under bt to own
// under dst (same positions: no rotation; both of one element type).
func copyServed(m *model.Model, kv *kvcache.Memory, bt []int32, own *kvcache.Memory, dst []int32, n int) {
	bs := kv.Layout().BlockSize
	for l := range m.Config().Layers {
		for p := range n {
			s := int(bt[p/bs])*bs + p%bs
			d := int(dst[p/blockSize])*blockSize + p%blockSize
			copy(own.Row(kvcache.Keys, l, d), kv.Row(kvcache.Keys, l, s))
			copy(own.Row(kvcache.Values, l, d), kv.Row(kvcache.Values, l, s))
		}
	}
}

// blocks is the block table [first, first+n).
func blocks(first, n int) []int32 {
	bt := make([]int32, n)
	for i := range bt {
		bt[i] = int32(first + i)
	}
	return bt
}

// MoveKV copies the KV of positions [0, n) under the block table src to
// positions [to, to+n) under dst in every layer of kv, rotating K to its new
// positions: what the blend server's retrieve does for a document stored
// alone and reused at offset to. It panics when a position falls outside
// its block table. Not safe for concurrent use on overlapping blocks.
func MoveKV(m *model.Model, kv *kvcache.Memory, src, dst []int32, to, n int) {
	bs := kv.Layout().BlockSize
	rp := m.RoPE()
	k := make([]float32, kv.Layout().TokenFloats())
	for l := range m.Config().Layers {
		for i := range n {
			s, err := kvcache.Slot(src, i, bs)
			if err != nil {
				panic(fmt.Sprintf("quality: MoveKV source: %v", err))
			}
			d, err := kvcache.Slot(dst, to+i, bs)
			if err != nil {
				panic(fmt.Sprintf("quality: MoveKV destination: %v", err))
			}
			kv.Read(kvcache.Keys, l, s, k)
			rp.Shift(k, i, to+i)
			kv.Write(kvcache.Keys, l, d, k)
			copy(kv.Row(kvcache.Values, l, d), kv.Row(kvcache.Values, l, s))
		}
	}
}
