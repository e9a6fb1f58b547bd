package worker

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/internal/llamaref"
	"github.com/cacheblend/cacheblend/internal/testmodel"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/tokenizer"
)

// mixedModel writes a GGUF test model on which CacheBlend is wrong by
// construction (testmodel.Spec.MixContext): every token's KV above the
// first layer averages everything before it.
func mixedModel(t *testing.T) string {
	t.Helper()
	src, err := llamaref.LlamaCppSource()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "mixed.gguf")
	if err := testmodel.Write(path, testmodel.Spec{Layers: 4, Dim: 64, Heads: 4, KVHeads: 2, FFNDim: 128, MixContext: true,
		VocabFile: filepath.Join(src, "models", "ggml-vocab-llama-spm.gguf")}); err != nil {
		t.Fatal(err)
	}
	return path
}

// The blend gate passes the built-in model, catches a model whose reused KV
// is useless, and can be forced either way; the engine learns the outcome
// from Info.
func TestBlendGate(t *testing.T) {
	mixed := mixedModel(t)
	tests := []struct {
		name    string
		path    string
		gate    string
		outcome string
		off     string // a substring of the reason; "" when blending stays on
	}{
		{"built-in model passes", "", GateAuto, gatePassed, ""},
		{"mixed-context model fails", mixed, GateAuto, gateFailed, "blend gate failed: mean KL"},
		{"forced off", "", GateOff, gateForcedOff, "forced off"},
		{"forced on", mixed, GateOn, gateForcedOn, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := startWith(t, Config{Quality: QualityConfig{Gate: tc.gate}}, func(c *Config) {
				if tc.path != "" {
					c.ModelPath, c.Model = tc.path, model.Config{}
				}
			})
			info, err := h.client.Info(context.Background(), &cbv1.InfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: gate %s, KL %.4g, off %q", tc.name, info.BlendGate, info.BlendGateKl, info.BlendOff)
			if info.BlendGate != tc.outcome || (tc.off == "") != (info.BlendOff == "") || !strings.Contains(info.BlendOff, tc.off) {
				t.Fatalf("gate %q, off %q; want %q, off containing %q", info.BlendGate, info.BlendOff, tc.outcome, tc.off)
			}
			if st := h.w.BlendStatus(); (tc.off == "") != strings.HasPrefix(st, "on") {
				t.Fatalf("blend status %q", st)
			}
			checked := tc.gate == GateAuto
			if checked != (info.BlendGateKl > 0) || (tc.outcome == gatePassed && info.BlendGateKl > DefaultBlendGateKL) {
				t.Fatalf("gate KL %v (checked %v)", info.BlendGateKl, checked)
			}
		})
	}
}

// BenchmarkBlendGate is the start-up time the gate adds with the default
// built-in model (goal: at most 2 s).
func BenchmarkBlendGate(b *testing.B) {
	m, err := model.New(model.Config{})
	if err != nil {
		b.Fatal(err)
	}
	var tok tokenizer.Tokenizer
	b.ReportAllocs()
	for b.Loop() {
		r, err := runGate(m, Config{}.withDefaults(), tok.Encode, tok.BOS())
		if err != nil || r.Outcome != gatePassed {
			b.Fatalf("%+v %v", r, err)
		}
		b.ReportMetric(r.KL, "kl")
	}
}
