package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// builtinPrompts are the English sentences TestBuiltinNotDegenerate
// continues (byte tokens).
var builtinPrompts = []string{
	"The quick brown fox jumps over the lazy dog.",
	"In 1492, Columbus sailed across the Atlantic Ocean",
	"Please summarise the following document in three sentences:",
	"def fibonacci(n):\n    return n if n < 2 else",
	"The capital of France is",
	"Once upon a time, in a land far away, there lived",
	"SELECT name, age FROM users WHERE",
	"Water boils at one hundred degrees Celsius at sea level",
}

func bytesOf(s string) []int32 {
	t := make([]int32, len(s))
	for i := range len(s) {
		t[i] = int32(s[i])
	}
	return t
}

// softmaxTop1 is the largest probability of softmax(logits).
func softmaxTop1(logits []float32) float64 {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = max(mx, float64(v))
	}
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v) - mx)
	}
	return 1 / sum
}

// sampleN decodes n tokens after prompt with Sample(p, rng) (greedy for
// the zero p); top1 is the top-1 probability at the first output.
func sampleN(t testing.TB, m *Model, prompt []int32, n int, p SamplingParams, rng *rand.Rand) (out []int32, top1 float64) {
	t.Helper()
	total := len(prompt) + n
	kv := newKV(t, m, blocksFor(total)+1)
	bt := table(0, blocksFor(total)+1)
	l, err := m.Prefill(kv, PrefillInput{Tokens: prompt, BlockTable: bt})
	if err != nil {
		t.Fatal(err)
	}
	top1 = softmaxTop1(l)
	for i := range n {
		tok := Sample(l, p, rng)
		out = append(out, tok)
		ls, err := m.Decode(kv, []DecodeInput{{Token: tok, Pos: len(prompt) + i, BlockTable: bt}})
		if err != nil {
			t.Fatal(err)
		}
		l = ls[0]
	}
	return out, top1
}

// ragText is s as a retrieval prompt presents a document: the instruction,
// the document and a question every prompt shares.
func ragText(s string) string {
	return "Answer using only these documents.\n\n" + s + "\n\nQuestion: summarize this document in one sentence."
}

// chatWrap is s as the engine's chat template and BOS present it to the
// model: every such prompt ends with the same "\n<|assistant|>\n".
func chatWrap(s string) []int32 {
	return append([]int32{256}, bytesOf("<|user|>\n"+s+"\n<|assistant|>\n")...)
}

// TestBuiltinNotDegenerate proves the built-in model (New) behaves enough
// like a trained model for "same greedy output" tests to mean something:
// greedy continuations of different prompts differ (also when the prompts
// share the chat template's ending, or a 70-byte question after a
// document, as the e2e RAG prompts do), are not one repeated token, the
// next-token distribution is peaked but not one-hot, and sampling at
// temperature 2 varies with the seed. The sizes are the served default and
// the small models the unit and e2e tests run.
func TestBuiltinNotDegenerate(t *testing.T) {
	const steps = 12
	tests := []struct {
		name    string
		cfg     Config
		minTop1 [3]float64 // lower bounds of the mean top-1 probability: raw, chat, rag prompts
		prompts int        // how many of builtinPrompts
	}{
		// Measured (raw, chat) with the LM head's scale builtinHeadStd = 4:
		// default 0.517, 0.390; small 0.31, 0.18; worker/e2e small 0.42,
		// 0.51 (with 2.5, where the bounds were set: default 0.252, 0.181,
		// rag 0.121). Uniform would be 1/258 = 0.004.
		{"default", Config{}, [3]float64{0.2, 0.15, 0.1}, 8},
		{"small", smallConfig(), [3]float64{0.12, 0.07, 0.09}, 8},
		{"worker and e2e small", Config{Layers: 4, Dim: 64, Heads: 4, KVHeads: 2, FFNDim: 128}, [3]float64{0.2, 0.18, 0.18}, 8},
	}
	if raceEnabled {
		tests[0].prompts = 4 // the default size is slow under the race detector
		tests[0].minTop1 = [3]float64{0.15, 0.12, 0.08}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newModel(t, tc.cfg)
			for f, form := range []struct {
				name string
				wrap func(string) []int32
			}{
				{"raw", bytesOf},
				{"chat", chatWrap},
				// A document before a 70-byte ending every prompt shares:
				// the context, not the last tokens, must set the answer.
				{"rag", func(s string) []int32 { return chatWrap(ragText(s)) }},
			} {
				var top1 float64
				distinct := map[string]bool{}
				first := map[int32]bool{}
				prompts := builtinPrompts[:tc.prompts]
				for _, s := range prompts {
					g, p1 := sampleN(t, m, form.wrap(s), steps, SamplingParams{}, nil)
					top1 += p1
					distinct[string(toBytes(g))] = true
					first[g[0]] = true
					counts := map[int32]int{}
					for _, tok := range g {
						counts[tok]++
					}
					if len(counts) < 4 {
						t.Errorf("%s %q: greedy continuation %q has %d distinct tokens", form.name, s, toBytes(g), len(counts))
					}
				}
				top1 /= float64(len(prompts))
				t.Logf("%s prompts: %d/%d distinct greedy continuations (%d distinct first tokens), mean top-1 probability at the first output %.3f",
					form.name, len(distinct), len(prompts), len(first), top1)
				if len(distinct) < len(prompts)*3/4 {
					t.Errorf("%s prompts: only %d distinct greedy continuations of %d prompts", form.name, len(distinct), len(prompts))
				}
				if top1 < tc.minTop1[f] || top1 > 0.97 {
					t.Errorf("%s prompts: mean top-1 probability %.3f, want in [%.2f, 0.97] (peaked, not one-hot)", form.name, top1, tc.minTop1[f])
				}
			}
			// Temperature 2: three seeds give three different continuations,
			// and none is the greedy one.
			prompt := bytesOf(builtinPrompts[0])
			g, _ := sampleN(t, m, prompt, steps, SamplingParams{}, nil)
			seen := map[string]bool{}
			for seed := range uint64(3) {
				s, _ := sampleN(t, m, prompt, steps, SamplingParams{Temperature: 2}, rand.New(rand.NewPCG(seed, 9)))
				if slices.Equal(s, g) {
					t.Errorf("seed %d: temperature 2 gave the greedy continuation", seed)
				}
				seen[string(toBytes(s))] = true
			}
			if len(seen) < 3 {
				t.Errorf("temperature 2: %d distinct continuations of 3 seeds", len(seen))
			}
		})
	}
}

// toBytes renders token ids as bytes (ids ≥ 256 as '?').
func toBytes(toks []int32) []byte {
	b := make([]byte, len(toks))
	for i, t := range toks {
		if t < 256 {
			b[i] = byte(t)
		} else {
			b[i] = '?'
		}
	}
	return b
}
