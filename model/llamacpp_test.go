//go:build !race

// The comparison with llama.cpp is numerical work against another process:
// the race detector adds nothing to it and makes it ten times slower, so it
// is built without -race only and `make test` runs it in a run of its own
// (the Makefile's unit target).

package model

import (
	"cmp"
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cacheblend/cacheblend/internal/llamaref"
	"github.com/cacheblend/cacheblend/internal/testmodel"
	"github.com/cacheblend/cacheblend/quant"
)

// teacherForced returns the model's logits for the distributions of tokens
// [p, len(toks)): a prefill of toks[:p], then one decode step per token.
func teacherForced(t testing.TB, m *Model, toks []int32, p int) [][]float32 {
	t.Helper()
	kv := newKV(t, m, blocksFor(len(toks))+1)
	bt := table(0, blocksFor(len(toks))+1)
	first, err := m.Prefill(kv, PrefillInput{Tokens: toks[:p], BlockTable: bt})
	if err != nil {
		t.Fatal(err)
	}
	out := [][]float32{first}
	for i := p; i < len(toks)-1; i++ {
		l, err := m.Decode(kv, []DecodeInput{{Token: toks[i], Pos: i, BlockTable: bt}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l[0])
	}
	return out
}

func logSoftmax(x []float32) []float64 {
	mx := float64(slices.Max(x))
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	ls := math.Log(s) + mx
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - ls
	}
	return out
}

