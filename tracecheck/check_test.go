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
			want: []string{"parent cb.scatter"}},
		{name: "wrong attribute type", td: request(r1, setAttr(spanname.CBLookupRPC, "n_polls", "3")), want: []string{"attribute-type cb.lookup.rpc"}},
		{name: "double where int is declared", td: request(r1, setAttr(spanname.CBScatter, "dropped", 0.0)), want: []string{"attribute-type cb.scatter"}},
		{name: "wrong optional attribute type", td: request(r1, setAttr("chat m1", "gen_ai.usage.output_tokens", "16")), want: []string{"attribute-type chat m1"}},
		{name: "missing attribute", td: request(r1, setAttr(spanname.CBCheck, "imp_count", nil)), want: []string{"attribute-missing cb.check"}},
		{name: "child outside its parent, same process",
			td: request(r1, edit(spanname.CBScatter, func(d *tracetest.SpanDef) { d.EndMs = 61 })), want: []string{"interval cb.scatter"}},
		{name: "remote child within the cross-process tolerance",
			td: request(r1, edit(spanname.CBLookup, func(d *tracetest.SpanDef) { d.StartMs = 0.5 }))}, // 3.5 ms before cb.lookup.rpc
		{name: "remote child beyond the cross-process tolerance",
			td: request(r1, edit(spanname.CBExecute, func(d *tracetest.SpanDef) { d.EndMs = 128 })), want: []string{"interval cb.execute"}}, // 6 ms after cb.request
		{name: "ends before it starts", td: request(r1, edit(spanname.CBBuildMeta, func(d *tracetest.SpanDef) { d.EndMs = 37.5 })),
			want: []string{"interval cb.build_meta"}},
		{name: "inconsistent hit_rate", td: request(r1, setAttr(spanname.CBRequest, "hit_rate", 0.5)), want: []string{"hit-rate cb.request"}},
		{name: "hit_rate within 1e-6", td: request(r1, setAttr(spanname.CBRequest, "hit_rate", 0.75+5e-7))},
		{name: "hits exceed the request", td: request(r1, setAttr(spanname.CBRequest, "requested_tokens", int64(700)), setAttr(spanname.CBRequest, "hit_rate", 768.0/700)),
			want: []string{"hit-rate cb.request"}},
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
				StartMs: 32, EndMs: 32.5, Attrs: map[string]any{"request_id": "r1", "found": int64(1), "stale": int64(0), "per_rank_ok": int64(1)}})),
			want: []string{"repeated-span cb.classify"}},
		{name: "cb.store may end after the request",
			td: request(r1, add(tracetest.SpanDef{Name: spanname.CBStore, Service: tracetest.Blend, Kind: ptrace.SpanKindServer, Parent: spanname.CBExecute,
				StartMs: 119, EndMs: 400, Attrs: map[string]any{"request_id": "r1"}}))},
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
			want: []string{"parent cb.check"}},
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
	// cb.scatter ends 0.3 ms after cb.retrieve: inside the default 0.5 ms.
	td := request(tracetest.Request{RequestID: "r1"}, edit(spanname.CBScatter, func(d *tracetest.SpanDef) { d.EndMs = 60.3 }))
	sp := spec(t)
	if rep := Check(FromPtrace(td), sp); !rep.OK() {
		t.Fatalf("default tolerance:\n%s", rep)
	}
	if rep := CheckWith(FromPtrace(td), sp, Options{SameProcessTolerance: -1}); rep.OK() {
		t.Fatal("no tolerance: passed")
	}
	// A cb.store ending late fails when nothing is detached.
	td = request(tracetest.Request{RequestID: "r1"}, add(tracetest.SpanDef{Name: spanname.CBStore, Service: tracetest.Blend, Kind: ptrace.SpanKindServer,
		Parent: spanname.CBExecute, StartMs: 119, EndMs: 300, Attrs: map[string]any{"request_id": "r1"}}))
	if rep := CheckWith(FromPtrace(td), sp, Options{Detached: []string{}}); rep.OK() {
		t.Fatal("late cb.store passed with Detached empty")
	}
	if opts := (Options{}).withDefaults(); opts.CrossProcessTolerance != 5*time.Millisecond || opts.SameProcessTolerance != 500*time.Microsecond || opts.HitRateTolerance != 1e-6 {
		t.Fatalf("defaults = %+v", opts)
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
		add(tracetest.SpanDef{Name: spanname.CBRetrieve, Service: tracetest.Blend, Kind: ptrace.SpanKindServer, Parent: spanname.CBStartLoadKV,
			StartMs: 52, EndMs: 56, Attrs: map[string]any{"request_id": "r1"}}),
		add(tracetest.SpanDef{Name: spanname.CBScatter, Service: tracetest.Blend, Kind: ptrace.SpanKindInternal, Parent: spanname.CBRetrieve,
			StartMs: 53, EndMs: 55, Attrs: map[string]any{"request_id": "r1", "scattered_tokens": int64(1), "slot_writes": int64(1),
				"partial_blocks": int64(0), "n_prefix": int64(0), "n_shifted": int64(1), "dropped": int64(0)}}))
	if rep := Check(FromPtrace(td), spec(t)); !rep.OK() {
		t.Fatalf("repeated may_repeat spans failed:\n%s", rep)
	}
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
