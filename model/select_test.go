package model

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/cacheblend/cacheblend/reuseplan"
)

// Prefill's trailing logits equal the last logits of prefills of the
// prompt's prefixes (each position's next-token distribution), and
// BlendForward's, at ratio 1, equal Prefill's.
func TestTrailingLogits(t *testing.T) {
	f := newBlendFixture(t)
	const k = 4
	n, v := len(f.toks), f.m.cfg.Vocab
	all, err := f.m.Prefill(f.kv, PrefillInput{Tokens: f.toks, BlockTable: f.a, Logits: k})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != k*v {
		t.Fatalf("%d logits, want %d", len(all), k*v)
	}
	for i := range k {
		end := n - k + 1 + i
		one, err := f.m.Prefill(f.kv, PrefillInput{Tokens: f.toks[:end], BlockTable: f.b})
		if err != nil {
			t.Fatal(err)
		}
		if d := maxAbsDiff(all[i*v:(i+1)*v], one); d >= 1e-3 {
			t.Fatalf("row %d (position %d) differs from the prefill of %d tokens by %g", i, end-1, end, d)
		}
	}
	f.loadShifted()
	got, st, err := f.m.BlendForward(f.kv, BlendInput{Tokens: f.toks, BlockTable: f.b, Reused: f.docs,
		CheckLayer: UseConfig, RecompRatio: 1, Logits: k})
	if err != nil {
		t.Fatal(err)
	}
	if d := maxAbsDiff(got, all); len(got) != k*v || d >= 1e-3 {
		t.Fatalf("ratio-1 blend's %d trailing logits differ from the prefill's by %g", len(got)/v, d)
	}
	if !st.Blended {
		t.Fatalf("stats %+v", st)
	}
	for _, bad := range []int{-1, n + 1} {
		if _, err := f.m.Prefill(f.kv, PrefillInput{Tokens: f.toks, BlockTable: f.a, Logits: bad}); !errors.Is(err, ErrInput) {
			t.Errorf("Logits %d: err %v, want ErrInput", bad, err)
		}
	}
}

// The trailing positions whose logits are returned are recomputed even
// when reused: with a document at the end of the prompt, asking for its
// last 3 positions' logits selects them.
func TestTrailingLogitsAreImportant(t *testing.T) {
	f := newBlendFixture(t)
	doc := reuseplan.Range{Start: len(f.toks) - 10, End: len(f.toks)}
	f.loadExact([]reuseplan.Range{doc})
	_, st, err := f.m.BlendForward(f.kv, BlendInput{Tokens: f.toks, BlockTable: f.b, Reused: []reuseplan.Range{doc},
		CheckLayer: UseConfig, RecompRatio: 0, Logits: 3})
	if err != nil {
		t.Fatal(err)
	}
	if st.Selected != 3 || st.ImpCount != len(f.toks)-10+3 {
		t.Fatalf("stats %+v, want 3 selected", st)
	}
}

// SelectRandom picks other tokens than the deviation rule at the same
// ratio, the same tokens for the same seed, and on shifted documents the
// deviation rule repairs more of the full prefill than random tokens do
// (CacheBlend's claim, on the test model: measured over seeds, not once).
func TestSelectRandom(t *testing.T) {
	f := newBlendFixture(t)
	run := func(sel Selection, seed uint64, ratio float64) []float32 {
		t.Helper()
		f.loadShifted()
		got, st, err := f.m.BlendForward(f.kv, BlendInput{Tokens: f.toks, BlockTable: f.b, Reused: f.docs,
			CheckLayer: UseConfig, RecompRatio: ratio, Select: sel, SelectSeed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if want := int(math.Ceil(ratio * 120)); st.Selected != want {
			t.Fatalf("%v: %d selected, want %d", sel, st.Selected, want)
		}
		return got
	}
	const ratio = 0.15
	a, b, c := run(SelectRandom, 1, ratio), run(SelectRandom, 1, ratio), run(SelectRandom, 2, ratio)
	if d := maxAbsDiff(a, b); d != 0 {
		t.Fatalf("same seed, different logits (%g)", d)
	}
	if maxAbsDiff(a, c) == 0 {
		t.Fatal("seeds 1 and 2 gave the same logits: the rule ignores its seed")
	}
	hkvd := rmsDiff(run(SelectDeviation, 0, ratio), f.full)
	var random float64
	const seeds = 8
	for s := range uint64(seeds) {
		random += rmsDiff(run(SelectRandom, s+10, ratio), f.full) / seeds
	}
	t.Logf("rms logit deviation from full prefill at ratio %v: hkvd %.5f, random (mean of %d seeds) %.5f", ratio, hkvd, seeds, random)
	if !(hkvd < random) {
		t.Fatalf("HKVD deviation %.5f is not below random selection's %.5f", hkvd, random)
	}
	if _, _, err := f.m.BlendForward(f.kv, BlendInput{Tokens: f.toks, BlockTable: f.b, Reused: f.docs,
		CheckLayer: UseConfig, RecompRatio: ratio, Select: 7}); !errors.Is(err, ErrInput) {
		t.Fatalf("unknown rule: err %v", err)
	}
	if fmt.Sprint(SelectDeviation, SelectRandom) != "hkvd random" {
		t.Fatal(fmt.Sprint(SelectDeviation, SelectRandom))
	}
}
