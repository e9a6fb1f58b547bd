package tracecheck

import (
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

// The traces of a healthy fleet: document ingests (the worker's spans in the
// ingest trace) and failovers whose abandoned attempt's engine went on.

var fleetStart = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// fspan is a span of a hand-built trace: times in ms from fleetStart, parent by id.
type fspan struct {
	id, parent, name, service string
	kind                      string
	start, end                float64
	attrs                     map[string]Value
}

func fleetTrace(spans ...fspan) Trace {
	const tid = "0af7651916cd43dd8448eb211c80319c"
	t := Trace{TraceID: tid}
	for _, s := range spans {
		at := func(ms float64) time.Time { return fleetStart.Add(time.Duration(ms * float64(time.Millisecond))) }
		t.Spans = append(t.Spans, Span{TraceID: tid, SpanID: s.id, ParentSpanID: s.parent, Name: s.name, Service: s.service,
			Kind: contract.SpanKind(s.kind), Start: at(s.start), End: at(s.end), Attributes: s.attrs})
	}
	return t
}

func rid(id string, more ...any) map[string]Value {
	m := map[string]Value{"request_id": Str(id)}
	for i := 0; i+1 < len(more); i += 2 {
		m[more[i].(string)] = more[i+1].(Value)
	}
	return m
}

// ingest is one document's spans: cb.store_pre_computed under parent ("" : the
// root), the worker's cb.execute (two chunked-prefill steps) with cb.model_forward,
// and the blend server's asynchronous cb.store, which ends after its parents.
func ingest(n, parent, doc string, off float64) []fspan {
	return []fspan{
		{n + "00000000000000a", parent, spanname.CBStorePreComputed, "cb-engine", "internal", off + 0, off + 40, rid(doc, "document_index", Int(0), "n_tokens", Int(512))},
		{n + "00000000000000b", n + "00000000000000a", spanname.CBExecute, "cb-worker", "server", off + 1, off + 15, rid(doc)},
		{n + "00000000000000c", n + "00000000000000b", spanname.CBModelForward, "cb-worker", "internal", off + 2, off + 14, rid(doc)},
		{n + "00000000000000d", n + "00000000000000a", spanname.CBExecute, "cb-worker", "server", off + 16, off + 30, rid(doc)},
		{n + "00000000000000e", n + "00000000000000d", spanname.CBModelForward, "cb-worker", "internal", off + 17, off + 29, rid(doc)},
		{n + "00000000000000f", n + "00000000000000d", spanname.CBStore, "cb-blend", "server", off + 29.5, off + 45, rid(doc)},
	}
}

func gatewaySpans(attempts ...fspan) []fspan {
	out := []fspan{{"a000000000000001", "", spanname.GatewayRequest, "cb-gateway", "server", -2, 400, map[string]Value{
		"http.request.method": Str("POST"), "http.route": Str("/v1/documents"), "route.policy": Str("kv-aware"),
		"route.engine": Str("10.0.0.2:8000"), "route.score": Double(0), "route.expected_hit_tokens": Int(0)}}}
	return append(out, attempts...)
}

func attempt(id string, start, end float64, abandoned *bool) fspan {
	a := map[string]Value{"route.engine": Str("10.0.0.2:8000"), "route.attempt": Int(1)}
	if abandoned != nil {
		a[AttrAbandoned] = Bool(*abandoned)
	}
	return fspan{id, "a000000000000001", spanname.GatewayAttempt, "cb-gateway", "client", start, end, a}
}

func TestIngestTraces(t *testing.T) {
	sp := spec(t)
	two := append(gatewaySpans(attempt("a000000000000002", -1, 399, nil)),
		append(ingest("1", "a000000000000002", "doc-1", 0), ingest("2", "a000000000000002", "doc-2", 50)...)...)
	noExec := ingest("1", "", "doc-1", 0)
	noExec = append(noExec[:1:1], noExec[5]) // the store only: cb.store's parent lost, no step
	withRequest := append(ingest("1", "", "doc-1", 0), fspan{"1000000000000010", "100000000000000a", spanname.CBRequest, "cb-engine", "internal", 1, 2, rid("doc-1")})
	for _, tc := range []struct {
		name string
		tr   Trace
		want []string // rule prefixes of the violations; nil: passes
	}{
		{name: "one document, its own trace", tr: fleetTrace(ingest("1", "", "doc-1", 0)...)},
		{name: "two documents under the gateway's attempt", tr: fleetTrace(two...)},
		{name: "a document without its worker steps", tr: fleetTrace(noExec...), want: []string{"parent cb.store", "required-span cb.execute"}},
		{name: "a request's span in an ingest trace", tr: fleetTrace(withRequest...), want: []string{"wrong-trace cb.request"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Check([]Trace{tc.tr}, sp)
			tr := rep.Traces[0]
			if tr.Kind != "ingest" {
				t.Fatalf("kind %q, want ingest:\n%s", tr.Kind, rep)
			}
			got := rules(tr)
			if len(got) != len(tc.want) {
				t.Fatalf("violations %q, want %q:\n%s", got, tc.want, rep)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Fatalf("violations %q, want %q:\n%s", got, tc.want, rep)
				}
			}
		})
	}
}

