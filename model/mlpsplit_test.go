package model

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/internal/testmodel"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/quant"
	"github.com/cacheblend/cacheblend/tp"
)

// TestMLPHalves checks the MLP cut in two halves of FFN columns (a prefill
// chunk of splitRows rows or more) against the same layers computed in one
// product over gate|up rows stored in halves (chunks of fewer rows, and
// decode), and against a tensor-parallel shard (whose gate|up rows are
// picked across the halves): the same logits within float rounding.
func TestMLPHalves(t *testing.T) {
	vocab := refVocab(t, "llama-spm")
	for _, tc := range []struct {
		name  string
		spec  testmodel.Spec
		split int
		// layerTol bounds one layer's MLP over the same rows in halves
		// against one product: float rounding (the halves add their sums
		// to the residual in two steps where a product tile of fewer than
		// six rows added one), and the F16 product's rounded activations.
		layerTol float64
		// tol bounds the logits of a 100-row prefill (halves) against
		// 40-row chunks: the layers' rounding differences, through the
		// 8-bit activations of the next products, may round some of them
		// the other way (1e-2 for the Q4_K_M mixture); F16's move by up
		// to 3e-4 between two chunkings of the prompt already.
		tol   float64
		shard bool // checked against a shard of two ranks too
		// heavy cases (quantizing and running a 512-wide Q4_K model) are
		// left to the run without -race (make test's second run), like the
		// comparisons with llama.cpp: a minute under the race detector.
		heavy bool
	}{
		// Q8_0 blocks of 32: FFN 4160 = 130 blocks, cut at 65.
		{"Q8_0", testmodel.Spec{Type: quant.Q8_0, FFNDim: 4160}, 2080, 1e-5, 1e-5, true, false},
		// Q4_K super-blocks of 256: FFN 4352 = 17, cut at 9 (uneven
		// halves; 2,176 columns a rank would not fall on the blocks).
		{"Q4_K", testmodel.Spec{Dim: 256, Type: quant.Q4_K, OutType: quant.Q6_K, FFNDim: 4352}, 2304, 1e-5, 1e-5, false, true},
		// F16: any column; FFN 4100 cut at 2050.
		{"F16", testmodel.Spec{Type: quant.F16, FFNDim: 4100}, 2050, 1e-4, 1e-3, true, false},
		// A mixture whose down rows are Q6_K in some layers, sharded.
		{"Q4_K_M mixture", testmodel.Spec{Layers: 4, Dim: 512, Heads: 4, KVHeads: 2, Type: quant.Q4_K, OutType: quant.Q6_K, FFNDim: 4608, TensorType: q4KMMixture}, 2304, 1e-5, 3e-2, true, true},
		// SmolLM2-135M's width, splitMinFFN: 48 blocks cut at 24.
		{"Q8_0 1536", testmodel.Spec{Type: quant.Q8_0, FFNDim: 1536}, 768, 1e-5, 1e-5, false, false},
		// Below splitMinFFN: one product.
		{"Q8_0 narrow", testmodel.Spec{Type: quant.Q8_0, FFNDim: 1024}, 0, 0, 0, false, false},
	} {
		if tc.heavy && raceEnabled {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.VocabFile = vocab
			_, m := loadFile(t, tc.spec)
			for l, lw := range m.layers {
				if lw.split != tc.split {
					t.Fatalf("layer %d split at %d, want %d", l, lw.split, tc.split)
				}
			}
			// One layer's MLP over the same rows: 100 at once (halves when
			// split) against 40-row chunks (one product each).
			const n = 100
			r := rand.New(rand.NewPCG(3, 4))
			d := m.cfg.Dim
			for l := range m.layers {
				h, x0 := make([]float32, n*d), make([]float32, n*d)
				for i := range h {
					h[i], x0[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
				}
				one, chunked := slices.Clone(x0), slices.Clone(x0)
				ws := m.getWS()
				if err := m.mlp(ws, &m.layers[l], dense(one, n, d), dense(h, n, d)); err != nil {
					t.Fatal(err)
				}
				for c0 := 0; c0 < n; c0 += 40 {
					c1 := min(n, c0+40)
					if err := m.mlp(ws, &m.layers[l], dense(chunked[c0*d:c1*d], c1-c0, d), dense(h[c0*d:c1*d], c1-c0, d)); err != nil {
						t.Fatal(err)
					}
				}
				m.putWS(ws)
				if dd := relDiff(one, chunked); dd > tc.layerTol {
					t.Errorf("layer %d: the MLP of 100 rows differs from 40-row chunks' by %.3g relative", l, dd)
				}
				if relDiff(one, x0) < 0.01 {
					t.Fatalf("layer %d: the MLP hardly moved the residual", l)
				}
			}

			toks := randTokens(7, n)
			bt := table(0, blocksFor(n))
			run := func(chunk int) []float32 {
				kv := newKV(t, m, blocksFor(n))
				var out []float32
				for s := 0; s < n; s += chunk {
					l, err := m.Prefill(kv, PrefillInput{Tokens: toks[s:min(n, s+chunk)], Start: s, BlockTable: bt})
					if err != nil {
						t.Fatal(err)
					}
					out = l
				}
				return out
			}
			halves := run(n) // 100 rows: two halves
			whole := run(40) // 40-row chunks: one product each
			if d := relDiff(halves, whole); d > tc.tol {
				t.Errorf("halves differ from one product by %.3g relative", d)
			}
			// Not a model that says the same whatever the prompt.
			toks[n-1]++
			if d := relDiff(halves, run(n)); d < 0.1 {
				t.Fatalf("another prompt's logits differ by only %.3g relative", d)
			}
			toks[n-1]--
			if !tc.shard {
				return
			}

			// A shard of two ranks picks its gate|up rows across the halves:
			// rank r's are the file's gate rows [r·f, (r+1)·f), then its
			// up rows, and its logits are the whole model's within the
			// rounding of a sharded quantized model (1.5e-2 for this
			// mixture without the halves, from the partial sums' order and
			// the 8-bit activations downstream).
			rs, err := tp.NewLocalGroup(2, tp.Config{Timeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			got := make([][]float32, 2)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for rank := range 2 {
				s, err := m.Shard(rs[rank])
				if err != nil {
					t.Fatal(err)
				}
				checkShardGU(t, m, s, rank)
				kv, err := kvcache.Create("", s.KVLayout(blocksFor(n), testBlock, kvcache.F32))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { kv.Close() })
				wg.Go(func() { got[rank], errs[rank] = s.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: bt}) })
			}
			wg.Wait()
			for rank := range 2 {
				if errs[rank] != nil {
					t.Fatalf("rank %d: %v", rank, errs[rank])
				}
				if d := relDiff(got[rank], halves); d > 3e-2 {
					t.Errorf("rank %d differs from the whole model by %.3g relative", rank, d)
				}
			}
		})
	}
}

