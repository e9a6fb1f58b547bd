package model

import (
	"fmt"
	"testing"

	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/simd"
)

// simdRun is every output of one forward workload at one kernel level.
type simdRun struct {
	prefill, chunked, blend []float32
	decode                  [][]float32
}

// runWorkload runs, with the kernels at level l, a full prefill, a chunked
// prefill, a decode batch of three sequences and a CacheBlend forward with
// shifted documents, each on a fresh KV memory.
func runWorkload(t *testing.T, cfg Config, n int, l simd.Level) simdRun {
	t.Helper()
	prev, err := simd.SetLevel(l)
	if err != nil {
		t.Fatal(err)
	}
	defer simd.SetLevel(prev)
	m := newModel(t, cfg)
	toks := randTokens(11, n)
	var out simdRun
	kv := newKV(t, m, 4*blocksFor(n+1))
	bt := table(0, blocksFor(n+1))
	if out.prefill, err = m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: bt}); err != nil {
		t.Fatal(err)
	}
	bt2 := table(blocksFor(n+1), blocksFor(n+1))
	cut := n - n/3
	if _, err = m.Prefill(kv, PrefillInput{Tokens: toks[:cut], BlockTable: bt2}); err != nil {
		t.Fatal(err)
	}
	if out.chunked, err = m.Prefill(kv, PrefillInput{Tokens: toks[cut:], Start: cut, BlockTable: bt2}); err != nil {
		t.Fatal(err)
	}
	// Decode: both prefilled sequences and a third, short one.
	bt3 := table(2*blocksFor(n+1), blocksFor(n+1))
	if _, err = m.Prefill(kv, PrefillInput{Tokens: toks[:5], BlockTable: bt3}); err != nil {
		t.Fatal(err)
	}
	if out.decode, err = m.Decode(kv, []DecodeInput{
		{Token: 'a', Pos: n, BlockTable: bt}, {Token: 'b', Pos: n, BlockTable: bt2}, {Token: 'c', Pos: 5, BlockTable: bt3},
	}); err != nil {
		t.Fatal(err)
	}
	// Blend: the prompt's middle third reused from a stand-alone prefill,
	// moved to its position.
	bt4 := table(3*blocksFor(n+1), blocksFor(n+1))
	r := reuseplan.Range{Start: n / 3, End: cut}
	if _, err = m.Prefill(kv, PrefillInput{Tokens: toks[r.Start:r.End], BlockTable: bt4}); err != nil {
		t.Fatal(err)
	}
	blendBT := bt3 // reuse the short sequence's blocks for the blend prompt
	copyKV(m, kv, bt4, 0, blendBT, r.Start, r.Len())
	if out.blend, _, err = m.BlendForward(kv, BlendInput{Tokens: toks, BlockTable: blendBT, Reused: []reuseplan.Range{r},
		CheckLayer: UseConfig, RecompRatio: UseConfig}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSIMDMatchesPureGo checks that the logits computed with every
// assembly level this CPU has (AVX2, AVX-512) equal those of the pure-Go
// kernels within 1e-4 of the largest logit, for prefill, chunked prefill,
// decode and the CacheBlend forward, on shapes that exercise the tiling
// edges (head sizes 16, 24, 32 and 64, groups of 2 and 4 query heads, odd
// FFN widths, prompts longer than one attention block and not a multiple
// of any tile). The shapes are small so the pure-Go reference stays quick
// under the race detector.
func TestSIMDMatchesPureGo(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		n    int
	}{
		{"small_hd16", smallConfig(), 133},
		{"hd32_gqa4", Config{Layers: 2, Dim: 128, Heads: 4, KVHeads: 1, FFNDim: 96, Seed: 3}, 141},
		{"odd_ffn_hd24_gqa2", Config{Layers: 2, Dim: 96, Heads: 4, KVHeads: 2, FFNDim: 100, Seed: 5}, 77},
		{"hd64", Config{Layers: 2, Dim: 128, Heads: 2, KVHeads: 1, FFNDim: 72, Seed: 9}, 90},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ref := runWorkload(t, tc.cfg, tc.n, simd.Generic)
			for _, l := range []simd.Level{simd.AVX2, simd.AVX512} {
				if !simd.Supported(l) {
					continue
				}
				got := runWorkload(t, tc.cfg, tc.n, l)
				check := func(what string, a, b []float32) {
					t.Helper()
					d := relDiff(a, b)
					t.Logf("%v %s: max |Δlogit| = %.3g of the largest", l, what, d)
					if d > 1e-4 {
						t.Errorf("%v %s: logits differ from pure Go by %.3g of the largest", l, what, d)
					}
				}
				check("prefill", got.prefill, ref.prefill)
				check("chunked", got.chunked, ref.chunked)
				check("blend", got.blend, ref.blend)
				for i := range ref.decode {
					check(fmt.Sprintf("decode %d", i), got.decode[i], ref.decode[i])
				}
			}
		})
	}
}
