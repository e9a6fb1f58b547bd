package worker

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/model"
)

// The online quality check: a sampled prefill's served KV is snapshotted,
// compared off the step with a full prefill (cb.quality, the root of its
// own trace, linked to the request's span), and a second sample inside the
// checker's budget is dropped and counted.
func TestOnlineQualityCheck(t *testing.T) {
	h := start(t, Config{Quality: QualityConfig{SampleRate: 1, Budget: 0.01, Positions: 3}})
	w := h.w
	<-w.quality.ready // the checker's memory is made ready at start; samples wait for it
	p := prompt(100)
	bt := blocks(2, 7)
	logits, err := w.model.Prefill(w.kv, model.PrefillInput{Tokens: p, BlockTable: bt})
	if err != nil {
		t.Fatal(err)
	}
	_, fwd := w.spans.Start(context.Background(), "request forward")
	fwd.End()
	stats := model.BlendStats{RecompRatio: 0.15, Selected: 7, Blended: true}
	w.execMu.Lock()
	w.sampleQuality("q1", p, bt, logits, stats, fwd, false)
	w.execMu.Unlock()
	waitUntil(t, "cb.quality", func() bool {
		for _, s := range h.rec.Ended() {
			if s.Name() == spanname.CBQuality {
				return true
			}
		}
		return false
	})
	for _, s := range h.rec.Ended() {
		if s.Name() != spanname.CBQuality {
			continue
		}
		attrs := map[string]any{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.AsInterface()
		}
		// A full prefill served compares as itself.
		if attrs["request_id"] != "q1" || attrs["positions"] != int64(3) || attrs["greedy_match"] != int64(3) ||
			math.Abs(attrs["mean_kl"].(float64)) > 1e-6 || attrs["selected"] != int64(7) || attrs["recomp_ratio"] != 0.15 {
			t.Fatalf("cb.quality %v", attrs)
		}
		if s.Parent().IsValid() || len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != fwd.SpanContext().SpanID() ||
			s.SpanContext().TraceID() == fwd.SpanContext().TraceID() {
			t.Fatalf("cb.quality: parent %v, links %v: want a root of its own trace linked to the request's span", s.Parent(), s.Links())
		}
	}
	// Within the budget (1 % of the wall time) the next sample is dropped.
	waitUntil(t, "checker free", func() bool { return !w.quality.busy.Load() })
	if time.Now().UnixNano() >= w.quality.resume.Load() {
		t.Fatal("no budget pause after a check")
	}
	w.execMu.Lock()
	w.sampleQuality("q2", p, bt, logits, stats, fwd, false)
	w.execMu.Unlock()
	if got := countQuality(t, h, metrics.QualityDropped); got != 1 {
		t.Fatalf("dropped %v, want 1", got)
	}
	if got := countQuality(t, h, metrics.QualityDone); got != 1 {
		t.Fatalf("done %v, want 1", got)
	}
}

// countQuality is cb_worker_quality_checks_total{result=r}.
func countQuality(t *testing.T, h *harness, r metrics.QualityCheck) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cb_worker_quality_checks_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == r.String() {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}
