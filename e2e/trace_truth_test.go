package e2e

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/demo"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// settledTrace waits until the trace has every span named in want and its span count has
// not changed for a second (every process's batches arrived), and returns it.
func (e *env) settledTrace(traceID string, want ...string) *tracecheck.Trace {
	e.t.Helper()
	tr := e.trace(traceID, want...)
	n, since := len(tr.Spans), time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Since(since) < time.Second && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		if tr = e.trace(traceID, want...); len(tr.Spans) != n {
			n, since = len(tr.Spans), time.Now()
		}
	}
	return tr
}

// checkContract fails the test when a trace breaks contract/spans.yaml.
func checkContract(t *testing.T, tr *tracecheck.Trace) {
	t.Helper()
	spec, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	if rep := tracecheck.Check([]tracecheck.Trace{*tr}, spec); !rep.OK() {
		t.Errorf("trace %s breaks the contract:\n%s", tr.TraceID, rep.String())
	}
}

// strAttr is the string attribute key of the first span named name.
func strAttr(tr *tracecheck.Trace, name, key string) string {
	for _, s := range byName(tr)[name] {
		if v, ok := s.Attributes[key]; ok {
			return v.Str
		}
	}
	return ""
}

// TestOptionBWithoutEngineTracing: the engine does not trace (OTEL_SDK_DISABLED=true for
// it alone), so its peers get no trace context. The worker and the blend server derive the
// trace id from the request id (option B, telemetry.TraceIDFromRequestID): one trace per
// request holds the worker's spans and the blend server's, found by request_id.
func TestOptionBWithoutEngineTracing(t *testing.T) {
	e := startEnv(t, options{engineEnv: []string{"OTEL_SDK_DISABLED=true"}})
	e.ingest()
	var ids []string
	for i, order := range [][]int{{4, 1, 6}, {2, 0}} {
		resp := e.chat("", ragPrompt(order...), 2)
		id, _ := resp["id"].(string)
		if id == "" {
			t.Fatalf("request %d: no id in %v", i, resp)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		want := telemetry.TraceIDFromRequestID(id).String()
		// The blend server's option-B root closes once its retrieves are done; the worker's
		// cb.execute roots and the load subtree land in the same trace.
		tr := e.trace(want, spanname.CBRequest, spanname.CBLookup, spanname.CBClassify, spanname.CBExecute,
			spanname.CBStartLoadKV, spanname.CBRetrieve, spanname.CBScatter, spanname.CBModelForward, spanname.CBPartial)
		services := map[string]bool{}
		for _, s := range tr.Spans {
			services[s.Service] = true
			if v := s.Attributes["request_id"]; v.Str != "" && v.Str != id {
				t.Errorf("%s [%s] carries request_id %q in the trace of %s", s.Name, s.Service, v.Str, id)
			}
		}
		if !services["cb-worker"] || !services["cb-blend"] || services["cb-engine"] {
			t.Errorf("trace of %s has services %v; want cb-worker and cb-blend, no cb-engine", id, services)
		}
		spans := byName(tr)
		for _, s := range spans[spanname.CBExecute] {
			if s.ParentSpanID != "" {
				t.Errorf("cb.execute has parent %s without an engine context", s.ParentSpanID)
			}
		}
		if root := spans[spanname.CBRequest]; len(root) != 1 || root[0].Service != "cb-blend" || root[0].Attributes["lookup"].Str != "done" {
			t.Errorf("option-B root %+v", root)
		}
		for _, s := range spans[spanname.CBRetrieve] { // option A still links the worker and the blend server
			if p := spanByID(tr, s.ParentSpanID); p == nil || p.Name != spanname.CBStartLoadKV || p.Service != "cb-worker" {
				t.Errorf("cb.retrieve's parent %+v, want the worker's cb.start_load_kv", p)
			}
		}
		// One trace per request: every span with the request id is in this trace.
		found := e.col.Store().FindTraces(jaeger.Query{Tags: map[string]string{"request_id": id}})
		if len(found) != 1 || jaeger.NormalizeTraceID(found[0].TraceID) != want {
			var got []string
			for _, f := range found {
				got = append(got, f.TraceID)
			}
			t.Errorf("request %s is in traces %v, want only %s", id, got, want)
		}
		// The spans that are there tell the truth about time too.
		spec, err := contract.Spans()
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range tracecheck.Check([]tracecheck.Trace{*tr}, spec).Traces[0].Violations {
			if v.Rule == tracecheck.RuleInterval {
				t.Errorf("option-B trace of %s: %s", id, v)
			}
		}
		t.Logf("request %s: trace %s, %d spans from %v", id, want, len(tr.Spans), services)
	}
	if ops := e.col.Store().Operations("cb-engine"); len(ops) != 0 {
		t.Errorf("the engine traced although OTEL_SDK_DISABLED=true: %v", ops)
	}
}

// TestTracestateReachesEveryProcess: a caller's vendor entries (the HTTP tracestate header)
// travel with traceparent through every RPC payload and gRPC call: every span of the
// request, in all three processes, carries them.
func TestTracestateReachesEveryProcess(t *testing.T) {
	e := startEnv(t, options{})
	e.ingest()
	const tp = "00-5cf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const vendor = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
	var out map[string]any
	code := e.post("/v1/chat/completions", map[string]string{"traceparent": tp, "tracestate": vendor}, map[string]any{
		"model": "cb-llama", "max_tokens": 2, "temperature": 0, "ignore_eos": true,
		"messages": []map[string]string{{"role": "user", "content": ragPrompt(4, 1, 6)}},
	}, &out)
	if code != http.StatusOK {
		t.Fatalf("chat: %d", code)
	}
	tr := e.settledTrace(tp[3:35], "chat cb-llama", spanname.CBRequest, spanname.CBLookup, spanname.CBClassify, spanname.CBExecute,
		spanname.CBRetrieve, spanname.CBScatter, spanname.CBPartial, spanname.CBStore)
	checkContract(t, tr)
	services := map[string]int{}
	for _, s := range tr.Spans {
		services[s.Service]++
		if s.TraceState != vendor {
			t.Errorf("%s [%s] carries tracestate %q, want %q", s.Name, s.Service, s.TraceState, vendor)
		}
	}
	if len(services) != 3 {
		t.Errorf("spans by service %v, want all three", services)
	}
}

// ---------------------------------------------------------------- a raw OTLP/HTTP JSON receiver

// otlpNanos is a fixed64 of OTLP JSON: a decimal string (or a number).
type otlpNanos uint64

func (n *otlpNanos) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseUint(strings.Trim(string(b), `"`), 10, 64)
	*n = otlpNanos(v)
	return err
}

