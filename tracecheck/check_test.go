package tracecheck

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

func spec(t testing.TB) *contract.SpanSet {
	t.Helper()
	s, err := contract.Spans()
	if err != nil {
		t.Fatalf("contract.Spans: %v", err)
	}
	return s
}

type mutation func(defs []tracetest.SpanDef) []tracetest.SpanDef

func drop(names ...string) mutation {
	return func(defs []tracetest.SpanDef) []tracetest.SpanDef {
		return slices.DeleteFunc(defs, func(d tracetest.SpanDef) bool { return slices.Contains(names, d.Name) })
	}
}

func edit(name string, f func(d *tracetest.SpanDef)) mutation {
	return func(defs []tracetest.SpanDef) []tracetest.SpanDef {
		for i := range defs {
			if defs[i].Name == name {
				f(&defs[i])
			}
		}
		return defs
	}
}

func add(d tracetest.SpanDef) mutation {
	return func(defs []tracetest.SpanDef) []tracetest.SpanDef { return append(defs, d) }
}

func setAttr(name, key string, v any) mutation {
	return edit(name, func(d *tracetest.SpanDef) {
		m := map[string]any{}
		for k, x := range d.Attrs {
			m[k] = x
		}
		if v == nil {
			delete(m, key)
		} else {
			m[key] = v
		}
		d.Attrs = m
	})
}

func request(r tracetest.Request, ms ...mutation) ptrace.Traces {
	defs := r.Defs()
	for _, m := range ms {
		defs = m(defs)
	}
	return tracetest.Build(r, defs)
}

func rules(tr TraceResult) []string {
	var out []string
	for _, v := range tr.Violations {
		out = append(out, string(v.Rule)+" "+v.Span)
	}
	return out
}

