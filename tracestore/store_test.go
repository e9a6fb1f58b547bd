package tracestore

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

func TestStoreAddAndQuery(t *testing.T) {
	s := NewStore(StoreConfig{})
	res := s.Add(tracetest.Request{RequestID: "r1"}.Traces())
	if res.Accepted != 22 || res.Rejected != 0 {
		t.Fatalf("Add = %+v, want 22 accepted", res)
	}
	st := s.Stats()
	if st.Traces != 1 || st.Spans != 22 || st.ReceivedSpans != 22 {
		t.Fatalf("stats = %+v", st)
	}
	if got, want := s.Services(), []string{"cb-blend", "cb-engine", "cb-worker"}; !slices.Equal(got, want) {
		t.Fatalf("Services = %v, want %v", got, want)
	}
	ops := s.Operations("cb-worker")
	var names []string
	for _, op := range ops {
		names = append(names, op.Name+"/"+op.SpanKind)
	}
	want := []string{"cb.check/internal", "cb.execute/server", "cb.full_recomp/internal", "cb.model_forward/internal", "cb.partial/internal", "cb.start_load_kv/client"}
	if !slices.Equal(names, want) {
		t.Fatalf("Operations(cb-worker) = %v, want %v", names, want)
	}
	tr, ok := s.Trace(traceIDOf("r1"))
	if !ok || len(tr.Spans) != 22 || len(tr.Processes) != 3 {
		t.Fatalf("Trace: ok=%v spans=%d processes=%d", ok, len(tr.Spans), len(tr.Processes))
	}
	if _, ok := s.Trace("zz"); ok {
		t.Fatal("Trace(malformed) found something")
	}
	if _, ok := s.Trace(traceIDOf("nope")); ok {
		t.Fatal("Trace(unknown) found something")
	}
}

func TestStoreDuplicateReplaces(t *testing.T) {
	s := NewStore(StoreConfig{})
	td := tracetest.Request{RequestID: "r1"}.Traces()
	s.Add(td)
	s.Add(td)
	st := s.Stats()
	if st.Spans != 22 || st.DuplicateSpans != 22 || st.ReceivedSpans != 44 {
		t.Fatalf("stats after re-adding = %+v", st)
	}
	if len(s.Operations("cb-blend")) != 8 {
		t.Fatalf("operation counts double-counted: %v", s.Operations("cb-blend"))
	}
}

func TestStoreRejectsEmptyIDs(t *testing.T) {
	td := ptrace.NewTraces()
	spans := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans()
	spans.AppendEmpty().SetName("no ids")
	ok := spans.AppendEmpty()
	ok.SetTraceID(tracetest.TraceID("x"))
	ok.SetSpanID(tracetest.SpanID("x", "a"))
	s := NewStore(StoreConfig{})
	res := s.Add(td)
	if res.Accepted != 1 || res.Rejected != 1 || res.Reason == "" {
		t.Fatalf("Add = %+v, want 1 accepted, 1 rejected with a reason", res)
	}
	if st := s.Stats(); st.RejectedSpans != 1 || st.ReceivedSpans != 2 {
		t.Fatalf("stats = %+v", st)
	}
	if got := s.Services(); !slices.Equal(got, []string{UnknownService}) {
		t.Fatalf("a resource without service.name is %v, want %q", got, UnknownService)
	}
}

func TestStoreEviction(t *testing.T) {
	tests := []struct {
		name                string
		cfg                 StoreConfig
		add                 int // single-span traces
		wantTraces          int
		wantEvicted         uint64
		wantOldestRemaining int
	}{
		{"under limits", StoreConfig{MaxTraces: 10, MaxSpans: 100}, 10, 10, 0, 0},
		{"max traces", StoreConfig{MaxTraces: 4, MaxSpans: 100}, 10, 4, 6, 6},
		{"max spans", StoreConfig{MaxTraces: 100, MaxSpans: 3}, 10, 3, 7, 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(tc.cfg)
			s.Add(manySpans(tc.add))
			st := s.Stats()
			if st.Traces != tc.wantTraces || st.EvictedTraces != tc.wantEvicted || st.EvictedSpans != tc.wantEvicted {
				t.Fatalf("stats = %+v, want %d traces, %d evicted", st, tc.wantTraces, tc.wantEvicted)
			}
			for i := 0; i < tc.add; i++ {
				_, ok := s.Trace(tracetest.TraceID(fmt.Sprint("t", i)).String())
				if want := i >= tc.wantOldestRemaining; ok != want {
					t.Fatalf("trace %d present = %v, want %v (oldest evicted first)", i, ok, want)
				}
			}
		})
	}
}

