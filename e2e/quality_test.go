package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// TestOnlineQualityCheck: a request asking for a quality check
// ("cacheblend": {"quality_check": true}; the worker's random sample rate is
// next to nothing) is checked after it was answered, and its usage says so:
// a cb.quality trace, linked to the request's cb.model_forward and passing
// the contract, and the quality histogram on the worker's /metrics. The
// built-in model's blend stays close to its full prefill (mean KL below the
// gate's threshold).
func TestOnlineQualityCheck(t *testing.T) {
	e := startEnv(t, options{workerArgs: []string{"--quality-sample-rate", "1e-9"}})
	e.ingest()
	const tp = "00-6a1b2c3d4e5f60718293a4b5c6d7e8f9-0102030405060708-01"
	var out struct {
		Usage struct {
			CacheBlend struct {
				NonPrefix      int  `json:"non_prefix_hit_tokens"`
				QualitySampled bool `json:"quality_sampled"`
			} `json:"cacheblend"`
		} `json:"usage"`
	}
	code := e.post("/v1/chat/completions", map[string]string{"traceparent": tp}, map[string]any{
		"model": e.modelName(), "max_tokens": 4, "temperature": 0, "ignore_eos": true,
		"messages":   []map[string]string{{"role": "user", "content": ragPrompt(4, 1, 6)}},
		"cacheblend": map[string]any{"quality_check": true},
	}, &out)
	if cb := out.Usage.CacheBlend; code != http.StatusOK || cb.NonPrefix == 0 || !cb.QualitySampled {
		t.Fatalf("status %d, usage.cacheblend %+v: want chunk reuse and quality_sampled", code, cb)
	}
	// A request that does not ask is not checked at this rate.
	out.Usage.CacheBlend.NonPrefix, out.Usage.CacheBlend.QualitySampled = 0, false // omitted when false: not overwritten
	code = e.post("/v1/chat/completions", nil, map[string]any{
		"model": e.modelName(), "max_tokens": 2, "temperature": 0, "ignore_eos": true,
		"messages": []map[string]string{{"role": "user", "content": ragPrompt(3, 2, 5)}},
	}, &out)
	if cb := out.Usage.CacheBlend; code != http.StatusOK || cb.NonPrefix == 0 || cb.QualitySampled {
		t.Fatalf("status %d, usage.cacheblend %+v: want chunk reuse, not sampled", code, cb)
	}
	req := e.trace("6a1b2c3d4e5f60718293a4b5c6d7e8f9", spanname.CBModelForward, spanname.CBPartial)
	var fwd string
	for _, s := range req.Spans {
		if s.Name == spanname.CBModelForward {
			fwd = s.SpanID
		}
	}
	jc, err := jaeger.NewClient(e.queryURL, jaeger.ClientConfig{HTTPClient: &http.Client{Timeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	var q *tracecheck.Trace
	var refs []jaeger.Reference
	for deadline := time.Now().Add(60 * time.Second); q == nil && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		jts, err := jc.FindTraces(context.Background(), jaeger.Query{Service: "cb-worker", Operation: spanname.CBQuality, Limit: 10})
		if err != nil || len(jts) == 0 {
			continue
		}
		trs, err := tracecheck.FromJaeger(jts[0])
		if err != nil {
			t.Fatal(err)
		}
		q, refs = &trs[0], jts[0].Spans[0].References
	}
	if q == nil {
		t.Fatal("no cb.quality trace within 60 s")
	}
	spec, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	if rep := tracecheck.Check([]tracecheck.Trace{*q}, spec); !rep.OK() {
		t.Fatalf("the quality trace fails the contract:\n%s", rep.String())
	}
	sp := q.Spans[0]
	kl, _ := sp.Attributes["mean_kl"].Number()
	linked := false
	for _, r := range refs {
		linked = linked || (r.RefType == jaeger.FollowsFrom && r.SpanID == fwd)
	}
	if !linked || sp.Attributes["request_id"].String() == "" || kl > 0.1 {
		t.Fatalf("cb.quality: references %+v (want a link to the request's cb.model_forward %s), attributes %v", refs, fwd, sp.Attributes)
	}
	metrics, err := httpGet(e.stack.Endpoints().Worker.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, `cb_worker_quality_checks_total{result="done"} 1`) || strings.Contains(metrics, "lmcache_blend_quality_kl_count 0") {
		t.Fatalf("worker metrics:\n%s", grepLines(metrics, "quality"))
	}
	t.Logf("cb.quality: mean KL %.5f, top1 %v, greedy match %v of %v", kl, sp.Attributes["top1"], sp.Attributes["greedy_match"], sp.Attributes["positions"])
}