func TestCheck(t *testing.T) {
	sp := spec(t)
	r1 := tracetest.Request{RequestID: "r1"}
	tests := []struct {
		name string
		td   ptrace.Traces
		want []string // "rule span" per violation, in report order; nil = PASS
		note string   // a note the result must carry
	}{
		{name: "valid", td: r1.Traces()},
		{name: "missing span", td: request(r1, drop(spanname.CBClassify)), want: []string{"required-span cb.classify"}},
		{name: "missing subtree reported once",
			td:   request(r1, drop(spanname.CBLookup, spanname.MPLookupPrefetch, spanname.CBFingerprintMatch, spanname.CBSparsePrefetch, spanname.CBL2Load, spanname.CBClassify)),
			want: []string{"required-span cb.lookup"}},
		{name: "wrong parent", td: request(r1, edit(spanname.CBScatter, func(d *tracetest.SpanDef) { d.Parent = spanname.CBLookup; d.StartMs, d.EndMs = 10, 12 })),
			want: []string{"parent cb.scatter", "required-span cb.scatter"}}, // and none under the retrieve that wrote tokens
		{name: "blended forward without its phases", td: request(r1, drop(spanname.CBPartial)), want: []string{"required-span cb.partial"}},
		{name: "the server answered the load but left no cb.retrieve", td: request(r1, drop(spanname.CBRetrieve, spanname.CBScatter)),
			want: []string{"required-span cb.retrieve"}},
		{name: "a retrieve that wrote nothing has no copy", td: request(r1, setAttr(spanname.CBRetrieve, "scattered_tokens", int64(0)), drop(spanname.CBScatter))},
		{name: "the load failed (blend server gone): computed in full",
			td: request(r1, edit(spanname.CBStartLoadKV, func(d *tracetest.SpanDef) {
				d.Attrs = map[string]any{"request_id": "r1", "error.type": "retrieve_failed"} // no answer from the server
			}), drop(spanname.CBRetrieve, spanname.CBScatter,
				spanname.CBFullRecomp, spanname.CBCheck, spanname.CBPartial), edit(spanname.CBModelForward, func(d *tracetest.SpanDef) {
				d.Attrs = map[string]any{"request_id": "r1"}
			}))},
		{name: "wrong attribute type", td: request(r1, setAttr(spanname.CBLookupRPC, "n_polls", "3")), want: []string{"attribute-type cb.lookup.rpc"}},
		{name: "double where int is declared", td: request(r1, setAttr(spanname.CBScatter, "dropped", 0.0)), want: []string{"attribute-type cb.scatter"}},
		{name: "wrong optional attribute type", td: request(r1, setAttr("chat m1", "gen_ai.usage.output_tokens", "16")), want: []string{"attribute-type chat m1"}},
		{name: "missing attribute", td: request(r1, setAttr(spanname.CBCheck, "imp_count", nil)), want: []string{"attribute-missing cb.check"}},
		{name: "child outside its parent, same process",
			td: request(r1, edit(spanname.CBScatter, func(d *tracetest.SpanDef) { d.EndMs = 61 })), want: []string{"interval cb.scatter"}},
		{name: "child ends 1 µs after its parent, same process (no tolerance)",
			td: request(r1, edit(spanname.CBScatter, func(d *tracetest.SpanDef) { d.EndMs = 60.001 })), want: []string{"interval cb.scatter"}},
		{name: "child starts 1 µs before its parent, same process",
			td: request(r1, edit(spanname.CBBuildMeta, func(d *tracetest.SpanDef) { d.StartMs = 2.999 })), want: []string{"interval cb.build_meta"}},
		{name: "child ends exactly with its parent, same process",
			td: request(r1, edit(spanname.CBScatter, func(d *tracetest.SpanDef) { d.EndMs = 60 }))},
		{name: "remote child within the cross-process tolerance",
			td: request(r1, edit(spanname.CBLookup, func(d *tracetest.SpanDef) { d.StartMs = 3.85 }))}, // 150 µs before cb.lookup.rpc
		{name: "remote child starts beyond the cross-process tolerance",
			td: request(r1, edit(spanname.CBLookup, func(d *tracetest.SpanDef) { d.StartMs = 3.7 })), want: []string{"interval cb.lookup"}}, // 300 µs before
		{name: "remote child ends beyond the cross-process tolerance",
			td: request(r1, edit(spanname.CBRetrieve, func(d *tracetest.SpanDef) { d.EndMs = 61.25 })), want: []string{"interval cb.retrieve"}}, // 250 µs after cb.start_load_kv
		{name: "remote child far outside its parent",
			td: request(r1, edit(spanname.CBExecute, func(d *tracetest.SpanDef) { d.EndMs = 128 })), want: []string{"interval cb.execute"}}, // 6 ms after cb.request
		{name: "ends before it starts", td: request(r1, edit(spanname.CBBuildMeta, func(d *tracetest.SpanDef) { d.EndMs = 37.5 })),
			want: []string{"interval cb.build_meta"}},
		{name: "ends before it starts, a leaf of another process", td: request(r1, edit(spanname.CBCheck, func(d *tracetest.SpanDef) { d.StartMs, d.EndMs = 83, 81 })),
			want: []string{"interval cb.check"}},
		{name: "ends before it starts, the root", td: request(r1, edit("chat m1", func(d *tracetest.SpanDef) { d.EndMs = -1 })),
			want: []string{"interval chat m1", "interval engine.queue", "interval cb.request", "interval engine.prefill", "interval engine.decode"}},
		{name: "inconsistent hit_rate", td: request(r1, setAttr(spanname.CBRequest, "hit_rate", 0.5)), want: []string{"hit-rate cb.request"}},
		{name: "hit_rate within 1e-6", td: request(r1, setAttr(spanname.CBRequest, "hit_rate", 0.75+5e-7))},
		{name: "hits exceed the request", td: request(r1, setAttr(spanname.CBRequest, "requested_tokens", int64(700)), setAttr(spanname.CBRequest, "hit_rate", 768.0/700),
			setAttr(spanname.CBRequest, "n_non_prefix_tokens", int64(444))),
			want: []string{"hit-rate cb.request", "hit-rate cb.request", "hit-rate cb.request"}}, // hits > requested; non-prefix hits > complement; requested != n_prompt_tokens
		{name: "hit_tokens not the sum of the legs", td: request(r1, setAttr(spanname.CBLookup, "hit_tokens", int64(700))),
			want: []string{"hit-rate cb.lookup", "hit-rate cb.lookup"}}, // the sum; hit_rate against hit_tokens
		{name: "coverage and complement do not add up", td: request(r1, setAttr(spanname.CBRequest, "n_non_prefix_tokens", int64(700))),
			want: []string{"hit-rate cb.request"}},
		{name: "prefix hits beyond the prefix coverage", td: request(r1, setAttr(spanname.CBRequest, "prefix_coverage_tokens", int64(0)),
			setAttr(spanname.CBRequest, "n_non_prefix_tokens", int64(1024))),
			want: []string{"hit-rate cb.request"}},
		{name: "missing seed attributes", td: request(r1, setAttr(spanname.CBRequest, "prefix_coverage_tokens", nil), setAttr(spanname.CBScatter, "n_shifted_tokens", nil),
			setAttr(spanname.CBRetrieve, "scatter_ms", nil)),
			want: []string{"attribute-missing cb.request", "attribute-missing cb.retrieve", "attribute-missing cb.scatter"}},
		{name: "old shortened scatter names", td: request(r1, edit(spanname.CBScatter, func(d *tracetest.SpanDef) {
			d.Attrs["n_prefix"], d.Attrs["n_shifted"] = d.Attrs["n_prefix_tokens"], d.Attrs["n_shifted_tokens"]
			delete(d.Attrs, "n_prefix_tokens")
			delete(d.Attrs, "n_shifted_tokens")
		})), want: []string{"attribute-missing cb.scatter", "attribute-missing cb.scatter"}},
		{name: "reuse off: no lookup subtree", td: tracetest.Request{RequestID: "cold", Lookup: "skipped"}.Traces()},
		{name: "blend server down: the lookup call failed", td: tracetest.Request{RequestID: "down", Lookup: "unavailable"}.Traces()},
		{name: "lookup timed out", td: tracetest.Request{RequestID: "slow", Lookup: "timeout"}.Traces()},
		{name: "lookup refused", td: tracetest.Request{RequestID: "busy", Lookup: "queue_full"}.Traces()},
		{name: "lookup failed without its call span",
			td: request(tracetest.Request{RequestID: "gone", Lookup: "error"}, drop(spanname.CBLookupRPC)), want: []string{"required-span cb.lookup.rpc"}},
		{name: "lookup skipped but hits stamped",
			td:   request(tracetest.Request{RequestID: "cold", Lookup: "skipped"}, setAttr(spanname.CBRequest, "storage_hits", int64(3))),
			want: []string{"hit-rate cb.request"}},
		{name: "lookup done without the server's span",
			td:   request(r1, drop(spanname.CBLookup, spanname.MPLookupPrefetch, spanname.CBFingerprintMatch, spanname.CBSparsePrefetch, spanname.CBL2Load, spanname.CBClassify)),
			want: []string{"required-span cb.lookup"}},
		{name: "no lookup attribute", td: request(tracetest.Request{RequestID: "cold", Lookup: "skipped"}, setAttr(spanname.CBRequest, "lookup", nil)),
			want: []string{"attribute-missing cb.request"}},
		{name: "wrong service", td: request(r1, edit(spanname.CBExecute, func(d *tracetest.SpanDef) { d.Service = tracetest.Engine })),
			want: []string{"service cb.execute"}},
		{name: "wrong kind", td: request(r1, edit(spanname.CBLookup, func(d *tracetest.SpanDef) { d.Kind = ptrace.SpanKindInternal })),
			want: []string{"kind cb.lookup"}},
		{name: "no L2 misses, no cb.l2_load", td: request(r1, setAttr(spanname.CBSparsePrefetch, "l2_misses", int64(0)), drop(spanname.CBL2Load))},
		{name: "L2 misses without cb.l2_load", td: request(r1, drop(spanname.CBL2Load)), want: []string{"required-span cb.l2_load"}},
		{name: "no reuse, no load or recompute spans",
			td: request(tracetest.Request{RequestID: "cold", PromptTokens: 1000, PrefixHit: 0, NonPrefixHit: 0},
				drop(spanname.CBStartLoadKV, spanname.CBRetrieve, spanname.CBScatter, spanname.CBFullRecomp, spanname.CBCheck, spanname.CBPartial))},
		{name: "coordinator instead of fingerprint match",
			td: request(r1, edit(spanname.CBFingerprintMatch, func(d *tracetest.SpanDef) {
				d.Name, d.Attrs = spanname.CBCoordinatorMatch, map[string]any{"request_id": "r1", "matches": int64(2), "timed_out": false}
			}))},
		{name: "a span that may not repeat, twice",
			td: request(r1, add(tracetest.SpanDef{Name: spanname.CBClassify, Service: tracetest.Blend, Kind: ptrace.SpanKindInternal, Parent: spanname.CBLookup,
				StartMs: 32, EndMs: 32.5, Attrs: map[string]any{"request_id": "r1", "found": int64(1), "stale": int64(0), "per_rank_ok": int64(1), "pending": int64(0)}})),
			want: []string{"repeated-span cb.classify"}},
		{name: "cb.store may end after the request (async)",
			td: request(r1, add(tracetest.SpanDef{Name: spanname.CBStore, Service: tracetest.Blend, Kind: ptrace.SpanKindServer, Parent: spanname.CBExecute,
				StartMs: 119, EndMs: 400, Attrs: map[string]any{"request_id": "r1"}}))},
		{name: "cb.store may not start before its parent",
			td: request(r1, add(tracetest.SpanDef{Name: spanname.CBStore, Service: tracetest.Blend, Kind: ptrace.SpanKindServer, Parent: spanname.CBExecute,
				StartMs: 41, EndMs: 400, Attrs: map[string]any{"request_id": "r1"}})), want: []string{"interval cb.store"}},
		{name: "a span outside the contract is checked too",
			td: request(r1, add(tracetest.SpanDef{Name: "cb.extra", Service: tracetest.Worker, Kind: ptrace.SpanKindInternal, Parent: spanname.CBModelForward,
				StartMs: 100, EndMs: 119.5, Attrs: map[string]any{"request_id": "r1"}})), want: []string{"interval cb.extra"}},
		{name: "ingest span in a request trace",
			td: request(r1, add(tracetest.SpanDef{Name: spanname.CBStorePreComputed, Service: tracetest.Engine, Kind: ptrace.SpanKindInternal, Parent: spanname.CBRequest,
				StartMs: 5, EndMs: 6, Attrs: map[string]any{"request_id": "r1"}})),
			want: []string{"wrong-trace cb.store_pre_computed"}},
		{name: "failed request need not have every span",
			td: request(r1, setAttr("chat m1", "error.type", "timeout"), drop(spanname.EnginePrefill, spanname.EngineDecode, spanname.CBExecute, spanname.CBStartLoadKV,
				spanname.CBRetrieve, spanname.CBScatter, spanname.CBModelForward, spanname.CBFullRecomp, spanname.CBCheck, spanname.CBPartial)),
			note: "the request failed (error.type=timeout)"},
		{name: "lost parent",
			td:   request(r1, edit(spanname.CBCheck, func(d *tracetest.SpanDef) { d.Parent = "never-exported" })),
			want: []string{"parent cb.check", "required-span cb.check"}}, // and none under the blended forward
		{name: "root is not the SERVER span",
			td:   request(r1, drop("chat m1", spanname.EngineQueue, spanname.EnginePrefill, spanname.EngineDecode)),
			want: []string{"root cb.request", "required-span {operation} {model}"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			traces := FromPtrace(tc.td)
			if len(traces) != 1 {
				t.Fatalf("%d traces, want 1", len(traces))
			}
			rep := Check(traces, sp)
			tr := rep.Traces[0]
			got := rules(tr)
			if strings.Join(got, "; ") != strings.Join(tc.want, "; ") {
				t.Fatalf("violations = %q, want %q\n%s", got, tc.want, rep)
			}
			if rep.OK() != (len(tc.want) == 0) {
				t.Fatalf("OK() = %v with violations %v", rep.OK(), got)
			}
			if tc.note != "" && !slices.ContainsFunc(tr.Notes, func(n string) bool { return strings.Contains(n, tc.note) }) {
				t.Fatalf("notes %q lack %q", tr.Notes, tc.note)
			}
			if tr.Kind != contract.TraceRequest || tr.Skipped {
				t.Fatalf("checked as %q (skipped %v)", tr.Kind, tr.Skipped)
			}
			text := rep.String()
			wantStatus := "PASS  trace "
			if len(tc.want) > 0 {
				wantStatus = "FAIL  trace "
			}
			if !strings.Contains(text, wantStatus+tr.TraceID) {
				t.Fatalf("report text lacks %q:\n%s", wantStatus+tr.TraceID, text)
			}
		})
	}
}

