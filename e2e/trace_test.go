package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// byName indexes a trace's spans (several spans may share a name).
func byName(tr *tracecheck.Trace) map[string][]*tracecheck.Span {
	m := map[string][]*tracecheck.Span{}
	for i := range tr.Spans {
		s := &tr.Spans[i]
		m[s.Name] = append(m[s.Name], s)
	}
	return m
}

func spanByID(tr *tracecheck.Trace, id string) *tracecheck.Span {
	for i := range tr.Spans {
		if tr.Spans[i].SpanID == id {
			return &tr.Spans[i]
		}
	}
	return nil
}

func TestOneTraceAcrossThreeProcesses(t *testing.T) {
	// --lone-blend-tokens=-1: a blended prefill alone in its step is chunked
	// by the compute budget like any other (by default it would run whole).
	e := startEnv(t, options{engineArgs: []string{"--lone-blend-tokens=-1"}})
	e.ingest()
	// Three documents in an order they were not stored in: their KV is
	// reused at shifted positions (non-prefix), and the prompt (its compute,
	// reused tokens charged their share of the forward, is more than 512,
	// the engine's step budget) is prefilled in several steps, so its blocks
	// arrive in several steps and the KV loads run more than once.
	e.chat(caller, ragPrompt(4, 1, 6), 4)
	tr := e.trace("4bf92f3577b34da6a3ce929d0e0e4736", spanname.CBRequest, spanname.CBLookup, spanname.CBClassify, spanname.CBExecute,
		spanname.CBRetrieve, spanname.CBScatter, spanname.CBCheck, spanname.CBPartial, spanname.EngineDecode)

	checkContract(t, tr)
	spans := byName(tr)
	// The SERVER span continues the caller's trace.
	root := spans["chat cb-llama"]
	if len(root) != 1 || root[0].ParentSpanID != "00f067aa0ba902b7" || root[0].Service != "cb-engine" {
		t.Fatalf("server span %+v", root)
	}
	wantService := map[string]string{
		spanname.CBRequest: "cb-engine", spanname.CBSchedule: "cb-engine", spanname.CBLookupRPC: "cb-engine", spanname.CBBuildMeta: "cb-engine",
		spanname.CBLookup: "cb-blend", spanname.MPLookupPrefetch: "cb-blend", spanname.CBFingerprintMatch: "cb-blend",
		spanname.CBSparsePrefetch: "cb-blend", spanname.CBClassify: "cb-blend", spanname.CBRetrieve: "cb-blend", spanname.CBScatter: "cb-blend",
		spanname.CBExecute: "cb-worker", spanname.CBStartLoadKV: "cb-worker", spanname.CBModelForward: "cb-worker",
		spanname.CBFullRecomp: "cb-worker", spanname.CBCheck: "cb-worker", spanname.CBPartial: "cb-worker",
	}
	for name, svc := range wantService {
		if len(spans[name]) == 0 {
			t.Errorf("span %s missing", name)
			continue
		}
		for _, s := range spans[name] {
			if s.Service != svc {
				t.Errorf("%s recorded by %s, want %s", name, s.Service, svc)
			}
		}
	}
	// Remote children: cb.lookup under the engine's cb.lookup.rpc,
	// cb.retrieve under the worker's cb.start_load_kv, cb.execute under the
	// engine's cb.request.
	remote := map[string]string{spanname.CBLookup: spanname.CBLookupRPC, spanname.CBRetrieve: spanname.CBStartLoadKV, spanname.CBExecute: spanname.CBRequest}
	for child, parent := range remote {
		for _, s := range spans[child] {
			p := spanByID(tr, s.ParentSpanID)
			if p == nil || p.Name != parent || p.Service == s.Service {
				t.Errorf("%s's parent is %+v, want %s in another process", child, p, parent)
			}
		}
	}
	// Hit statistics stamped on cb.request.
	req := spans[spanname.CBRequest][0]
	hit, _ := req.Attributes["hit_rate"].Number()
	np, _ := req.Attributes["non_prefix_hit_tokens"].Number()
	if hit <= 0.5 || np <= 0 {
		t.Errorf("cb.request hit_rate %v non_prefix_hit_tokens %v", hit, np)
	}
	// No prompt or completion text in spans or logs (no content capture
	// unless opted in).
	secret := "what do these documents have in common"
	for _, s := range tr.Spans {
		for k, v := range s.Attributes {
			if strings.Contains(v.String(), secret) || strings.Contains(v.String(), "Paged attention stores") {
				t.Errorf("span %s attribute %s carries prompt text", s.Name, k)
			}
		}
	}
	if strings.Contains(e.logs.String(), secret) {
		t.Error("a log line carries prompt text")
	}
	// The KV load ran more than once; the first retrieve scattered fewer
	// tokens than the request's total.
	retrieves := spans[spanname.CBRetrieve]
	if len(retrieves) < 2 {
		t.Fatalf("%d cb.retrieve spans, want at least 2", len(retrieves))
	}
	first, total := retrieves[0], 0.0
	for _, r := range retrieves {
		if r.Start.Before(first.Start) {
			first = r
		}
	}
	firstTokens := 0.0
	for _, s := range spans[spanname.CBScatter] {
		n, _ := s.Attributes["scattered_tokens"].Number()
		total += n
		if s.ParentSpanID == first.SpanID {
			firstTokens += n
		}
	}
	if firstTokens <= 0 || firstTokens >= total {
		t.Fatalf("first retrieve scattered %v of %v tokens", firstTokens, total)
	}
}

