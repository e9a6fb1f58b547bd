package eval

import (
	"bytes"
	"fmt"
	"encoding/xml"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/model"
)

// A small built-in model: every configuration measured, ratio 1 is the
// full prefill (no drift), full reuse drifts, more recompute drifts less,
// and the table and the chart render (the chart is well-formed XML).
func TestRun(t *testing.T) {
	m, err := model.New(model.Config{Layers: 4, Dim: 64, Heads: 4, KVHeads: 2, FFNDim: 128, MaxPositions: 2048, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(m, "small", BuiltinPrompts(), Config{Ratios: []float64{0, 0.3, 1}, Prompts: 2, Docs: 2, Positions: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Points) != 4 {
		t.Fatalf("%d points, want 4 (full reuse, hkvd and random at 0.3, ratio 1): %+v", len(rep.Points), rep.Points)
	}
	byKey := map[string]Point{}
	for _, p := range rep.Points {
		byKey[fmt.Sprintf("%s/%g", p.Rule, p.Ratio)] = p
		if p.FullMs <= 0 || p.BlendMs <= 0 || p.Speedup <= 0 {
			t.Fatalf("timing of %+v", p)
		}
	}
	full, one, hk := byKey["full_reuse/0"], byKey["hkvd/1"], byKey["hkvd/0.3"]
	if one.FirstKL > 1e-9 || one.MeanKL > 1e-9 || one.Top1 != 1 || one.GreedyMatch != 1 {
		t.Fatalf("ratio 1 drifts: %+v", one)
	}
	if !(full.MeanKL > hk.MeanKL && hk.MeanKL > 0) {
		t.Fatalf("full reuse mean KL %g, ratio 0.3 %g: want full > 0.3 > 0", full.MeanKL, hk.MeanKL)
	}
	var tab, svg bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil || !strings.Contains(tab.String(), "full_reuse") {
		t.Fatalf("table %v:\n%s", err, tab.String())
	}
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&svg)
	for {
		if _, err := d.Token(); err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("chart is not XML: %v", err)
			}
			break
		}
	}
	if _, ok := rep.Cheapest("hkvd", 1e9); !ok {
		t.Fatal("no point under an infinite KL bound")
	}
}