// TestCheckTwoTraceIDs: the blend server's spans land in a trace of their own (the
// option-B fallback with no propagation): both traces fail the one-trace-id rule.
func TestCheckTwoTraceIDs(t *testing.T) {
	td := tracetest.Request{RequestID: "r1"}.Traces()
	other := tracetest.TraceID("elsewhere")
	for i := 0; i < td.ResourceSpans().Len(); i++ {
		rs := td.ResourceSpans().At(i)
		if v, _ := rs.Resource().Attributes().Get("service.name"); v.Str() != tracetest.Blend {
			continue
		}
		spans := rs.ScopeSpans().At(0).Spans()
		for k := 0; k < spans.Len(); k++ {
			if spans.At(k).Name() == spanname.CBLookup || strings.HasPrefix(spans.At(k).Name(), "cb.") && spans.At(k).Name() != spanname.CBRetrieve && spans.At(k).Name() != spanname.CBScatter {
				spans.At(k).SetTraceID(other)
			}
		}
	}
	traces := FromPtrace(td)
	if len(traces) != 2 {
		t.Fatalf("%d traces, want 2", len(traces))
	}
	rep := Check(traces, spec(t))
	if rep.OK() {
		t.Fatalf("two trace ids passed:\n%s", rep)
	}
	for _, tr := range rep.Traces {
		if !slices.ContainsFunc(tr.Violations, func(v Violation) bool { return v.Rule == RuleOneTraceID && strings.Contains(v.Message, "request r1") }) {
			t.Fatalf("trace %s lacks the one-trace-id violation:\n%s", tr.TraceID, rep)
		}
	}
	// Within one Trace value, a span of another trace id is flagged too.
	one := FromPtrace(tracetest.Request{RequestID: "r2"}.Traces())
	one[0].Spans[3].TraceID = other.String()
	rep = Check(one, spec(t))
	if got := rules(rep.Traces[0]); !slices.Contains(got, "one-trace-id ") {
		t.Fatalf("violations = %q, want a one-trace-id", got)
	}
}

