package llamabench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/internal/llamaref"
	"github.com/cacheblend/cacheblend/quant"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTensorType checks llama-quantize's Q4_K_M mixture (llama.cpp's
// llama_tensor_get_type) and the fallbacks for rows that cannot hold
// K-quant blocks.
func TestTensorType(t *testing.T) {
	cases := []struct {
		name, format, tensor string
		in, layers           int
		tied                 bool
		want                 quant.Type
	}{
		{"f16 everything", "f16", "blk.3.attn_q.weight", 2048, 16, true, quant.F16},
		{"q8_0 head", "q8_0", "output.weight", 2048, 16, false, quant.Q8_0},
		{"q4_k_m q", "q4_k_m", "blk.5.attn_q.weight", 2048, 16, true, quant.Q4_K},
		{"q4_k_m v first eighth", "q4_k_m", "blk.0.attn_v.weight", 2048, 16, true, quant.Q6_K},
		{"q4_k_m v layer 2", "q4_k_m", "blk.2.attn_v.weight", 2048, 16, true, quant.Q4_K},
		{"q4_k_m v layer 4 (every third)", "q4_k_m", "blk.4.attn_v.weight", 2048, 16, true, quant.Q6_K},
		{"q4_k_m down last eighth", "q4_k_m", "blk.15.ffn_down.weight", 8192, 16, true, quant.Q6_K},
		{"q4_k_m gate never", "q4_k_m", "blk.0.ffn_gate.weight", 2048, 16, true, quant.Q4_K},
		{"q4_k_m tied embedding is the head", "q4_k_m", "token_embd.weight", 2048, 16, true, quant.Q6_K},
		{"q4_k_m untied embedding", "q4_k_m", "token_embd.weight", 2048, 16, false, quant.Q4_K},
		{"q4_k_m 896-wide falls back to Q5_0", "q4_k_m", "blk.5.attn_q.weight", 896, 24, true, quant.Q5_0},
		{"q4_k_m 896-wide Q6_K falls back to Q8_0", "q4_k_m", "token_embd.weight", 896, 24, true, quant.Q8_0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := TensorType(tc.format, tc.tensor, tc.in, tc.layers, tc.tied)
			if err != nil || got != tc.want {
				t.Fatalf("TensorType = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	if _, err := TensorType("q3_k_s", "output.weight", 256, 1, false); err == nil {
		t.Fatal("unknown format: no error")
	}
	if _, err := ShapeByName("gpt-5"); err == nil {
		t.Fatal("unknown shape: no error")
	}
}

// TestRunSideBySide runs the whole benchmark, both engines, on a small
// shape (SmolLM2-135M's width and vocabulary, 2 layers) in Q4_K_M, and
// checks that every figure was measured, the file holds the mixture, and
// the tables name both engines.
func TestRunSideBySide(t *testing.T) {
	ref, err := llamaref.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	small := Shapes()[0]
	small.Name, small.Layers = "tiny", 2
	dir := t.TempDir()
	cfg := Config{
		Dir: dir, Threads: 2, Reps: 2, Prompts: []int{64, 128},
		DecodeContext: 32, DecodeSteps: 3, BatchSeqs: 3, BatchContext: 16,
		RAGDocs: 2, RAGDocLen: 64, RAGQuestion: 16,
	}
	cfg = cfg.withDefaults()
	path, err := Generate(cfg.Dir, cfg.VocabDir, small, "q4_k_m")
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	types := map[quant.Type]bool{}
	for _, ti := range f.Tensors {
		types[ti.Type] = true
	}
	f.Close()
	if !types[quant.Q5_0] || !types[quant.Q8_0] || !types[quant.Q4_K] {
		t.Fatalf("576-wide Q4_K_M file types %v: want Q5_0 (fallback), Q8_0 (head fallback) and Q4_K (1536-wide down)", types)
	}
	st, _ := os.Stat(path)
	again, err := Generate(cfg.Dir, cfg.VocabDir, small, "q4_k_m")
	if st2, _ := os.Stat(again); err != nil || !st2.ModTime().Equal(st.ModTime()) {
		t.Fatalf("second Generate rewrote the file (%v)", err)
	}

	r, err := runFile(cfg, small, "q4_k_m", path, ref)
	if err != nil {
		t.Fatal(err)
	}
	for name, side := range map[string]*Side{"ours": &r.Ours, "llama.cpp": r.Llama} {
		if side == nil {
			t.Fatalf("%s: not run", name)
		}
		all := append([]Stat{side.Decode1, side.DecodeN, side.RAG}, side.Prefill...)
		for i, s := range all {
			if s.N == 0 || s.Min <= 0 || s.Min > s.Median || s.Median > s.Max || s.Max > time.Minute {
				t.Fatalf("%s: figure %d = %+v", name, i, s)
			}
		}
		if len(side.Prefill) != 2 || side.RSS <= 0 || side.KVBytes <= 0 || side.Decode1BandwidthGBs <= 0 {
			t.Fatalf("%s: %+v", name, side)
		}
		// Batch 1 in cfg.DecodeRounds rounds (3 here, of one timed step after a warm-up).
		if side.Decode1.N != cfg.DecodeRounds*cfg.decode1PerRound() || side.DecodeN.N != cfg.DecodeSteps {
			t.Fatalf("%s: %d batch-1 steps in %d rounds, %d batch-%d steps", name, side.Decode1.N, cfg.DecodeRounds, side.DecodeN.N, cfg.BatchSeqs)
		}
	}
	// The rounds alternate after one bandwidth reading: both sides hold it.
	if r.Llama.Decode1BandwidthGBs != r.Ours.Decode1BandwidthGBs {
		t.Fatalf("batch-1 bandwidth ours %v, llama.cpp %v: not the one reading", r.Ours.Decode1BandwidthGBs, r.Llama.Decode1BandwidthGBs)
	}
	if r.RAGTokens != 2*64+16 || r.RAGReused != 2*64 {
		t.Fatalf("RAG prompt %d tokens, %d reused", r.RAGTokens, r.RAGReused)
	}
	if r.StepBytes <= 0 || r.StepBytes > r.FileBytes {
		t.Fatalf("step bytes %d of a %d-byte file", r.StepBytes, r.FileBytes)
	}
	// The timed batch-1 steps, at positions 33, 35 and 37 (one after each
	// round's warm-up), attend to 34, 36 and 38 positions: 36 on average,
	// K and V of every layer, F16 on both sides.
	wantKV := int64(36) * int64(r.Shape.Layers) * 2 * int64(r.Shape.KVHeads*(r.Shape.Dim/r.Shape.Heads)) * 2
	if r.Ours.Decode1KVBytes != wantKV || r.Llama.Decode1KVBytes != wantKV {
		t.Fatalf("batch-1 K/V bytes ours %d, llama.cpp %d, want %d", r.Ours.Decode1KVBytes, r.Llama.Decode1KVBytes, wantKV)
	}
	var md, js bytes.Buffer
	mc := Machine{CPU: "test", Cores: 2, Threads: 2, PeakGFLOPs: 100, BandwidthGBs: 10}
	if err := WriteMarkdown(&md, mc, cfg, []Result{r}); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&js, mc, cfg, []Result{r}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| tiny | q4_k_m |", "llama.cpp", "Prefill", "Decode", "RAG first token"} {
		if !strings.Contains(md.String(), want) {
			t.Fatalf("tables lack %q:\n%s", want, md.String())
		}
	}
	if !strings.Contains(js.String(), `"Median"`) || strings.Contains(md.String(), "| – | – |") || strings.Contains(md.String(), "/ –") {
		t.Fatalf("report incomplete:\n%s\n%s", md.String(), js.String())
	}
	if filepath.Dir(path) != dir {
		t.Fatalf("file written to %s, not %s", path, dir)
	}
}

// TestRunBandwidth: the run's highest and lowest bandwidth and the count
// take every reading (machine, each file's start, each engine's batch-1
// decode) and skip the unmeasured.
func TestRunBandwidth(t *testing.T) {
	mc := Machine{BandwidthGBs: 30}
	cases := []struct {
		name      string
		rs        []Result
		high, low float64
		n         int
	}{
		{"machine only", nil, 30, 30, 1},
		{"file start lower", []Result{{BandwidthGBs: 20}}, 30, 20, 2},
		{"our decode highest", []Result{{BandwidthGBs: 25, Ours: Side{Decode1BandwidthGBs: 50}}}, 50, 25, 3},
		{"llama.cpp's lowest", []Result{{BandwidthGBs: 25, Ours: Side{Decode1BandwidthGBs: 28}, Llama: &Side{Decode1BandwidthGBs: 12}}}, 30, 12, 4},
		{"one reading for both engines", []Result{{BandwidthGBs: 25, Ours: Side{Decode1BandwidthGBs: 40}, Llama: &Side{Decode1BandwidthGBs: 40}}}, 40, 25, 3},
		{"unmeasured skipped", []Result{{Llama: &Side{}}}, 30, 30, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			high, low, n := RunBandwidth(mc, tc.rs)
			if high != tc.high || low != tc.low || n != tc.n {
				t.Fatalf("RunBandwidth = %v, %v, %d; want %v, %v, %d", high, low, n, tc.high, tc.low, tc.n)
			}
		})
	}
}

// TestRunRefusesUnknownLlamaKVType: a llama.cpp KV cache type whose size
// the bandwidth figure does not know is refused before any file is made
// (it was counted as F16 bytes).
func TestRunRefusesUnknownLlamaKVType(t *testing.T) {
	for _, kv := range []string{"q4_0", "F16", "q8"} {
		cfg := Config{Dir: t.TempDir(), VocabDir: t.TempDir()}
		cfg.Llama.KVType = kv
		if _, err := Run(cfg, nil); err == nil || !strings.Contains(err.Error(), strconv.Quote(kv)) {
			t.Errorf("Run with llama.cpp KV type %q: %v, want an error naming it", kv, err)
		}
	}
	for _, tc := range []struct {
		kv   string
		want int64
	}{{"", 2}, {"f16", 2}, {"bf16", 2}, {"f32", 4}} {
		s := Shape{Layers: 1, KVHeads: 1, Dim: 64, Heads: 1}
		if got := llamaTokenBytes(s, tc.kv); got != 2*64*tc.want {
			t.Errorf("llamaTokenBytes(%q) = %d, want %d", tc.kv, got, 2*64*tc.want)
		}
	}
	if got := llamaTokenBytes(Shape{Layers: 1, KVHeads: 1, Dim: 64, Heads: 1}, "q8_0"); got != 2*2*34 {
		t.Errorf("llamaTokenBytes(q8_0) = %d, want %d", got, 2*2*34)
	}
}