// TestGURanges checks where guRanges finds gate and up rows, with and
// without the halves.
func TestGURanges(t *testing.T) {
	for _, tc := range []struct {
		split, f0, f1, ffn int
		want               string
	}{
		{0, 0, 8, 16, "[[0 8] [16 24]]"},
		{0, 8, 16, 16, "[[8 16] [24 32]]"},
		{8, 0, 8, 12, "[[0 8] [8 16]]"},                   // the first half
		{8, 8, 12, 12, "[[16 20] [20 24]]"},               // the second
		{8, 6, 10, 12, "[[6 8] [16 18] [14 16] [20 22]]"}, // across the cut
	} {
		lw := layerWeights{split: tc.split}
		if got := fmt.Sprint(lw.guRanges(tc.f0, tc.f1, tc.ffn)); got != tc.want {
			t.Errorf("split %d, rows [%d, %d) of %d: %s, want %s", tc.split, tc.f0, tc.f1, tc.ffn, got, tc.want)
		}
	}
}

// checkShardGU checks that shard s (rank of two) of m holds, in every
// layer, the file's gate rows of its FFN columns followed by its up rows.
func checkShardGU(t *testing.T, m, s *Model, rank int) {
	t.Helper()
	f := s.cfg.FFNDim
	for l, lw := range s.layers {
		if lw.split != 0 || lw.gu.q.n != 2*f {
			t.Fatalf("rank %d layer %d: split %d, %d gate|up rows, want 0 and %d", rank, l, lw.split, lw.gu.q.n, 2*f)
		}
		for h, name := range []string{"ffn_gate", "ffn_up"} {
			ti, ok := m.file.Tensor(fmt.Sprintf("blk.%d.%s.weight", l, name))
			if !ok {
				t.Fatalf("no %s in layer %d", name, l)
			}
			data := m.file.Data(ti)
			rb := len(data) / m.cfg.FFNDim
			for i := range f {
				want := data[(rank*f+i)*rb:]
				if got := lw.gu.q.rowAt(h*f + i); &got[0] != &want[0] || len(got) != rb {
					t.Fatalf("rank %d layer %d: %s row %d is not the file's row %d", rank, l, name, i, rank*f+i)
				}
			}
		}
	}
}