func TestCheckSeveralRequestsInOneTrace(t *testing.T) {
	traces := FromPtrace(request(tracetest.Request{RequestID: "r1"}, setAttr(spanname.CBPartial, "request_id", "r9")))
	rep := Check(traces, spec(t))
	if got := rules(rep.Traces[0]); !slices.Equal(got, []string{"one-trace-id "}) {
		t.Fatalf("violations = %q\n%s", got, rep)
	}
}

func TestCheckSkipsForeignTraces(t *testing.T) {
	foreign := tracetest.Build(tracetest.Request{RequestID: "x"}, []tracetest.SpanDef{{Name: "GET /health", Service: "other", StartMs: 0, EndMs: 1}})
	sp := spec(t)
	rep := Check(FromPtrace(foreign), sp)
	if rep.OK() || !rep.Traces[0].Skipped || !rep.Traces[0].OK() {
		t.Fatalf("only a foreign trace: OK=%v, result %+v", rep.OK(), rep.Traces[0])
	}
	rep = Check(FromPtrace(foreign, tracetest.Request{RequestID: "r1"}.Traces()), sp)
	if p, f, s := rep.Counts(); !rep.OK() || p != 1 || f != 0 || s != 1 {
		t.Fatalf("foreign + valid: OK=%v counts %d/%d/%d", rep.OK(), p, f, s)
	}
	if rep := Check(nil, sp); rep.OK() {
		t.Fatal("no traces at all must not be OK")
	}
}