func TestStoreEvictionForgetsServices(t *testing.T) {
	s := NewStore(StoreConfig{MaxTraces: 1})
	s.Add(tracetest.Request{RequestID: "a"}.Traces())
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "other")
	x := rs.ScopeSpans().AppendEmpty().Spans().AppendEmpty()
	x.SetTraceID(tracetest.TraceID("b"))
	x.SetSpanID(tracetest.SpanID("b", "x"))
	s.Add(td)
	if got := s.Services(); !slices.Equal(got, []string{"other"}) {
		t.Fatalf("Services after eviction = %v, want [other]", got)
	}
	if ops := s.Operations("cb-engine"); len(ops) != 0 {
		t.Fatalf("operations of an evicted service remain: %v", ops)
	}
}

func TestStoreSingleTraceOverSpanLimit(t *testing.T) {
	s := NewStore(StoreConfig{MaxSpans: 5})
	res := s.Add(tracetest.Request{RequestID: "big"}.Traces())
	if res.Accepted != 5 || res.Rejected != 17 || res.Reason == "" {
		t.Fatalf("Add = %+v, want 5 accepted and 17 rejected", res)
	}
	if st := s.Stats(); st.Spans != 5 || st.RejectedSpans != 17 || st.EvictedTraces != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestFindTraces(t *testing.T) {
	s := NewStore(StoreConfig{})
	for i := range 5 {
		s.Add(tracetest.Request{RequestID: fmt.Sprint("r", i), Start: t0.Add(time.Duration(i*1000) * time.Millisecond)}.Traces())
	}
	ids := func(ts []jaeger.Trace) []string {
		var out []string
		for _, tr := range ts {
			out = append(out, tr.TraceID)
		}
		return out
	}
	all := s.FindTraces(jaeger.Query{})
	if want := []string{traceIDOf("r4"), traceIDOf("r3"), traceIDOf("r2"), traceIDOf("r1"), traceIDOf("r0")}; !slices.Equal(ids(all), want) {
		t.Fatalf("FindTraces order = %v, want newest first %v", ids(all), want)
	}
	tests := []struct {
		name string
		q    jaeger.Query
		want []string
	}{
		{"by request id tag", jaeger.Query{Service: "cb-blend", Tags: map[string]string{"request_id": "r2"}}, []string{"r2"}},
		{"tag on another service's span only", jaeger.Query{Service: "cb-worker", Tags: map[string]string{"prefix_chunks": "1"}}, nil},
		{"int tag as text", jaeger.Query{Operation: spanname.CBLookupRPC, Tags: map[string]string{"n_polls": "3", "request_id": "r1"}}, []string{"r1"}},
		{"span.kind tag", jaeger.Query{Service: "cb-worker", Tags: map[string]string{"span.kind": "server", "request_id": "r0"}}, []string{"r0"}},
		{"resource tag", jaeger.Query{Tags: map[string]string{"service.instance.id": "cb-blend-0", "request_id": "r3"}}, []string{"r3"}},
		{"limit", jaeger.Query{Limit: 2}, []string{"r4", "r3"}},
		{"time window", jaeger.Query{Start: t0.Add(time.Duration(1500) * time.Millisecond), End: t0.Add(time.Duration(3500) * time.Millisecond)}, []string{"r3", "r2"}},
		{"min duration keeps long spans", jaeger.Query{Operation: spanname.CBCheck, MinDuration: time.Duration(5) * time.Millisecond}, nil},
		{"max duration", jaeger.Query{Service: "cb-engine", Operation: "chat m1", MaxDuration: time.Duration(200) * time.Millisecond, Limit: 1}, []string{"r4"}},
		{"trace ids", jaeger.Query{TraceIDs: []string{traceIDOf("r1"), "ffff"}}, []string{"r1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var want []string
			for _, k := range tc.want {
				want = append(want, traceIDOf(k))
			}
			if got := ids(s.FindTraces(tc.q)); !slices.Equal(got, want) {
				t.Fatalf("FindTraces(%+v) = %v, want %v", tc.q, got, want)
			}
		})
	}
}

func TestRequests(t *testing.T) {
	s := NewStore(StoreConfig{})
	for i := range 3 {
		s.Add(tracetest.Request{RequestID: fmt.Sprint("r", i), Start: t0.Add(time.Duration(i*1000) * time.Millisecond)}.Traces())
	}
	rows, total := s.Requests(2, 0)
	if total != 3 || len(rows) != 2 || rows[0].RequestID != "r2" || rows[1].RequestID != "r1" {
		t.Fatalf("Requests(2,0) = %d rows %+v, total %d", len(rows), rows, total)
	}
	rows, _ = s.Requests(10, 2)
	if len(rows) != 1 || rows[0].RequestID != "r0" {
		t.Fatalf("Requests(10,2) = %+v", rows)
	}
	r := rows[0]
	if r.TraceID != traceIDOf("r0") || r.Root != "chat m1" || r.RootService != "cb-engine" || r.NSpans != 22 {
		t.Fatalf("summary = %+v", r)
	}
	if !approx(r.DurationMs, 180, 1e-9) {
		t.Fatalf("duration = %v ms, want 180", r.DurationMs)
	}
	if r.HitRate == nil || !approx(*r.HitRate, 0.75, 1e-12) || *r.RequestedTokens != 1024 || *r.PrefixHitTokens != 256 || *r.NonPrefixHitTokens != 512 {
		t.Fatalf("hit rate fields = %v %v %v %v", r.HitRate, r.RequestedTokens, r.PrefixHitTokens, r.NonPrefixHitTokens)
	}
	// No TTFT attribute or event in the fixture: the end of engine.prefill (124 ms).
	if r.TTFTMs == nil || !approx(*r.TTFTMs, 124, 1e-9) || r.TTFTSource != spanname.EnginePrefill {
		t.Fatalf("ttft = %v (%s), want 124 from engine.prefill", r.TTFTMs, r.TTFTSource)
	}
	if !slices.Equal(r.Services, []string{"cb-blend", "cb-engine", "cb-worker"}) || r.Error {
		t.Fatalf("services/error = %v/%v", r.Services, r.Error)
	}
}

func TestRequestTTFTSources(t *testing.T) {
	tests := []struct {
		name       string
		mutate     func(root ptrace.Span)
		wantMs     float64
		wantSource string
	}{
		{"attribute in seconds", func(root ptrace.Span) { root.Attributes().PutDouble(AttrTTFT, 0.0425) }, 42.5, "attribute"},
		{"first_token event", func(root ptrace.Span) {
			ev := root.Events().AppendEmpty()
			ev.SetName(EventFirstToken)
			ev.SetTimestamp(root.StartTimestamp() + 37_000_000)
		}, 37, "event"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			td := tracetest.Request{RequestID: "x"}.Traces()
			forEachSpan(td, func(s ptrace.Span) {
				if s.Name() == "chat m1" {
					tc.mutate(s)
				}
			})
			s := NewStore(StoreConfig{})
			s.Add(td)
			r, ok := s.Request(traceIDOf("x"))
			if !ok || r.TTFTMs == nil || !approx(*r.TTFTMs, tc.wantMs, 1e-6) || r.TTFTSource != tc.wantSource {
				t.Fatalf("ttft = %v (%s), want %v (%s)", r.TTFTMs, r.TTFTSource, tc.wantMs, tc.wantSource)
			}
		})
	}
	// Neither attribute, event nor engine.prefill: null.
	s := NewStore(StoreConfig{})
	s.Add(build("bare", sp{name: "root", start: 0, end: 10}))
	if r, _ := s.Request(traceIDOf("bare")); r.TTFTMs != nil || r.HitRate != nil || r.RequestID != "" {
		t.Fatalf("bare trace summary = %+v", r)
	}
}