func argmax64(x []float64) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// TestAgainstLlamaCpp loads the same GGUF file in llama.cpp (through
// node-llama-cpp) and in Load, feeds both the same prompt and llama.cpp's
// greedy continuation (teacher forcing), and compares the next-token
// distributions: float files within 1e-3 (F32) or 1e-2 (F16/BF16) on
// llama.cpp's top 20 log-probabilities with the same 32 greedy tokens,
// quantized files by mean KL(llama.cpp ‖ ours) ≤ 0.01 and top-1
// agreement ≥ 0.98 over 64 steps. The weights are scaled so the
// distributions are peaked and the continuation differs between prompts
// (checked first: a model that always says the same thing proves nothing).
func TestAgainstLlamaCpp(t *testing.T) {
	ctx := context.Background()
	ref, err := llamaref.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	const steps = 64
	cases := []struct {
		name  string
		spec  testmodel.Spec
		tol   float64 // max |Δ logprob| on the top 20; 0: KL / top-1 criteria
		vocab string
	}{
		{"llama F32", testmodel.Spec{Arch: "llama", Type: quant.F32, RopeFreqs: true}, 1e-3, "llama-spm"},
		{"llama F32 tied, llama3 vocab", testmodel.Spec{Arch: "llama", Type: quant.F32, Tied: true, Theta: 500000}, 1e-3, "llama-bpe"},
		{"qwen2 F32", testmodel.Spec{Arch: "qwen2", Type: quant.F32, Theta: 1000000}, 1e-3, "qwen2"},
		{"llama F16", testmodel.Spec{Arch: "llama", Type: quant.F16}, 1e-2, "llama-spm"},
		// BF16: llama.cpp rounds the activations of every product to bf16
		// (8 significant bits), as the model does (actround.go); where the
		// two float32 sums differ in their last bit across a bf16 rounding
		// boundary (a few steps in 64), one activation differs by a bf16
		// ulp and the step's log-probabilities by up to ~5e-2; every other
		// step agrees within 1e-4 (checked: at least 3/4 of the steps).
		{"llama BF16", testmodel.Spec{Arch: "llama", Type: quant.BF16}, 6e-2, "llama-spm"},
		{"llama Q8_0", testmodel.Spec{Arch: "llama", Type: quant.Q8_0}, 0, "llama-spm"},
		{"llama Q4_K_M", testmodel.Spec{Arch: "llama", Dim: 256, Heads: 4, KVHeads: 2, FFNDim: 512, Type: quant.Q4_K, OutType: quant.Q6_K}, 0, "llama-spm"},
		{"qwen2 Q4_K_M", testmodel.Spec{Arch: "qwen2", Dim: 256, Heads: 4, KVHeads: 2, FFNDim: 512, Type: quant.Q4_K, OutType: quant.Q6_K}, 0, "llama-spm"},
		// FFN 4352: the gate|up rows stored in uneven halves (2,304 |
		// 2,048), as Qwen2.5-0.5B's and Llama-3.2-1B's are.
		{"llama Q4_K_M, gate|up in halves", testmodel.Spec{Arch: "llama", Dim: 256, Heads: 4, KVHeads: 2, FFNDim: 4352, Type: quant.Q4_K, OutType: quant.Q6_K}, 0, "llama-spm"},
		{"qwen2 Q6_K", testmodel.Spec{Arch: "qwen2", Dim: 256, Heads: 4, KVHeads: 2, FFNDim: 512, Type: quant.Q6_K}, 0, "llama-spm"},
		// llama-quantize's Q4_K_M mixture: attn_v and ffn_down Q6_K in some
		// layers (here 2 and 3 of 4), so one stacked Q|K|V projection mixes
		// Q4_K and Q6_K rows.
		{"llama Q4_K_M mixture", testmodel.Spec{Arch: "llama", Layers: 4, Dim: 256, Heads: 4, KVHeads: 2, FFNDim: 512, Type: quant.Q4_K, OutType: quant.Q6_K, TensorType: q4KMMixture}, 0, "llama-spm"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.VocabFile = refVocab(t, tc.vocab)
			path, m := loadFile(t, tc.spec)
			vocab := m.Config().Vocab
			rng := rand.New(rand.NewPCG(uint64(len(tc.name)), 3))
			prompt := func() []int32 {
				p := make([]int32, 24)
				for i := range p {
					p[i] = int32(1000 + rng.IntN(vocab-1000))
				}
				return p
			}
			p1, p2 := prompt(), prompt()
			g1, err := ref.Greedy(path, p1, steps, 2)
			if err != nil {
				t.Fatal(err)
			}
			g2, err := ref.Greedy(path, p2, steps, 2)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Equal(g1, g2) {
				t.Fatalf("degenerate model: two prompts, one greedy continuation %v", g1[:8])
			}
			toks := append(slices.Clone(p1), g1...)
			positions := make([]int, steps)
			for i := range positions {
				positions[i] = len(p1) - 1 + i
			}
			want, err := ref.Logits(path, toks, positions, 2)
			if err != nil {
				t.Fatal(err)
			}
			got := teacherForced(t, m, toks, len(p1))
			var klSum float64
			agree, exact, maxDiff, peak := 0, 0, 0.0, 0.0
			for s := range steps {
				lw, lg := logSoftmax(want[s]), logSoftmax(got[s])
				var kl float64
				for i, v := range lw {
					kl += math.Exp(v) * (v - lg[i])
				}
				klSum += kl
				if argmax64(lw) == argmax64(lg) {
					agree++
				}
				peak += math.Exp(lw[argmax64(lw)])
				order := make([]int, len(lw))
				for i := range order {
					order[i] = i
				}
				slices.SortFunc(order, func(a, b int) int { return cmp.Compare(lw[b], lw[a]) })
				sd := 0.0
				for _, i := range order[:20] {
					sd = max(sd, math.Abs(lw[i]-lg[i]))
				}
				if sd <= 1e-4 {
					exact++
				}
				maxDiff = max(maxDiff, sd)
			}
			meanKL, top1 := klSum/steps, float64(agree)/steps
			if peak/steps < 0.3 {
				t.Errorf("flat distributions (mean top-1 probability %.2f): a comparison that proves little", peak/steps)
			}
			t.Logf("%s: max|Δlogprob| top20 %.2e (steps within 1e-4: %d/%d), mean KL %.2e, top-1 agreement %.3f, mean top-1 prob %.2f",
				tc.name, maxDiff, exact, steps, meanKL, top1, peak/steps)
			if tc.tol > 0 {
				if maxDiff > tc.tol {
					t.Errorf("max |Δ logprob| on llama.cpp's top 20 = %.3g > %.0e", maxDiff, tc.tol)
				}
				if tc.spec.Type == quant.BF16 && exact < steps*3/4 {
					t.Errorf("only %d of %d steps within 1e-4 of llama.cpp", exact, steps)
				}
				// Greedy decoding from the prompt gives the same 32 tokens.
				ours, _ := sampleN(t, m, p1, 32, SamplingParams{}, nil)
				if !slices.Equal(ours, g1[:32]) {
					t.Errorf("greedy tokens differ:\nours  %v\nllama %v", ours, g1[:32])
				}
				return
			}
			if meanKL > 0.01 || top1 < 0.98 {
				t.Errorf("mean KL %.4f (≤ 0.01), top-1 agreement %.3f (≥ 0.98)", meanKL, top1)
			}
		})
	}
}