func TestCheckOptions(t *testing.T) {
	// cb.scatter ends 0.3 ms after cb.retrieve: outside by default (same process, no tolerance).
	td := request(tracetest.Request{RequestID: "r1"}, edit(spanname.CBScatter, func(d *tracetest.SpanDef) { d.EndMs = 60.3 }))
	sp := spec(t)
	if rep := Check(FromPtrace(td), sp); rep.OK() {
		t.Fatal("a child 0.3 ms outside its parent in one process passed the default check")
	}
	if rep := CheckWith(FromPtrace(td), sp, Options{SameProcessTolerance: 500 * time.Microsecond}); !rep.OK() {
		t.Fatalf("explicit 0.5 ms same-process tolerance:\n%s", rep)
	}
	// cb.retrieve ends 150 µs after cb.start_load_kv: inside the cross-process default.
	td = request(tracetest.Request{RequestID: "r1"}, edit(spanname.CBRetrieve, func(d *tracetest.SpanDef) { d.EndMs = 61.15 }))
	if rep := Check(FromPtrace(td), sp); !rep.OK() {
		t.Fatalf("150 µs across processes:\n%s", rep)
	}
	if rep := CheckWith(FromPtrace(td), sp, Options{CrossProcessTolerance: -1}); rep.OK() {
		t.Fatal("no cross-process tolerance: passed")
	}
	if opts := (Options{}).withDefaults(); opts.CrossProcessTolerance != 200*time.Microsecond || opts.SameProcessTolerance != 0 || opts.HitRateTolerance != 1e-6 {
		t.Fatalf("defaults = %+v", opts)
	}
}

