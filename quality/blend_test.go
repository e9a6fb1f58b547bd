package quality

import (
	"math/rand/v2"
	"testing"

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
