package model

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/tp"
)

// op runs one computation on a model and its KV memory, returning the
// logits it compares (and the blend stats, when it blends).
type op func(m *Model, kv *kvcache.Memory, rank int) ([]float32, BlendStats, error)

// relDiff is max|a−b| / max|b|.
func relDiff(a, b []float32) float64 {
	var scale float64
	for _, v := range b {
		scale = max(scale, math.Abs(float64(v)))
	}
	return maxAbsDiff(a, b) / scale
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// stalePrompt prefills alt (the prompt with different leading tokens) so the
// prompt's later positions hold K/V computed in another context: the
// "reused" state CacheBlend repairs.
func stalePrompt(m *Model, kv *kvcache.Memory, prompt []int32, lead int) error {
	alt := append(randTokens(99, lead), prompt[lead:]...)
	_, err := m.Prefill(kv, PrefillInput{Tokens: alt, BlockTable: table(0, blocksFor(len(alt)))})
	return err
}

func TestShardMatchesWholeModel(t *testing.T) {
	const n = 160
	prompt := randTokens(5, n)
	bt := table(0, blocksFor(n))
	blend := func(prefix int, reused func(rank int) []reuseplan.Range) op {
		return func(m *Model, kv *kvcache.Memory, rank int) ([]float32, BlendStats, error) {
			if err := stalePrompt(m, kv, prompt, 32); err != nil {
				return nil, BlendStats{}, err
			}
			return m.BlendForward(kv, BlendInput{Tokens: prompt, BlockTable: bt, PrefixReused: prefix,
				Reused: reused(rank), CheckLayer: UseConfig, RecompRatio: 0.15})
		}
	}
	same := func(rs ...reuseplan.Range) func(int) []reuseplan.Range {
		return func(int) []reuseplan.Range { return rs }
	}
	prefill := func(m *Model, kv *kvcache.Memory, _ int) ([]float32, BlendStats, error) {
		l, err := m.Prefill(kv, PrefillInput{Tokens: prompt, BlockTable: bt})
		return l, BlendStats{}, err
	}
	chunked := func(m *Model, kv *kvcache.Memory, _ int) ([]float32, BlendStats, error) {
		if _, err := m.Prefill(kv, PrefillInput{Tokens: prompt[:70], BlockTable: bt}); err != nil {
			return nil, BlendStats{}, err
		}
		l, err := m.Prefill(kv, PrefillInput{Tokens: prompt[70:], Start: 70, BlockTable: bt})
		return l, BlendStats{}, err
	}
	decode := func(m *Model, kv *kvcache.Memory, _ int) ([]float32, BlendStats, error) {
		if _, err := m.Prefill(kv, PrefillInput{Tokens: prompt[:n-1], BlockTable: bt}); err != nil {
			return nil, BlendStats{}, err
		}
		ls, err := m.Decode(kv, []DecodeInput{{Token: prompt[n-1], Pos: n - 1, BlockTable: bt}})
		if err != nil {
			return nil, BlendStats{}, err
		}
		return ls[0], BlendStats{}, nil
	}
	four := Config{Layers: 3, Dim: 64, Heads: 4, KVHeads: 4, FFNDim: 128, Seed: 11}
	cases := []struct {
		name  string
		cfg   Config
		world int
		run   op
		// whole is the whole model's computation when it differs (the
		// agreed reuse of ranks that loaded different ranges).
		whole op
	}{
		{"tp2 prefill", smallConfig(), 2, prefill, nil},
		{"tp2 chunked prefill", smallConfig(), 2, chunked, nil},
		{"tp2 decode", smallConfig(), 2, decode, nil},
		{"tp2 blend, no reuse", smallConfig(), 2, blend(0, same()), nil},
		{"tp2 blend, reused ranges", smallConfig(), 2, blend(0, same(reuseplan.Range{Start: 32, End: 150})), nil},
		{"tp2 blend, prefix and reused", smallConfig(), 2, blend(16, same(reuseplan.Range{Start: 40, End: 100}, reuseplan.Range{Start: 110, End: n})), nil},
		// A reused range that starts where the prefix ends stays a range
		// (re-RoPE'd and blended), not a longer exact prefix.
		{"tp2 blend, a range adjoining the prefix", smallConfig(), 2, blend(16, same(reuseplan.Range{Start: 16, End: 140})), nil},
		{"tp2 blend, a range missing on rank 1", smallConfig(), 2,
			blend(0, func(rank int) []reuseplan.Range {
				if rank == 1 {
					return []reuseplan.Range{{Start: 32, End: 80}}
				}
				return []reuseplan.Range{{Start: 32, End: 80}, {Start: 96, End: 150}}
			}),
			blend(0, same(reuseplan.Range{Start: 32, End: 80}))},
		{"tp4 prefill", four, 4, prefill, nil},
		{"tp4 blend, reused ranges", four, 4, blend(0, same(reuseplan.Range{Start: 32, End: 150})), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			whole := newModel(t, c.cfg)
			ref := c.whole
			if ref == nil {
				ref = c.run
			}
			want, wantSt, err := ref(whole, newKV(t, whole, blocksFor(n)), 0)
			if err != nil {
				t.Fatal(err)
			}
			rs, err := tp.NewLocalGroup(c.world, tp.Config{Timeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			got := make([][]float32, c.world)
			sts := make([]BlendStats, c.world)
			errs := make([]error, c.world)
			var wg sync.WaitGroup
			for rank := range c.world {
				m, err := NewShard(c.cfg, rs[rank])
				if err != nil {
					t.Fatal(err)
				}
				if m.Config() != whole.Config() || m.WorldSize() != c.world || m.Rank() != rank {
					t.Fatalf("shard %d: config %+v world %d", rank, m.Config(), m.WorldSize())
				}
				kv, err := kvcache.Create("", m.KVLayout(blocksFor(n), testBlock, kvcache.F32))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { kv.Close() })
				wg.Go(func() { got[rank], sts[rank], errs[rank] = c.run(m, kv, rank) })
			}
			wg.Wait()
			for rank := range c.world {
				if errs[rank] != nil {
					t.Fatalf("rank %d: %v", rank, errs[rank])
				}
				if d := relDiff(got[rank], want); d > 1e-4 {
					t.Errorf("rank %d: logits differ from the whole model's by %.3g relative", rank, d)
				}
				if argmax(got[rank]) != argmax(want) {
					t.Errorf("rank %d: greedy token %d, whole model %d", rank, argmax(got[rank]), argmax(want))
				}
				for i := range got[0] {
					if got[rank][i] != got[0][i] {
						t.Fatalf("rank %d logit %d = %v, rank 0 %v: ranks must agree exactly", rank, i, got[rank][i], got[0][i])
					}
				}
				s := sts[rank]
				if s.ImpCount != wantSt.ImpCount || s.Selected != wantSt.Selected || s.ReusedTokens != wantSt.ReusedTokens || s.PrefixTokens != wantSt.PrefixTokens {
					t.Errorf("rank %d stats %+v, whole model %+v", rank, s, wantSt)
				}
			}
		})
	}
}

func TestShardErrors(t *testing.T) {
	cases := []struct {
		name  string
		cfg   Config
		world int
		want  error
	}{
		{"heads not divisible", Config{Layers: 2, Dim: 48, Heads: 3, KVHeads: 3, FFNDim: 64}, 2, ErrBadConfig},
		{"KV heads not divisible", smallConfig(), 4, ErrBadConfig},
		{"FFN not divisible", Config{Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, FFNDim: 66}, 4, ErrBadConfig},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs, err := tp.NewLocalGroup(c.world, tp.Config{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := NewShard(c.cfg, rs[0]); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	t.Run("nil reducer", func(t *testing.T) {
		if _, err := NewShard(smallConfig(), nil); !errors.Is(err, ErrBadConfig) {
			t.Fatalf("got %v", err)
		}
	})
}

// TestShardPeerGone: a rank whose peer aborted fails its forward with the
// tp error instead of hanging.
func TestShardPeerGone(t *testing.T) {
	rs, err := tp.NewLocalGroup(2, tp.Config{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewShard(smallConfig(), rs[0])
	if err != nil {
		t.Fatal(err)
	}
	kv, err := kvcache.Create("", m.KVLayout(4, testBlock, kvcache.F32))
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	rs[1].Abort()
	_, err = m.Prefill(kv, PrefillInput{Tokens: randTokens(1, 20), BlockTable: table(0, 2)})
	if !errors.Is(err, tp.ErrAborted) {
		t.Fatalf("got %v, want tp.ErrAborted", err)
	}
}
