package quality

import (
	"errors"
	"fmt"

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
}

// blockSize is the block size of the comparison's private KV memory.
const blockSize = 16

// Blend runs c through m twice in a KV memory of its own and compares the
// next-token distributions: a full prefill of the prompt, and CacheBlend —
// each document's KV computed alone at positions 0.., moved to its place in
// the prompt with K re-rotated by the shift (the blend server's scatter),
// then the selective-recompute forward. With opt.Positions K > 1 the prompt
// is extended by the full prefill's first K-1 greedy tokens and both
// forwards return the distributions at the last K positions.
//
// It allocates a KV memory for three copies of the prompt and is not meant
// for a request's critical path. m must be a whole (unsharded) model.
func Blend(m *model.Model, c Case, opt Options) (Report, error) {
	if m.WorldSize() > 1 {
		return Report{}, errors.New("quality: blend check on a sharded model")
	}
	if len(c.Docs) == 0 {
		return Report{}, errors.New("quality: a case without documents reuses nothing")
	}
	k := max(opt.Positions, 1)
	prompt, docs := c.tokens()
	n := len(prompt) + k - 1
	per := (n + blockSize - 1) / blockSize
	var docBlocks []int
	total := 2 * per
	for _, d := range c.Docs {
		b := (len(d) + blockSize - 1) / blockSize
		docBlocks = append(docBlocks, total)
		total += b
	}
	kv, err := kvcache.Create("", m.KVLayout(total, blockSize))
	if err != nil {
		return Report{}, fmt.Errorf("quality: KV memory: %w", err)
	}
	defer kv.Close()
	full, blend := blocks(0, per), blocks(per, per)

	// The full prefill's greedy continuation (K-1 tokens) extends the prompt.
	seq := append([]int32(nil), prompt...)
	logits, err := m.Prefill(kv, model.PrefillInput{Tokens: prompt, BlockTable: full})
	if err != nil {
		return Report{}, fmt.Errorf("quality: full prefill: %w", err)
	}
	for len(seq) < n {
		tok := int32(Argmax(logits))
		out, err := m.Decode(kv, []model.DecodeInput{{Token: tok, Pos: len(seq), BlockTable: full}})
		if err != nil {
			return Report{}, fmt.Errorf("quality: greedy continuation: %w", err)
		}
		seq, logits = append(seq, tok), out[0]
	}
	ref, err := m.Prefill(kv, model.PrefillInput{Tokens: seq, BlockTable: full, Logits: k})
	if err != nil {
		return Report{}, fmt.Errorf("quality: full prefill: %w", err)
	}

	// CacheBlend: the documents alone, moved into place.
	for i, d := range c.Docs {
		stored := blocks(docBlocks[i], (len(d)+blockSize-1)/blockSize)
		if _, err := m.Prefill(kv, model.PrefillInput{Tokens: d, BlockTable: stored}); err != nil {
			return Report{}, fmt.Errorf("quality: document %d alone: %w", i, err)
		}
		moveKV(m, kv, stored, blend, docs[i].Start, len(d))
	}
	got, _, err := m.BlendForward(kv, model.BlendInput{
		Tokens: seq, BlockTable: blend, Reused: docs, CheckLayer: model.UseConfig,
		RecompRatio: opt.Ratio, Select: opt.Select, SelectSeed: opt.Seed, Logits: k,
	})
	if err != nil {
		return Report{}, fmt.Errorf("quality: blend: %w", err)
	}
	return Compare(ref, got, m.Config().Vocab)
}

// blocks is the block table [first, first+n).
func blocks(first, n int) []int32 {
	bt := make([]int32, n)
	for i := range bt {
		bt[i] = int32(first + i)
	}
	return bt
}

// moveKV copies positions [0, n) under src to [to, to+n) under dst in
// every layer, rotating K by the shift.
func moveKV(m *model.Model, kv *kvcache.Memory, src, dst []int32, to, n int) {
	for l := range m.Config().Layers {
		for i := range n {
			s := int(src[i/blockSize])*blockSize + i%blockSize
			d := int(dst[(to+i)/blockSize])*blockSize + (to+i)%blockSize
			k := kv.TokenK(l, d)
			copy(k, kv.TokenK(l, s))
			m.RoPE().Shift(k, i, to+i)
			copy(kv.TokenV(l, d), kv.TokenV(l, s))
		}
	}
}
