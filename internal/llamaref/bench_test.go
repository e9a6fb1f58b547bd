package llamaref

import (
	"strings"
	"testing"
)

// TestBenchDecodeRounds: the steps after one BenchDecodeStart may run in
// several BenchDecodeMore calls (cb bench alternates them with its own),
// never more than the start made room for, never without a start, and a
// later benchmark of the model ends them.
func TestBenchDecodeRounds(t *testing.T) {
	ref := testRef(t)
	model := tinyModels(t)[0]
	ctx := [][]int32{evalTokens}
	step := func(toks ...int32) [][]int32 {
		out := make([][]int32, len(toks))
		for i, tk := range toks {
			out[i] = []int32{tk}
		}
		return out
	}
	if _, err := ref.BenchDecodeMore(model, step(13)); err == nil || !strings.Contains(err.Error(), "bench_decode_start") {
		t.Fatalf("more before any start: %v", err)
	}
	if err := ref.BenchDecodeStart(model, ctx, 5, BenchOptions{Threads: 1}); err != nil {
		t.Fatal(err)
	}
	for _, round := range [][][]int32{step(13, 278), step(3186, 29892, 445)} {
		d, err := ref.BenchDecodeMore(model, round)
		if err != nil {
			t.Fatal(err)
		}
		if len(d) != len(round) {
			t.Fatalf("%d steps timed, want %d", len(d), len(round))
		}
		for i, x := range d {
			if x <= 0 {
				t.Fatalf("step %d took %v", i, x)
			}
		}
	}
	if _, err := ref.BenchDecodeMore(model, step(13)); err == nil || !strings.Contains(err.Error(), "room for 0") {
		t.Fatalf("a sixth step after a start for five: %v", err)
	}
	// A start for two sequences needs a token per sequence in every step.
	if err := ref.BenchDecodeStart(model, [][]int32{evalTokens, evalTokens[:4]}, 2, BenchOptions{Threads: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ref.BenchDecodeMore(model, step(13)); err == nil {
		t.Fatal("one token for two sequences accepted")
	}
	if _, err := ref.BenchPrefill(model, evalTokens, 1, BenchOptions{Threads: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ref.BenchDecodeMore(model, [][]int32{{13, 13}}); err == nil {
		t.Fatal("steps after a prefill benchmark replaced the context")
	}
}