func forEachSpan(td ptrace.Traces, f func(ptrace.Span)) {
	for i := 0; i < td.ResourceSpans().Len(); i++ {
		sss := td.ResourceSpans().At(i).ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			for k := 0; k < sss.At(j).Spans().Len(); k++ {
				f(sss.At(j).Spans().At(k))
			}
		}
	}
}

func TestPTracesRoundTrip(t *testing.T) {
	s := NewStore(StoreConfig{})
	in := tracetest.Request{RequestID: "rt"}.Traces()
	s.Add(in)
	out, ok := s.PTraces(traceIDOf("rt"))
	if !ok {
		t.Fatal("PTraces: not found")
	}
	s2 := NewStore(StoreConfig{})
	s2.Add(out)
	a, _ := s.Trace(traceIDOf("rt"))
	b, _ := s2.Trace(traceIDOf("rt"))
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("store → ptrace → store changed the trace:\n%v\n%v", a, b)
	}
}

func TestStoreConcurrent(t *testing.T) {
	s := NewStore(StoreConfig{MaxTraces: 20})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range 30 {
				s.Add(tracetest.Request{RequestID: fmt.Sprint(w, "-", i)}.Traces())
			}
		}()
		go func() {
			defer wg.Done()
			for range 30 {
				s.Requests(10, 0)
				s.FindTraces(jaeger.Query{Service: "cb-blend", Limit: 5})
				s.Services()
				s.Breakdown(traceIDOf(fmt.Sprint(w, "-", 1)))
			}
		}()
	}
	wg.Wait()
	if st := s.Stats(); st.Traces != 20 || st.EvictedTraces != 100 || st.Spans != 20*22 {
		t.Fatalf("stats = %+v", st)
	}
}