// TestCheckPrecision: a trace read through the Jaeger model has whole microseconds, its
// start and duration truncated separately, so an end reads up to 2 µs early; the check
// allows that rounding on end comparisons and nothing more.
func TestCheckPrecision(t *testing.T) {
	sp := spec(t)
	// Exactly nested in nanoseconds: cb.scatter [45, 59.9995] ms inside cb.retrieve
	// [44.0009, 59.9995] ms; truncated to µs (start, then duration), the child's end reads
	// 59.999 ms and the parent's 59.998 ms.
	td := request(tracetest.Request{RequestID: "r1"}, edit(spanname.CBScatter, func(d *tracetest.SpanDef) { d.StartMs = 45; d.EndMs = 59.9995 }),
		edit(spanname.CBRetrieve, func(d *tracetest.SpanDef) { d.StartMs = 44.0009; d.EndMs = 59.9995 }))
	traces := FromPtrace(td)
	for i := range traces[0].Spans {
		s := &traces[0].Spans[i]
		d := s.End.Sub(s.Start) / time.Microsecond * time.Microsecond
		s.Start = s.Start.Truncate(time.Microsecond)
		s.End = s.Start.Add(d)
	}
	if rep := Check(traces, sp); rep.OK() {
		t.Fatal("the truncation artefact was not visible: the test proves nothing")
	}
	traces[0].Precision = time.Microsecond
	if rep := Check(traces, sp); !rep.OK() {
		t.Fatalf("microsecond precision:\n%s", rep)
	}
	// Beyond the rounding: 3 µs after the parent fails even at microsecond precision.
	for i := range traces[0].Spans {
		if s := &traces[0].Spans[i]; s.Name == spanname.CBScatter {
			s.End = s.End.Add(3 * time.Microsecond)
		}
	}
	if rep := Check(traces, sp); rep.OK() {
		t.Fatal("3 µs outside passed at microsecond precision")
	}
}