func TestSampledOutRequestLeavesNoSpan(t *testing.T) {
	e := startEnv(t, options{})
	e.ingest()
	const out = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	resp := e.chat(out, ragPrompt(2, 0), 2)
	id, _ := resp["id"].(string)
	if id == "" {
		t.Fatalf("no id in %v", resp)
	}
	// A sampled request afterwards: once its trace is complete in the
	// collector, every batch the sampled-out one could be in has arrived.
	sampled := e.chat("00-1bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ragPrompt(0, 2), 2)
	e.trace("1bf92f3577b34da6a3ce929d0e0e4736", spanname.CBRequest, spanname.CBLookup, spanname.CBExecute, spanname.CBScatter, spanname.EnginePrefill)
	// The request_id query finds the sampled request, so an empty answer
	// below means something.
	if sid, _ := sampled["id"].(string); len(e.col.Store().FindTraces(jaeger.Query{Tags: map[string]string{"request_id": sid}})) == 0 {
		t.Fatalf("the request_id query does not find the sampled request %s", sid)
	}
	if _, ok := e.col.Store().Trace("0af7651916cd43dd8448eb211c80319c"); ok {
		t.Fatal("the sampled-out request left spans")
	}
	// Nor an option-B root under a derived trace id: no span of any
	// process carries the sampled-out request's id, in any trace.
	if found := e.col.Store().FindTraces(jaeger.Query{Tags: map[string]string{"request_id": id}}); len(found) != 0 {
		t.Fatalf("the sampled-out request %s left %d traces", id, len(found))
	}
	for _, svc := range []string{"cb-engine", "cb-worker", "cb-blend"} {
		if ops := e.col.Store().Operations(svc); len(ops) == 0 {
			t.Fatalf("no spans from %s at all", svc)
		}
	}
}

func TestDemoJSONChecksPass(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "demo.json")
	cmd := exec.Command(cbBin, "demo", "--exit", "--json", out, "--requests", "2", "--max-tokens", "4",
		"--api", "127.0.0.1:0", "--ui-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cb demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), tail(stderr.String(), 40))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Requests []struct {
			TraceID            string   `json:"trace_id"`
			HitRate            *float64 `json:"hit_rate"`
			NonPrefixHitTokens *int64   `json:"non_prefix_hit_tokens"`
			ImpCount           *int64   `json:"imp_count"`
			Services           []string `json:"services"`
			Check              string   `json:"check"`
			FullCheck          string   `json:"full_check"`
			Lookup             string   `json:"lookup"`
			FullLookup         string   `json:"full_lookup"`
			HitTokens          *int64   `json:"hit_tokens"`
			NNonPrefixTokens   *int64   `json:"n_non_prefix_tokens"`
			TTFTReuse          float64  `json:"ttft_reuse_s"`
			TTFTFull           float64  `json:"ttft_full_s"`
		} `json:"requests"`
		Endpoints struct {
			Engine struct {
				API string `json:"api"`
			} `json:"engine"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Requests) != 2 || rep.Endpoints.Engine.API == "" {
		t.Fatalf("report %s", b)
	}
	for i, r := range rep.Requests {
		if r.Check != "pass" || r.FullCheck != "pass" {
			t.Errorf("request %d: check %q, baseline check %q", i, r.Check, r.FullCheck)
		}
		if r.Lookup != "done" || r.FullLookup != "skipped" || r.HitTokens == nil || *r.HitTokens <= 0 || r.NNonPrefixTokens == nil {
			t.Errorf("request %d: lookup %q / %q, seed statistics %s", i, r.Lookup, r.FullLookup, b)
		}
		if r.HitRate == nil || *r.HitRate <= 0 || r.NonPrefixHitTokens == nil || *r.NonPrefixHitTokens <= 0 || r.ImpCount == nil || *r.ImpCount <= 0 {
			t.Errorf("request %d: stats %s", i, b)
		}
		if len(r.Services) != 3 || r.TTFTReuse <= 0 || r.TTFTFull <= 0 {
			t.Errorf("request %d: services %v ttft %v/%v", i, r.Services, r.TTFTReuse, r.TTFTFull)
		}
	}
	if !strings.Contains(stdout.String(), "Where the time went") {
		t.Errorf("no waterfall in the demo output:\n%s", stdout.String())
	}
}