type otlpValue struct {
	StringValue *string         `json:"stringValue"`
	IntValue    json.RawMessage `json:"intValue"` // a decimal string (or a number)
	DoubleValue *float64        `json:"doubleValue"`
	BoolValue   *bool           `json:"boolValue"`
}

type otlpKV struct {
	Key   string    `json:"key"`
	Value otlpValue `json:"value"`
}

type otlpSpan struct {
	TraceID      string    `json:"traceId"`
	SpanID       string    `json:"spanId"`
	ParentSpanID string    `json:"parentSpanId"`
	TraceState   string    `json:"traceState"`
	Name         string    `json:"name"`
	Start        otlpNanos `json:"startTimeUnixNano"`
	End          otlpNanos `json:"endTimeUnixNano"`
	Attributes   []otlpKV  `json:"attributes"`

	service string
}

type otlpExport struct {
	ResourceSpans []struct {
		Resource struct {
			Attributes []otlpKV `json:"attributes"`
		} `json:"resource"`
		ScopeSpans []struct {
			Spans []otlpSpan `json:"spans"`
		} `json:"scopeSpans"`
	} `json:"resourceSpans"`
}

func (s *otlpSpan) attr(key string) (otlpValue, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return otlpValue{}, false
}

// intValue is an int attribute, ok false when absent or of another type.
func (s *otlpSpan) intValue(key string) (int64, bool) {
	v, ok := s.attr(key)
	if !ok || v.IntValue == nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.Trim(string(v.IntValue), `"`), 10, 64)
	return n, err == nil
}

// typeOf names the type of an attribute value as the contract does.
func (v otlpValue) typeOf() contract.AttrType {
	switch {
	case v.StringValue != nil:
		return contract.AttrString
	case v.IntValue != nil:
		return contract.AttrInt
	case v.DoubleValue != nil:
		return contract.AttrDouble
	case v.BoolValue != nil:
		return contract.AttrBool
	}
	return ""
}

// rawReceiver is an OTLP/HTTP receiver of JSON exports: it keeps every span as sent.
type rawReceiver struct {
	mu    sync.Mutex
	spans []otlpSpan
	bad   []string
}