func TestCheckDoesNotModifyInput(t *testing.T) {
	traces := FromPtrace(tracetest.Request{RequestID: "r1"}.Traces())
	traces[0].TraceID = ""
	Check(traces, spec(t))
	if traces[0].TraceID != "" {
		t.Fatal("Check wrote to its input")
	}
}

func BenchmarkCheck(b *testing.B) {
	traces := FromPtrace(tracetest.Request{RequestID: "r1"}.Traces())
	sp := spec(b)
	b.ReportAllocs()
	for b.Loop() {
		if !Check(traces, sp).OK() {
			b.Fatal("not OK")
		}
	}
}

func TestCheckMayRepeat(t *testing.T) {
	td := request(tracetest.Request{RequestID: "r1"},
		add(tracetest.SpanDef{Name: spanname.CBStartLoadKV, Service: tracetest.Worker, Kind: ptrace.SpanKindClient, Parent: spanname.CBExecute,
			StartMs: 50, EndMs: 60, Attrs: map[string]any{"request_id": "r1"}}),
		// Parents name a span's first occurrence: this pass hangs under the first load and
		// writes nothing itself (its copy below goes to the first retrieve).
		add(tracetest.SpanDef{Name: spanname.CBRetrieve, Service: tracetest.Blend, Kind: ptrace.SpanKindServer, Parent: spanname.CBStartLoadKV,
			StartMs: 52, EndMs: 56, Attrs: func() map[string]any { m := scatterAttrs(); m["scattered_tokens"] = int64(0); return m }()}),
		add(tracetest.SpanDef{Name: spanname.CBScatter, Service: tracetest.Blend, Kind: ptrace.SpanKindInternal, Parent: spanname.CBRetrieve,
			StartMs: 53, EndMs: 55, Attrs: scatterAttrs()}))
	if rep := Check(FromPtrace(td), spec(t)); !rep.OK() {
		t.Fatalf("repeated may_repeat spans failed:\n%s", rep)
	}
}

func scatterAttrs() map[string]any {
	return map[string]any{"request_id": "r1", "scattered_tokens": int64(1), "slot_writes": int64(1), "partial_blocks": int64(0),
		"n_prefix_tokens": int64(0), "n_shifted_tokens": int64(1), "dropped": int64(0), "scatter_ms": 2.0}
}

func TestCheckTracingCallerAboveTheRoot(t *testing.T) {
	td := request(tracetest.Request{RequestID: "r1"},
		edit("chat m1", func(d *tracetest.SpanDef) { d.Parent = "load request" }),
		add(tracetest.SpanDef{Name: "load request", Service: "cb-load", Kind: ptrace.SpanKindClient, StartMs: -1, EndMs: 181}))
	rep := Check(FromPtrace(td), spec(t))
	if !rep.OK() || len(rep.Traces[0].Notes) != 1 || !strings.Contains(rep.Traces[0].Notes[0], "caller outside the contract") {
		t.Fatalf("a traced caller above the SERVER span:\n%s", rep)
	}
}
