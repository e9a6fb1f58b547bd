package model

import (
	"testing"

	"github.com/cacheblend/cacheblend/internal/testmodel"
	"github.com/cacheblend/cacheblend/quant"
	"github.com/cacheblend/cacheblend/simd"
)

// integerTop is the highest level with integer kernels here: AVX-512 with
// VNNI, else AVX2 (the levels the integer-level tests compare).
func integerTop(t *testing.T) simd.Level {
	t.Helper()
	if !simd.Supported(simd.AVX2) {
		t.Fatal("this test needs a CPU with AVX2 (its kernels are what it checks)")
	}
	if simd.Supported(simd.AVX512) && quant.IntegerDots() {
		return simd.AVX512
	}
	return simd.AVX2
}

// TestDecodeIntegerLevels checks the decode step of one sequence with
// quantized weights at every kernel level: at the AVX2 level it takes the
// integer kernels (quant.IntegerGEMV: VPMADDUBSW) for Q8_0, Q5_0, Q4_0,
// Q4_K and Q6_K rows, as the AVX-512 level does with VNNI; the pure-Go
// level dequantizes and multiplies in float32 activations rounded as
// llama.cpp rounds them (actround.go). All compute the same products up
// to float summation order, so their logits agree within 1e-5 of the
// largest. Each level decodes after the same prefill (computed at the
// highest level), and the logits of two prompts differ, so agreeing is
// not trivial.
func TestDecodeIntegerLevels(t *testing.T) {
	top := integerTop(t)
	prev, err := simd.SetLevel(simd.AVX2)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q5_0, quant.Q4_0, quant.Q4_K, quant.Q6_K} {
		if !quant.IntegerGEMV(typ) {
			t.Errorf("no integer decode kernel for %s at the AVX2 level", typ)
		}
	}
	simd.SetLevel(prev)
	vocab := refVocab(t, "llama-spm")
	for _, tc := range []struct {
		name string
		spec testmodel.Spec
	}{
		{"Q8_0", testmodel.Spec{Type: quant.Q8_0, FFNDim: 192}},
		{"Q5_0, Q8_0 output", testmodel.Spec{Type: quant.Q5_0, OutType: quant.Q8_0, FFNDim: 192}},
		{"Q4_0", testmodel.Spec{Type: quant.Q4_0, FFNDim: 192}},
		{"Q4_K_M mixture", testmodel.Spec{Layers: 4, Dim: 256, Heads: 4, KVHeads: 2, Type: quant.Q4_K, OutType: quant.Q6_K, FFNDim: 512, TensorType: q4KMMixture}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.VocabFile = vocab
			_, m := loadFile(t, tc.spec)
			const n = 40
			decode := func(seed uint64, l simd.Level) []float32 {
				t.Helper()
				prev, err := simd.SetLevel(top)
				if err != nil {
					t.Fatal(err)
				}
				defer simd.SetLevel(prev)
				kv := newKV(t, m, blocksFor(n+1))
				bt := table(0, blocksFor(n+1))
				if _, err := m.Prefill(kv, PrefillInput{Tokens: randTokens(seed, n), BlockTable: bt}); err != nil {
					t.Fatal(err)
				}
				if _, err := simd.SetLevel(l); err != nil {
					t.Fatal(err)
				}
				out, err := m.Decode(kv, []DecodeInput{{Token: 7, Pos: n, BlockTable: bt}})
				if err != nil {
					t.Fatal(err)
				}
				return out[0]
			}
			ref := decode(1, top)
			if d := relDiff(decode(2, top), ref); d < 0.05 {
				t.Fatalf("two prompts' logits differ by only %.3g relative", d)
			}
			for _, l := range []simd.Level{simd.AVX2, simd.Generic} {
				if l == top {
					continue
				}
				d := relDiff(decode(1, l), ref)
				t.Logf("%s against %s: %.3g relative", l, top, d)
				if !(d <= 1e-5) {
					t.Errorf("decode at %s differs from %s by %.3g relative", l, top, d)
				}
			}
		})
	}
}

// TestPrefillIntegerLevels checks a prefill of more than qIntRows tokens
// (the integer GEMM's products, quant.IntegerGEMM) with quantized weights:
// the AVX2 level's half-panel tile kernels (VPMADDUBSW) and the AVX-512
// level's VNNI ones compute the same integer sums and scale them in the
// same order, so the last position's logits agree within 1e-5 of the
// largest (measured 2–4e-7); two prompts' logits differ, so agreeing is
// not trivial. The pure-Go level (activations rounded as llama.cpp rounds
// them, then float32 products) is compared on the small 32-element-format
// models only: on the 256-wide K-quant model the float products' other
// summation order flips an activation's rounding now and then, and four
// random layers amplify the flip (measured: 4e-7 to 1.6e-2 depending on the
// prompt's length), while quant's TestGemm checks the kernels themselves
// against the reference dequantization.
func TestPrefillIntegerLevels(t *testing.T) {
	top := integerTop(t)
	prev, err := simd.SetLevel(simd.AVX2)
	if err != nil {
		t.Fatal(err)
	}
	if !quant.IntegerGEMM() {
		t.Errorf("no integer GEMM at the AVX2 level")
	}
	simd.SetLevel(prev)
	vocab := refVocab(t, "llama-spm")
	for _, tc := range []struct {
		name    string
		spec    testmodel.Spec
		generic bool // compare the pure-Go level too
	}{
		{"Q8_0", testmodel.Spec{Type: quant.Q8_0, FFNDim: 192}, true},
		{"Q5_0, Q8_0 output", testmodel.Spec{Type: quant.Q5_0, OutType: quant.Q8_0, FFNDim: 192}, true},
		{"Q4_0", testmodel.Spec{Type: quant.Q4_0, FFNDim: 192}, true},
		{"Q4_K_M mixture", testmodel.Spec{Layers: 4, Dim: 256, Heads: 4, KVHeads: 2, Type: quant.Q4_K, OutType: quant.Q6_K, FFNDim: 512, TensorType: q4KMMixture}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.VocabFile = vocab
			_, m := loadFile(t, tc.spec)
			const n = 3*qIntRows + 5
			prefill := func(seed uint64, l simd.Level) []float32 {
				t.Helper()
				prev, err := simd.SetLevel(l)
				if err != nil {
					t.Fatal(err)
				}
				defer simd.SetLevel(prev)
				kv := newKV(t, m, blocksFor(n))
				out, err := m.Prefill(kv, PrefillInput{Tokens: randTokens(seed, n), BlockTable: table(0, blocksFor(n))})
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			ref := prefill(1, top)
			if d := relDiff(prefill(2, top), ref); d < 0.05 {
				t.Fatalf("two prompts' logits differ by only %.3g relative", d)
			}
			levels := []simd.Level{simd.AVX2}
			if tc.generic {
				levels = append(levels, simd.Generic)
			}
			compared := 0
			for _, l := range levels {
				if l == top {
					continue
				}
				compared++
				d := relDiff(prefill(1, l), ref)
				t.Logf("%s against %s: %.3g relative", l, top, d)
				if !(d <= 1e-5) {
					t.Errorf("prefill at %s differs from %s by %.3g relative", l, top, d)
				}
			}
			if compared == 0 {
				t.Fatalf("no level to compare with %s on this CPU (the K-quant case needs AVX-512 VNNI beside AVX2)", top)
			}
		})
	}
}
