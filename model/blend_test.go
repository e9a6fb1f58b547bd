package model

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/reuseplan"
)

// blendFixture is a prompt of a few new tokens, three documents and a
// question, with a KV memory large enough for the prompt (region A), a
// second copy of it (region B) and the documents stored alone (region S).
type blendFixture struct {
	m      *Model
	kv     *kvcache.Memory
	toks   []int32
	docs   []reuseplan.Range // document ranges in the prompt
	a, b   []int32           // two prompt-sized block tables
	stores [][]int32
	full   []float32 // logits of a full prefill of the prompt (region A)
}

func newBlendFixture(t *testing.T) *blendFixture {
	t.Helper()
	return newBlendFixtureSeed(t, smallConfig().Seed)
}

func newBlendFixtureSeed(t *testing.T, seed uint64) *blendFixture {
	t.Helper()
	return newBlendFixtureDocs(t, seed, 40)
}

// newBlendFixtureDocs is the fixture with documents of docLen tokens.
func newBlendFixtureDocs(t *testing.T, seed uint64, docLen int) *blendFixture {
	t.Helper()
	cfg := smallConfig()
	cfg.Seed = seed
	m := newModel(t, cfg)
	f := &blendFixture{m: m}
	const sys, q = 7, 12
	f.toks = append(f.toks, randTokens(50, sys)...)
	var docToks [][]int32
	for d := range 3 {
		doc := randTokens(uint64(60+d), docLen)
		docToks = append(docToks, doc)
		f.docs = append(f.docs, reuseplan.Range{Start: len(f.toks), End: len(f.toks) + docLen})
		f.toks = append(f.toks, doc...)
	}
	f.toks = append(f.toks, randTokens(70, q)...)
	pb, db := blocksFor(len(f.toks)), blocksFor(docLen)
	f.kv = newKV(t, m, 2*pb+3*db)
	f.a, f.b = table(0, pb), table(pb, pb)
	for d := range 3 {
		st := table(2*pb+d*db, db)
		f.stores = append(f.stores, st)
		if _, err := m.Prefill(f.kv, PrefillInput{Tokens: docToks[d], BlockTable: st}); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	f.full, err = m.Prefill(f.kv, PrefillInput{Tokens: f.toks, BlockTable: f.a})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// loadExact copies region A's K/V of the reused ranges into region B
// (exact reuse: same context, same positions).
func (f *blendFixture) loadExact(ranges []reuseplan.Range) {
	for _, r := range ranges {
		copyKV(f.m, f.kv, f.a, r.Start, f.b, r.Start, r.Len())
	}
}

// loadShifted scatters every document's stand-alone K/V (computed at
// positions 0..) into region B at its prompt position, re-RoPE'ing K.
func (f *blendFixture) loadShifted() {
	for d, r := range f.docs {
		copyKV(f.m, f.kv, f.stores[d], 0, f.b, r.Start, r.Len())
	}
}

func (f *blendFixture) blend(t *testing.T, prefix int, reused []reuseplan.Range, ratio float64) ([]float32, BlendStats) {
	t.Helper()
	logits, st, err := f.m.BlendForward(f.kv, BlendInput{
		Tokens: f.toks, BlockTable: f.b, PrefixReused: prefix, Reused: reused,
		CheckLayer: UseConfig, RecompRatio: ratio,
	})
	if err != nil {
		t.Fatal(err)
	}
	return logits, st
}

// (a) With RecompRatio 1 every token is recomputed: the blend equals a full
// prefill even when the loaded K/V are wrong.
func TestBlendRatioOneEqualsFull(t *testing.T) {
	f := newBlendFixture(t)
	f.loadShifted()
	got, st := f.blend(t, 0, f.docs, 1)
	if d := maxAbsDiff(got, f.full); d >= 1e-3 {
		t.Fatalf("ratio 1 blend differs from full prefill by %g", d)
	}
	if st.ImpCount != len(f.toks) || st.ImpEmpty || !st.Blended {
		t.Fatalf("stats %+v", st)
	}
}

// (b) With exact reused K/V the blend equals a full prefill at any ratio.
func TestBlendExactReuseEqualsFull(t *testing.T) {
	f := newBlendFixture(t)
	for _, ratio := range []float64{0, 0.15, 0.5} {
		f.loadExact(f.docs)
		got, st := f.blend(t, 0, f.docs, ratio)
		if d := maxAbsDiff(got, f.full); d >= 1e-3 {
			t.Errorf("ratio %v: exact-reuse blend differs from full prefill by %g", ratio, d)
		}
		reused := 3 * f.docs[0].Len()
		sel := int(math.Ceil(ratio * float64(reused)))
		if st.ReusedTokens != reused || st.NewTokens != len(f.toks)-reused || st.ImpCount != st.NewTokens+sel ||
			st.Selected != sel || st.ImpEmpty != (sel == 0) || st.RecompRatio != ratio || st.CheckLayer != 1 {
			t.Errorf("ratio %v: stats %+v", ratio, st)
		}
		if st.Dispatch != "unified" || st.FullRecompStart.IsZero() || st.PartialEnd.Before(st.PartialStart) ||
			st.CheckStart.Before(st.FullRecompEnd) || st.PartialStart.Before(st.CheckEnd) {
			t.Errorf("ratio %v: phase times %+v", ratio, st)
		}
	}
}

// (c) Documents prefilled alone, moved to new positions (K re-RoPE'd): the
// blend deviates from a full prefill, and recomputing 15% of the reused
// tokens deviates less than recomputing none.
func TestBlendShiftedDocumentsRecomputeHelps(t *testing.T) {
	f := newBlendFixture(t)
	dev, rms := map[float64]float64{}, map[float64]float64{}
	for _, ratio := range []float64{0, 0.15} {
		f.loadShifted()
		got, _ := f.blend(t, 0, f.docs, ratio)
		dev[ratio] = maxAbsDiff(got, f.full)
		rms[ratio] = rmsDiff(got, f.full)
	}
	t.Logf("max |logit - full prefill|: ratio 0 = %.5f, ratio 0.15 = %.5f", dev[0], dev[0.15])
	t.Logf("rms  logit - full prefill : ratio 0 = %.5f, ratio 0.15 = %.5f", rms[0], rms[0.15])
	if dev[0] == 0 {
		t.Fatal("stand-alone documents reproduce the full prefill exactly: the test has no cross-attention to repair")
	}
	if !(dev[0.15] < dev[0]) || !(rms[0.15] < rms[0]) {
		t.Fatalf("ratio 0.15 deviation (max %.5f, rms %.5f) is not below ratio 0 (max %.5f, rms %.5f)", dev[0.15], rms[0.15], dev[0], rms[0])
	}
}

// A prompt of more than mlpRows rows: the check layer measures its
// deviations mlpRows rows at a time; recomputing every token still equals
// a full prefill, and a partial recompute still repairs shifted documents.
func TestBlendLongPrompt(t *testing.T) {
	f := newBlendFixtureDocs(t, smallConfig().Seed, 200)
	if n := len(f.toks); n <= mlpRows {
		t.Fatalf("prompt of %d tokens: not more than %d", n, mlpRows)
	}
	got, st := f.blend(t, 0, f.docs, 1)
	if d := maxAbsDiff(got, f.full); d >= 1e-3 {
		t.Fatalf("ratio 1 blend differs from full prefill by %g", d)
	}
	if st.ImpCount != len(f.toks) {
		t.Fatalf("ratio 1 recomputed %d of %d tokens", st.ImpCount, len(f.toks))
	}
	dev := map[float64]float64{}
	for _, ratio := range []float64{0, 0.15} {
		f.loadShifted()
		got, _ := f.blend(t, 0, f.docs, ratio)
		dev[ratio] = rmsDiff(got, f.full)
	}
	if dev[0] == 0 || !(dev[0.15] < dev[0]) {
		t.Fatalf("rms deviation from full prefill: ratio 0.15 %g, ratio 0 %g", dev[0.15], dev[0])
	}
}

// (d) Prefix skip with exact prefix K/V equals a full prefill, with and
// without reused ranges after the prefix.
func TestBlendPrefixSkip(t *testing.T) {
	f := newBlendFixture(t)
	n := f.docs[1].Start
	f.loadExact([]reuseplan.Range{{Start: 0, End: n}})
	got, st := f.blend(t, n, nil, UseConfig)
	if d := maxAbsDiff(got, f.full); d >= 1e-3 {
		t.Fatalf("prefix skip differs from full prefill by %g", d)
	}
	if st.PrefixTokens != n || st.Blended || st.ImpCount != len(f.toks)-n || st.ReusedTokens != 0 {
		t.Fatalf("stats %+v", st)
	}
	f.loadExact([]reuseplan.Range{{Start: 0, End: n}, f.docs[2]})
	got, st = f.blend(t, n, []reuseplan.Range{f.docs[2]}, 0.15)
	if d := maxAbsDiff(got, f.full); d >= 1e-3 {
		t.Fatalf("prefix + exact reuse differs from full prefill by %g", d)
	}
	if st.PrefixTokens != n || !st.Blended || st.ReusedTokens != f.docs[2].Len() {
		t.Fatalf("stats %+v", st)
	}
	// The whole prompt cached: only the last token is recomputed.
	f.loadExact([]reuseplan.Range{{Start: 0, End: len(f.toks)}})
	got, st = f.blend(t, len(f.toks), nil, UseConfig)
	if d := maxAbsDiff(got, f.full); d >= 1e-3 {
		t.Fatalf("fully cached prompt differs from full prefill by %g", d)
	}
	if st.ImpCount != 1 {
		t.Fatalf("fully cached prompt recomputed %d tokens", st.ImpCount)
	}
}

// The last prompt token is always important, even inside a reused range and
// at ratio 0.
func TestBlendLastTokenAlwaysImportant(t *testing.T) {
	f := newBlendFixture(t)
	all := []reuseplan.Range{{Start: 0, End: len(f.toks)}}
	f.loadExact(all)
	got, st := f.blend(t, 0, all, 0)
	if st.ImpCount != 1 || st.Selected != 1 || st.NewTokens != 0 || st.ImpEmpty {
		t.Fatalf("stats %+v", st)
	}
	if d := maxAbsDiff(got, f.full); d >= 1e-3 {
		t.Fatalf("differs from full prefill by %g", d)
	}
}

// Check layer 0 (no full-recompute layers) and the last layer still work.
func TestBlendCheckLayerBounds(t *testing.T) {
	f := newBlendFixture(t)
	for _, cl := range []int{0, f.m.Config().Layers - 1} {
		f.loadExact(f.docs)
		got, st, err := f.m.BlendForward(f.kv, BlendInput{Tokens: f.toks, BlockTable: f.b, Reused: f.docs, CheckLayer: cl, RecompRatio: 0.15})
		if err != nil {
			t.Fatal(err)
		}
		if d := maxAbsDiff(got, f.full); d >= 1e-3 || st.CheckLayer != cl {
			t.Fatalf("check layer %d: diff %g, stats %+v", cl, d, st)
		}
	}
}

// poisonB fills region B's K and V with NaN in every layer: whatever the
// forward reads there before writing it shows up in the logits.
func (f *blendFixture) poisonB() {
	bs := f.kv.Layout().BlockSize
	for l := range f.m.Config().Layers {
		for p := range len(f.toks) {
			s, _ := kvcache.Slot(f.b, p, bs)
			for _, x := range [][]float32{f.kv.TokenK(l, s), f.kv.TokenV(l, s)} {
				for i := range x {
					x[i] = float32(math.NaN())
				}
			}
		}
	}
}

// TestBlendAwait: a load that runs concurrently with the layers below the
// check layer (writing only layers >= cl, called late through Await) gives
// the same logits as the load done before the forward, bit for bit; what it
// could not load is computed like new tokens; its error fails the forward.
func TestBlendAwait(t *testing.T) {
	cl := smallConfig().CheckLayer
	f := newBlendFixture(t)
	// loadFrom scatters the documents of loaded from layer cl, as the blend
	// server does with RetrieveRequest.shifted_from_layer.
	loadFrom := func(loaded []reuseplan.Range) {
		for d, r := range f.docs {
			if slices.Contains(loaded, r) {
				copyKVFrom(f.m, f.kv, cl, f.stores[d], 0, f.b, r.Start, r.Len())
			}
		}
	}
	tests := []struct {
		name     string
		loaded   []reuseplan.Range // what the load manages
		awaitErr error
	}{
		{"every planned range loaded", f.docs, nil},
		{"one document missing", []reuseplan.Range{f.docs[0], f.docs[2]}, nil},
		{"nothing loaded", nil, nil},
		{"load failed", nil, errors.New("blend server gone")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Reference: the same loaded ranges scattered before the forward.
			f.poisonB()
			loadFrom(tc.loaded)
			var want []float32
			if tc.awaitErr == nil {
				want, _ = f.blend(t, 0, tc.loaded, 0.15)
			}

			f.poisonB()
			calls := 0
			got, st, err := f.m.BlendForward(f.kv, BlendInput{
				Tokens: f.toks, BlockTable: f.b, Reused: f.docs, CheckLayer: UseConfig, RecompRatio: 0.15,
				Await: func() ([]reuseplan.Range, error) {
					calls++
					loadFrom(tc.loaded)
					return tc.loaded, tc.awaitErr
				},
			})
			if calls != 1 {
				t.Fatalf("Await called %d times", calls)
			}
			if tc.awaitErr != nil {
				if !errors.Is(err, tc.awaitErr) {
					t.Fatalf("err = %v, want the load's error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !allFinite(got) {
				t.Fatal("logits not finite: the forward read KV before the load wrote it")
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("logit %d: %v with Await, %v with the load done first", i, got[i], want[i])
				}
			}
			reused := 0
			for _, r := range tc.loaded {
				reused += r.Len()
			}
			if st.ReusedTokens != reused || st.NewTokens != len(f.toks)-reused || st.AwaitEnd.IsZero() ||
				st.AwaitEnd.Before(st.FullRecompEnd) || st.CheckStart.Before(st.AwaitEnd) {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}
