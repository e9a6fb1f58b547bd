package e2e

import (
	"testing"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/tracecheck"
)

// TestKVLoadOverlapsFirstLayers: a reused prompt prefilled in one step loads
// its KV while the worker recomputes the layers below the check layer. The
// trace shows it: cb.start_load_kv (shifted_from_layer = the check layer)
// starts before cb.full_recomp ends, cb.check starts after cb.retrieve
// ended, and the blend server wrote the shifted tokens' KV of the layers
// from the check layer up only.
func TestKVLoadOverlapsFirstLayers(t *testing.T) {
	e := startEnv(t, options{})
	e.ingest()
	const tid = "5bf92f3577b34da6a3ce929d0e0e4736"
	e.chat("00-"+tid+"-00f067aa0ba902b7-01", ragPrompt(5, 2, 0), 2)
	tr := e.trace(tid, spanname.CBRequest, spanname.CBStartLoadKV, spanname.CBRetrieve, spanname.CBFullRecomp, spanname.CBCheck)
	checkContract(t, tr)
	spans := byName(tr)
	for _, name := range []string{spanname.CBStartLoadKV, spanname.CBRetrieve, spanname.CBFullRecomp, spanname.CBCheck} {
		if len(spans[name]) != 1 {
			t.Fatalf("%d %s spans, want 1", len(spans[name]), name)
		}
	}
	load, ret := spans[spanname.CBStartLoadKV][0], spans[spanname.CBRetrieve][0]
	full, check := spans[spanname.CBFullRecomp][0], spans[spanname.CBCheck][0]
	cfg := model.DefaultConfig()
	num := func(s *tracecheck.Span, key string) int {
		t.Helper()
		v, ok := s.Attributes[key].Number()
		if !ok {
			t.Fatalf("%s has no %s", s.Name, key)
		}
		return int(v)
	}
	if got := num(load, "shifted_from_layer"); got != cfg.CheckLayer {
		t.Fatalf("cb.start_load_kv shifted_from_layer %d, want the check layer %d", got, cfg.CheckLayer)
	}
	if got := num(ret, "shifted_from_layer"); got != cfg.CheckLayer {
		t.Fatalf("cb.retrieve shifted_from_layer %d, want %d", got, cfg.CheckLayer)
	}
	if !load.Start.Before(full.End) {
		t.Errorf("the load started at %v, after the first layers ended (%v): no overlap", load.Start, full.End)
	}
	if check.Start.Before(ret.End) {
		t.Errorf("cb.check started at %v, before the retrieve ended at %v", check.Start, ret.End)
	}
	prefix, shifted := num(ret, "n_prefix_tokens"), num(ret, "n_shifted_tokens")
	if shifted == 0 {
		t.Fatal("no shifted tokens loaded: the prompt reused nothing out of place")
	}
	want := 2 * (prefix*cfg.Layers + shifted*(cfg.Layers-cfg.CheckLayer))
	if got := num(ret, "slot_writes"); got != want {
		t.Errorf("slot_writes %d, want %d (%d prefix tokens × %d layers, %d shifted × %d)", got, want, prefix, cfg.Layers, shifted, cfg.Layers-cfg.CheckLayer)
	}
}
