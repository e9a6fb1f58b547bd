package tracestore

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

func newAPI(t *testing.T, reqs ...tracetest.Request) (*httptest.Server, *jaeger.Client) {
	t.Helper()
	store := NewStore(StoreConfig{})
	for _, r := range reqs {
		store.Add(r.Traces())
	}
	srv := httptest.NewServer(NewQueryHandler(store, NewReceiver(store, ReceiverConfig{})))
	t.Cleanup(srv.Close)
	c, err := jaeger.NewClient(srv.URL, jaeger.ClientConfig{HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func TestQueryAPIWithClient(t *testing.T) {
	ctx := context.Background()
	_, c := newAPI(t, tracetest.Request{RequestID: "a"}, tracetest.Request{RequestID: "b", Start: t0.Add(time.Second)})
	svcs, err := c.Services(ctx)
	if err != nil || !slices.Equal(svcs, []string{"cb-blend", "cb-engine", "cb-worker"}) {
		t.Fatalf("Services = %v, %v", svcs, err)
	}
	ops, err := c.Operations(ctx, "cb-engine")
	if err != nil || !slices.Contains(ops, "chat m1") || !slices.Contains(ops, spanname.CBLookupRPC) || len(ops) != 8 {
		t.Fatalf("Operations = %v, %v", ops, err)
	}
	found, err := c.FindTraces(ctx, jaeger.Query{Service: "cb-worker", Tags: map[string]string{"request_id": "b"}})
	if err != nil || len(found) != 1 || found[0].TraceID != traceIDOf("b") {
		t.Fatalf("FindTraces = %d traces, %v", len(found), err)
	}
	tr, err := c.Trace(ctx, traceIDOf("a"))
	if err != nil || len(tr.Spans) != 22 {
		t.Fatalf("Trace = %d spans, %v", len(tr.Spans), err)
	}
	if _, err := c.Trace(ctx, traceIDOf("nope")); !errors.Is(err, jaeger.ErrNotFound) {
		t.Fatalf("Trace(unknown) error = %v, want ErrNotFound", err)
	}
	var rows []RequestSummary
	if _, err := c.Get(ctx, "/api/requests", nil, &rows); err != nil || len(rows) != 2 || rows[0].RequestID != "b" {
		t.Fatalf("/api/requests = %+v, %v", rows, err)
	}
	var bd Breakdown
	if _, err := c.Get(ctx, "/api/traces/"+traceIDOf("a")+"/breakdown", nil, &bd); err != nil || bd.DurationNs != ms(180) {
		t.Fatalf("breakdown = %+v, %v", bd, err)
	}
}

// TestJaegerJSONShape checks the raw JSON against the shape Jaeger's UI and clients read.
func TestJaegerJSONShape(t *testing.T) {
	srv, _ := newAPI(t, tracetest.Request{RequestID: "a", Start: t0})
	resp, err := srv.Client().Get(srv.URL + "/api/traces/" + traceIDOf("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"data", "total", "limit", "offset", "errors"} {
		if _, ok := env[k]; !ok {
			t.Fatalf("envelope lacks %q: %v", k, env)
		}
	}
	trace := env["data"].([]any)[0].(map[string]any)
	procs := trace["processes"].(map[string]any)
	var services []string
	for id, p := range procs {
		if !strings.HasPrefix(id, "p") {
			t.Fatalf("process key %q", id)
		}
		services = append(services, p.(map[string]any)["serviceName"].(string))
	}
	slices.Sort(services)
	if !slices.Equal(services, []string{"cb-blend", "cb-engine", "cb-worker"}) {
		t.Fatalf("processes = %v", services)
	}
	var lookup map[string]any
	for _, s := range trace["spans"].([]any) {
		m := s.(map[string]any)
		for _, k := range []string{"traceID", "spanID", "operationName", "references", "startTime", "duration", "tags", "logs", "processID"} {
			if _, ok := m[k]; !ok {
				t.Fatalf("span lacks %q: %v", k, m)
			}
		}
		if m["operationName"] == spanname.CBLookup {
			lookup = m
		}
	}
	refs := lookup["references"].([]any)
	ref := refs[0].(map[string]any)
	if len(refs) != 1 || ref["refType"] != "CHILD_OF" || ref["spanID"] != spanIDOf("a", spanname.CBLookupRPC) || ref["traceID"] != traceIDOf("a") {
		t.Fatalf("cb.lookup references = %v", refs)
	}
	if lookup["startTime"].(float64) != float64(t0.Add(5500*time.Microsecond).UnixMicro()) || lookup["duration"].(float64) != 27500 {
		t.Fatalf("cb.lookup startTime/duration = %v/%v", lookup["startTime"], lookup["duration"])
	}
	tags := map[string][2]any{}
	for _, tg := range lookup["tags"].([]any) {
		m := tg.(map[string]any)
		tags[m["key"].(string)] = [2]any{m["type"], m["value"]}
	}
	want := map[string][2]any{
		"prefix_chunks": {"int64", float64(1)},
		"request_id":    {"string", "a"},
		"span.kind":     {"string", "server"},
	}
	for k, w := range want {
		if tags[k] != w {
			t.Fatalf("tag %s = %v, want %v (all: %v)", k, tags[k], w, tags)
		}
	}
}

func TestQueryAPIErrors(t *testing.T) {
	srv, _ := newAPI(t, tracetest.Request{RequestID: "a"})
	tests := []struct {
		path string
		code int
	}{
		{"/api/traces/not-hex", 400},
		{"/api/traces/" + traceIDOf("zzz"), 404},
		{"/api/traces/" + traceIDOf("zzz") + "/breakdown", 404},
		{"/api/traces?tags=notjson", 400},
		{"/api/traces?limit=-1", 400},
		{"/api/traces?start=yesterday", 400},
		{"/api/traces?lookback=forever", 400},
		{"/api/operations", 400},
		{"/api/requests?limit=x", 400},
		{"/api/nothing", 404},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := srv.Client().Get(srv.URL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var env jaeger.Response[any]
			if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.code || len(env.Errors) != 1 || env.Errors[0].Code != tc.code || env.Errors[0].Msg == "" {
				t.Fatalf("status %d errors %+v, want %d with a message", resp.StatusCode, env.Errors, tc.code)
			}
		})
	}
}

func TestQueryAPILookbackAndLegacyTags(t *testing.T) {
	now := time.Now()
	_, c := newAPI(t, tracetest.Request{RequestID: "old", Start: now.Add(-3 * time.Hour)}, tracetest.Request{RequestID: "new", Start: now.Add(-time.Minute)})
	ctx := context.Background()
	var got []jaeger.Trace
	if _, err := c.Get(ctx, "/api/traces?service=cb-engine&lookback=1h", nil, &got); err != nil || len(got) != 1 || got[0].TraceID != traceIDOf("new") {
		t.Fatalf("lookback=1h: %d traces, %v", len(got), err)
	}
	if _, err := c.Get(ctx, "/api/traces?tag=request_id:old&lookback=1d", nil, &got); err != nil || len(got) != 1 || got[0].TraceID != traceIDOf("old") {
		t.Fatalf("tag=request_id:old: %d traces, %v", len(got), err)
	}
}

func TestWebPageServed(t *testing.T) {
	srv, _ := newAPI(t)
	for path, want := range map[string]string{"/": "<title>cacheblend", "/app.js": "renderWaterfall", "/style.css": ".lane"} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) || resp.Header.Get("Content-Security-Policy") == "" {
			t.Fatalf("GET %s: %d, CSP %q, body contains %q: %v", path, resp.StatusCode, resp.Header.Get("Content-Security-Policy"), want, strings.Contains(string(body), want))
		}
	}
}

func TestClientRejectsBadBaseURL(t *testing.T) {
	for _, u := range []string{"", "localhost:16686", "ftp://x", "http://"} {
		if _, err := jaeger.NewClient(u, jaeger.ClientConfig{}); err == nil {
			t.Errorf("NewClient(%q) accepted", u)
		}
	}
	_, c := newAPI(t)
	if _, err := c.Trace(context.Background(), "../etc"); err == nil {
		t.Fatal("Trace accepted a non-hex id")
	}
}