func (rr *rawReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	var req otlpExport
	err := json.NewDecoder(body).Decode(&req)
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if r.URL.Path != "/v1/traces" || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") || err != nil {
		rr.bad = append(rr.bad, fmt.Sprintf("%s %s %s: %v", r.Method, r.URL.Path, r.Header.Get("Content-Type"), err))
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	for _, rs := range req.ResourceSpans {
		svc := ""
		for _, kv := range rs.Resource.Attributes {
			if kv.Key == "service.name" && kv.Value.StringValue != nil {
				svc = *kv.Value.StringValue
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				sp.service = svc
				rr.spans = append(rr.spans, sp)
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, "{}")
}

// trace returns the spans of a trace id (lower-case hex).
func (rr *rawReceiver) trace(id string) []otlpSpan {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	var out []otlpSpan
	for _, s := range rr.spans {
		if strings.EqualFold(s.TraceID, id) {
			out = append(out, s)
		}
	}
	return out
}

// waitTrace waits until the trace has every span named in want and has not grown for a
// second (every process's batches arrived).
func (rr *rawReceiver) waitTrace(t *testing.T, id string, want []string) []otlpSpan {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	n, stable := -1, time.Now()
	for time.Now().Before(deadline) {
		spans := rr.trace(id)
		have := map[string]bool{}
		for _, s := range spans {
			have[s.Name] = true
		}
		complete := true
		for _, w := range want {
			complete = complete && have[w]
		}
		if len(spans) != n {
			n, stable = len(spans), time.Now()
		}
		if complete && time.Since(stable) > time.Second {
			return spans
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("trace %s incomplete: %d spans", id, n)
	return nil
}

// crossProcessTolerance is the clock skew allowed between two processes' timestamps.
const crossProcessTolerance = 200 * time.Microsecond

// TestRawOTLPJSONTimestamps exports every process over OTLP/HTTP JSON to a receiver written
// here (encoding/json into minimal structs, not the project's collector), runs the demo's
// requests (with reuse, and their full-prefill baselines) through the stack cb up starts,
// and asserts on the raw nanosecond timestamps of every span: none ends before it starts,
// synchronous children lie inside their parents (exactly within a process, within 200 µs
// across processes; only the contract's async spans may end later), and the contract's
// attributes are there.
func TestRawOTLPJSONTimestamps(t *testing.T) {
	rr := &rawReceiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rr, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	e := startEnv(t, options{otlpEndpoint: "http://" + ln.Addr().String() + "/v1/traces", otlpProtocol: "http/json", queryURL: "http://127.0.0.1:1"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := demo.Run(ctx, demo.Config{API: e.api, Requests: 2, MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	reuseSpans := []string{"chat cb-llama", spanname.EngineDecode, spanname.CBRequest, spanname.CBLookup, spanname.CBClassify,
		spanname.CBExecute, spanname.CBRetrieve, spanname.CBScatter, spanname.CBPartial}
	baseSpans := []string{"chat cb-llama", spanname.EngineDecode, spanname.CBRequest, spanname.CBExecute, spanname.CBModelForward}
	checked := 0
	for i, q := range rep.Requests {
		for _, c := range []struct {
			id, lookup string
			want       []string
		}{{q.TraceID, "done", reuseSpans}, {q.FullTraceID, "skipped", baseSpans}} {
			spans := rr.waitTrace(t, c.id, c.want)
			checked += len(spans)
			checkRawTrace(t, fmt.Sprintf("request %d (lookup %s)", i+1, c.lookup), spans, spec, c.lookup)
		}
	}
	rr.mu.Lock()
	bad := rr.bad
	rr.mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("the receiver refused exports: %v", bad)
	}
	t.Logf("%d spans of %d traces checked at nanosecond precision", checked, 2*len(rep.Requests))
}

// checkRawTrace asserts on one trace as exported: timestamps and attributes.
func checkRawTrace(t *testing.T, what string, spans []otlpSpan, spec *contract.SpanSet, lookup string) {
	t.Helper()
	byID := map[string]*otlpSpan{}
	for i := range spans {
		byID[spans[i].SpanID] = &spans[i]
	}
	services := map[string]bool{}
	var req *otlpSpan
	roots := 0
	// The tightest margins seen (how far inside its parent the closest child lies), for the log.
	margin := map[bool]int64{false: 1 << 62, true: 1 << 62} // by cross-process
	for i := range spans {
		s := &spans[i]
		services[s.service] = true
		if s.End < s.Start {
			t.Errorf("%s: %s [%s] ends %d ns before it starts", what, s.Name, s.service, s.Start-s.End)
		}
		cs, inContract := spec.Match(s.Name)
		if p := byID[s.ParentSpanID]; p != nil {
			tol := otlpNanos(0)
			if p.service != s.service {
				tol = otlpNanos(crossProcessTolerance)
			}
			if s.Start+tol < p.Start {
				t.Errorf("%s: %s [%s] starts %d ns before its parent %s [%s]", what, s.Name, s.service, p.Start-s.Start, p.Name, p.service)
			}
			async := inContract && cs.Async
			if !async && s.End > p.End+tol {
				t.Errorf("%s: %s [%s] ends %d ns after its parent %s [%s]", what, s.Name, s.service, s.End-p.End, p.Name, p.service)
			}
			cross := p.service != s.service
			margin[cross] = min(margin[cross], int64(s.Start)-int64(p.Start))
			if !async {
				margin[cross] = min(margin[cross], int64(p.End)-int64(s.End))
			}
		} else if root, _ := spec.Root(contract.TraceRequest); !inContract || cs != root {
			// Only the engine's SERVER span may have its parent elsewhere: the
			// caller's span (the demo sends a traceparent).
			t.Errorf("%s: %s [%s] has parent %q, not in the trace", what, s.Name, s.service, s.ParentSpanID)
		} else {
			roots++
		}
		if !inContract {
			continue
		}
		for _, key := range cs.AttributeKeys() {
			v, ok := s.attr(key)
			if !ok {
				t.Errorf("%s: %s lacks %s", what, s.Name, key)
			} else if got := v.typeOf(); got != cs.Attributes[key] {
				t.Errorf("%s: %s.%s is %s, want %s", what, s.Name, key, got, cs.Attributes[key])
			}
		}
		if s.Name == spanname.CBRequest {
			req = s
		}
	}
	if roots != 1 {
		t.Errorf("%s: %d roots, want the engine's SERVER span alone", what, roots)
	}
	if !services["cb-engine"] || !services["cb-worker"] || (lookup == "done" && !services["cb-blend"]) {
		t.Errorf("%s: services %v", what, services)
	}
	if req == nil {
		t.Errorf("%s: no cb.request", what)
		return
	}
	if v, _ := req.attr("lookup"); v.StringValue == nil || *v.StringValue != lookup {
		t.Errorf("%s: cb.request lookup %v, want %q", what, v.StringValue, lookup)
	}
	n := map[string]int64{}
	for _, k := range []string{"n_prompt_tokens", "requested_tokens", "hit_tokens", "prefix_hit_tokens", "non_prefix_hit_tokens",
		"prefix_coverage_tokens", "n_non_prefix_tokens", "fingerprint_hits", "storage_hits", "stale_chunks"} {
		n[k], _ = req.intValue(k)
	}
	hr, _ := req.attr("hit_rate")
	switch {
	case n["hit_tokens"] != n["prefix_hit_tokens"]+n["non_prefix_hit_tokens"],
		n["prefix_coverage_tokens"]+n["n_non_prefix_tokens"] != n["requested_tokens"],
		n["requested_tokens"] != n["n_prompt_tokens"],
		hr.DoubleValue == nil || *hr.DoubleValue != float64(n["hit_tokens"])/float64(n["requested_tokens"]):
		t.Errorf("%s: cb.request statistics do not add up: %v hit_rate %v", what, n, hr.DoubleValue)
	case lookup == "done" && (n["non_prefix_hit_tokens"] <= 0 || n["fingerprint_hits"] <= 0):
		t.Errorf("%s: no non-prefix reuse: %v", what, n)
	case lookup == "skipped" && (n["hit_tokens"] != 0 || n["storage_hits"] != 0 || n["prefix_coverage_tokens"] != 0):
		t.Errorf("%s: hit statistics without a lookup: %v", what, n)
	}
	if lookup == "done" {
		var shifted int64
		for i := range spans {
			if spans[i].Name == spanname.CBScatter {
				v, _ := spans[i].intValue("n_shifted_tokens")
				shifted += v
			}
		}
		if shifted <= 0 {
			t.Errorf("%s: no re-RoPE'd token (n_shifted_tokens) in any cb.scatter", what)
		}
	}
	t.Logf("%s: %d spans from %d processes; tightest child-in-parent margin %d ns in a process, %d ns across processes",
		what, len(spans), len(services), margin[false], margin[true])
}