// engineRequest is a whole request's spans on one engine (tracetest's), started at
// start, moved into trace tid under the gateway attempt parent.
func engineRequest(t *testing.T, id string, start time.Time, tid, parent string) []Span {
	t.Helper()
	trs := FromPtrace(tracetest.Request{RequestID: id, Start: start}.Traces())
	if len(trs) != 1 {
		t.Fatalf("%d traces", len(trs))
	}
	spans := trs[0].Spans
	for i := range spans {
		spans[i].TraceID = tid
		if spans[i].ParentSpanID == "" {
			spans[i].ParentSpanID = parent
		}
	}
	return spans
}

// failover is a chat request through the gateway: attempt 1 to engine A (ms 0 to
// attemptEnd; abandoned when set), then attempt 2 to engine B, which answers. Engine A's
// request goes on for its 180 ms; lose drops spans of engine A by name (lost in its
// failed exports).
func failover(t *testing.T, abandoned *bool, attemptEnd float64, lose ...string) Trace {
	t.Helper()
	const tid = "0af7651916cd43dd8448eb211c80319c"
	g := gatewaySpans(attempt("a000000000000002", -1, attemptEnd, abandoned), attempt("a000000000000003", attemptEnd+1, 398, nil))
	g[0].attrs["http.route"] = Str("/v1/chat/completions")
	tr := fleetTrace(g...)
	a := engineRequest(t, "rA", fleetStart, tid, "a000000000000002")
	for _, name := range lose {
		for i := range a {
			if a[i].Name == name {
				a = append(a[:i], a[i+1:]...)
				break
			}
		}
	}
	b := engineRequest(t, "rB", fleetStart.Add(time.Duration(attemptEnd+5)*time.Millisecond), tid, "a000000000000003")
	tr.Spans = append(append(tr.Spans, a...), b...)
	return tr
}

