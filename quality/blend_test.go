package quality

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/model"
)

func smallModel(t *testing.T) *model.Model {
	t.Helper()
	m, err := model.New(model.Config{Layers: 4, Dim: 64, Heads: 4, KVHeads: 2, FFNDim: 128, MaxPositions: 1024, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func randDoc(r *rand.Rand, n int) []int32 {
	d := make([]int32, n)
	for i := range d {
		d[i] = int32(r.IntN(256))
	}
	return d
}

func testCase(seed uint64) Case {
	r := rand.New(rand.NewPCG(seed, 3))
	return Case{Prefix: randDoc(r, 9), Docs: [][]int32{randDoc(r, 48), randDoc(r, 40), randDoc(r, 56)}, Question: randDoc(r, 14)}
}

// A full recompute is the full prefill; full reuse drifts from it; the
// default ratio drifts less than none; K positions are compared.
func TestBlend(t *testing.T) {
	m := smallModel(t)
	c := testCase(1)
	tests := []struct {
		name  string
		opt   Options
		check func(t *testing.T, r Report)
	}{
		{"ratio 1 is the full prefill", Options{Ratio: 1, Positions: 4}, func(t *testing.T, r Report) {
			if r.Positions != 4 || r.MaxKL > 1e-6 || r.Top1 != 1 || r.GreedyMatch != 4 {
				t.Fatalf("%+v", r)
			}
		}},
		{"full reuse drifts", Options{Ratio: 0}, func(t *testing.T, r Report) {
			if r.Positions != 1 || r.FirstKL <= 1e-6 {
				t.Fatalf("%+v", r)
			}
		}},
		// On an F16 cache both forwards read rounded KV: a full recompute
		// still matches, and a blend drifts as on float32.
		{"f16: ratio 1 is the full prefill", Options{Ratio: 1, Positions: 4, KVType: kvcache.F16}, func(t *testing.T, r Report) {
			if r.Positions != 4 || r.MaxKL > 1e-6 || r.Top1 != 1 || r.GreedyMatch != 4 {
				t.Fatalf("%+v", r)
			}
		}},
		{"f16: full reuse drifts as on float32", Options{Ratio: 0, KVType: kvcache.F16}, func(t *testing.T, r Report) {
			f32, err := Blend(m, c, Options{Ratio: 0})
			if err != nil {
				t.Fatal(err)
			}
			if r.FirstKL <= 1e-6 || math.Abs(r.FirstKL-f32.FirstKL) > 0.05*f32.FirstKL {
				t.Fatalf("first-token KL %g on F16, %g on float32", r.FirstKL, f32.FirstKL)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Blend(m, c, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, r)
		})
	}
	none, err := Blend(m, c, Options{Ratio: 0, Positions: 8})
	if err != nil {
		t.Fatal(err)
	}
	some, err := Blend(m, c, Options{Ratio: 0.3, Positions: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mean KL over 8 positions: ratio 0 %.5f, ratio 0.3 %.5f", none.MeanKL, some.MeanKL)
	if !(some.MeanKL < none.MeanKL) {
		t.Fatalf("recomputing 30%% (mean KL %g) does not beat none (%g)", some.MeanKL, none.MeanKL)
	}
	if _, err := Blend(m, Case{Question: []int32{1, 2}}, Options{}); err == nil {
		t.Fatal("a case without documents compared")
	}
}

// A Checker's snapshot is a copy: what happens to the served KV after
// Snapshot does not change the comparison; the memory grows for a longer
// prompt and is reused.
func TestChecker(t *testing.T) {
	m := smallModel(t)
	c := NewChecker(m, kvcache.F32)
	defer c.Close()
	if _, err := c.Compare(); err == nil {
		t.Fatal("compare without a snapshot")
	}
	for _, n := range []int{40, 120} {
		prompt := randDoc(rand.New(rand.NewPCG(uint64(n), 9)), n)
		kv, err := kvcache.Create("", m.KVLayout(16, 16, kvcache.F32))
		if err != nil {
			t.Fatal(err)
		}
		bt := blocks(3, blocksFor(n))
		logits, err := m.Prefill(kv, model.PrefillInput{Tokens: prompt, BlockTable: bt})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Snapshot(kv, bt, prompt, logits, 3); err != nil {
			t.Fatal(err)
		}
		for l := range m.Config().Layers { // the served KV is gone
			clear(kv.K(l))
			clear(kv.V(l))
		}
		kv.Close()
		r, err := c.Compare()
		if err != nil {
			t.Fatal(err)
		}
		if r.Positions != 3 || r.MaxKL > 1e-6 || r.GreedyMatch != 3 {
			t.Fatalf("%d tokens: a full prefill served compares as %+v", n, r)
		}
	}
	kv, _ := kvcache.Create("", m.KVLayout(4, 16, kvcache.F32))
	defer kv.Close()
	if err := c.Snapshot(kv, []int32{9}, []int32{1, 2}, make([]float32, m.Config().Vocab), 1); err == nil {
		t.Fatal("a block outside the memory accepted")
	}
}

// Reserve makes the memory ready for prompts up to its size: a Snapshot
// within it keeps the memory (only copies), a longer one grows it.
func TestCheckerReserve(t *testing.T) {
	m := smallModel(t)
	c := NewChecker(m, kvcache.F32)
	defer c.Close()
	if err := c.Reserve(200, 4); err != nil {
		t.Fatal(err)
	}
	reserved := c.own
	kv, err := kvcache.Create("", m.KVLayout(40, 16, kvcache.F32))
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	for _, tc := range []struct {
		name string
		n    int
		same bool
	}{
		{"within the reservation", 150, true},
		{"at its size", 200, true},
		{"longer: grown", 400, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prompt := randDoc(rand.New(rand.NewPCG(uint64(tc.n), 3)), tc.n)
			bt := blocks(0, blocksFor(tc.n))
			logits, err := m.Prefill(kv, model.PrefillInput{Tokens: prompt, BlockTable: bt})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Snapshot(kv, bt, prompt, logits, 4); err != nil {
				t.Fatal(err)
			}
			if (c.own == reserved) != tc.same {
				t.Fatalf("memory kept %v, want %v", c.own == reserved, tc.same)
			}
			if r, err := c.Compare(); err != nil || r.MaxKL > 1e-6 {
				t.Fatalf("compare %+v %v", r, err)
			}
		})
	}
}