func TestFailoverTraces(t *testing.T) {
	sp := spec(t)
	yes, no := true, false
	for _, tc := range []struct {
		name string
		tr   Trace
		want []string // "rule span" of the violations; nil: passes
	}{
		{name: "abandoned attempt, its engine went on", tr: failover(t, &yes, 50)},
		{name: "abandoned attempt, spans lost in failed exports",
			tr: failover(t, &yes, 50, spanname.CBRequest, spanname.CBRetrieve)},
		{name: "attempt not marked: its engine outlives it", tr: failover(t, nil, 50),
			want: []string{string(RuleInterval) + " chat m1"}},
		{name: "attempt marked false: its engine outlives it", tr: failover(t, &no, 50),
			want: []string{string(RuleInterval) + " chat m1"}},
		{name: "attempt not marked: lost spans are violations", tr: failover(t, nil, 190, spanname.CBRequest),
			want: []string{string(RuleParent) + " cb.schedule", string(RuleParent) + " cb.execute"}},
		{name: "failed attempt that ended before its engine did not", tr: failover(t, nil, 190)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Check([]Trace{tc.tr}, sp)
			tr := rep.Traces[0]
			if tr.Kind != "request" {
				t.Fatalf("kind %q, want request:\n%s", tr.Kind, rep)
			}
			if got := rules(tr); strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("violations %q, want %q:\n%s", got, tc.want, rep)
			}
		})
	}
	// A span of the answering request whose parent is lost is a violation even with an
	// abandoned attempt in the trace.
	tr := failover(t, &yes, 50)
	for i := range tr.Spans {
		if tr.Spans[i].Name == spanname.CBRequest && tr.Spans[i].Attributes["request_id"].Str == "rB" {
			tr.Spans = append(tr.Spans[:i], tr.Spans[i+1:]...)
			break
		}
	}
	rep := Check([]Trace{tr}, sp)
	if got := strings.Join(rules(rep.Traces[0]), ","); !strings.Contains(got, string(RuleParent)+" cb.schedule") {
		t.Fatalf("the live request lost cb.request, violations %q:\n%s", got, rep)
	}
}

// The client spans a caller may give up on, each with its own marker: a
// gateway attempt and a prefill engine's hand-over; another span or key is
// no marker.
func TestAbandonMarkers(t *testing.T) {
	for _, tc := range []struct {
		name, span, key string
		val             Value
		want            bool
	}{
		{"gateway attempt", spanname.GatewayAttempt, AttrAbandoned, Bool(true), true},
		{"hand-over", spanname.KVTransfer, AttrHandoffAbandoned, Bool(true), true},
		{"hand-over marked false", spanname.KVTransfer, AttrHandoffAbandoned, Bool(false), false},
		{"hand-over with the gateway's key", spanname.KVTransfer, AttrAbandoned, Bool(true), false},
		{"attempt with the hand-over's key", spanname.GatewayAttempt, AttrHandoffAbandoned, Bool(true), false},
		{"another span", spanname.CBRequest, AttrHandoffAbandoned, Bool(true), false},
		{"a string, not a bool", spanname.KVTransfer, AttrHandoffAbandoned, Str("true"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &checker{t: &Trace{Spans: []Span{{Name: tc.span, Attributes: map[string]Value{tc.key: tc.val}}}}}
			if got := c.isAbandonedAttempt(0); got != tc.want {
				t.Fatalf("abandoned %v, want %v", got, tc.want)
			}
		})
	}
}

// Inside an abandoned attempt's subtree the cancellation reaches remote
// callees late: a span there may end after its own parent; in the live
// request's part it may not.
func TestAbandonedSubtreeOutlives(t *testing.T) {
	sp := spec(t)
	yes := true
	for _, tc := range []struct {
		name, id string
		want     bool // passes
	}{
		{"abandoned request's span outlives its parent", "rA", true},
		{"live request's span outlives its parent", "rB", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := failover(t, &yes, 50)
			byID := map[string]int{}
			for i, s := range tr.Spans {
				byID[s.SpanID] = i
			}
			moved := false
			for i, s := range tr.Spans {
				if s.Name != spanname.CBRequest || s.Attributes["request_id"].Str != tc.id {
					continue
				}
				parent := tr.Spans[byID[s.ParentSpanID]]
				tr.Spans[i].End = parent.End.Add(5 * time.Millisecond)
				moved = true
			}
			if !moved {
				t.Fatal("no cb.request to move")
			}
			rep := Check([]Trace{tr}, sp)
			if got := rep.Traces[0]; (len(rules(got)) == 0) != tc.want {
				t.Fatalf("violations %q, want passing %v:\n%s", rules(got), tc.want, rep)
			}
		})
	}
}
