package tracestore

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

func TestBreakdownCases(t *testing.T) {
	type want struct {
		self, attributed, critical float64 // ms
	}
	tests := []struct {
		name     string
		spans    []sp
		want     map[string]want
		path     []string // critical path span names, in time order
		detached int
	}{
		{
			name:  "sequential children",
			spans: []sp{{name: "root", start: 0, end: 100}, {name: "a", parent: "root", start: 10, end: 40}, {name: "b", parent: "root", start: 50, end: 90}},
			want:  map[string]want{"root": {30, 30, 30}, "a": {30, 30, 30}, "b": {40, 40, 40}},
			path:  []string{"root", "a", "root", "b", "root"},
		},
		{
			name:  "overlapping siblings share the overlap",
			spans: []sp{{name: "root", start: 0, end: 100}, {name: "a", parent: "root", start: 10, end: 60}, {name: "b", parent: "root", start: 40, end: 90}},
			want:  map[string]want{"root": {20, 20, 20}, "a": {50, 40, 30}, "b": {50, 40, 50}},
			path:  []string{"root", "a", "b", "root"},
		},
		{
			name:  "child sticking out is clipped",
			spans: []sp{{name: "root", start: 0, end: 100}, {name: "c", parent: "root", service: tracetest.Blend, start: 90, end: 110}},
			want:  map[string]want{"root": {90, 90, 90}, "c": {10, 10, 10}},
			path:  []string{"root", "c"},
		},
		{
			name:  "child outside the parent gets nothing",
			spans: []sp{{name: "root", start: 0, end: 100}, {name: "d", parent: "root", start: 120, end: 130}},
			want:  map[string]want{"root": {100, 100, 100}, "d": {0, 0, 0}},
			path:  []string{"root"},
		},
		{
			name: "nested",
			spans: []sp{{name: "root", start: 0, end: 100}, {name: "a", parent: "root", start: 0, end: 100},
				{name: "b", parent: "a", start: 20, end: 30}},
			want: map[string]want{"root": {0, 0, 0}, "a": {90, 90, 90}, "b": {10, 10, 10}},
			path: []string{"a", "b", "a"},
		},
		{
			name:     "span with a missing parent is attached to the root",
			spans:    []sp{{name: "root", start: 0, end: 100}, {name: "orphan", parent: "lost", start: 30, end: 50}},
			want:     map[string]want{"root": {80, 80, 80}, "orphan": {20, 20, 20}},
			path:     []string{"root", "orphan", "root"},
			detached: 1,
		},
		{
			name:     "the longest parentless span is the root",
			spans:    []sp{{name: "short", start: 10, end: 20}, {name: "long", start: 0, end: 50}},
			want:     map[string]want{"long": {40, 40, 40}, "short": {10, 10, 10}},
			path:     []string{"long", "short", "long"},
			detached: 1,
		},
		{
			name: "parent cycle is broken",
			spans: []sp{{name: "root", start: 0, end: 100}, {name: "x", parent: "y", start: 10, end: 20},
				{name: "y", parent: "x", start: 12, end: 18}},
			want:     map[string]want{"root": {90, 90, 90}, "x": {4, 4, 4}, "y": {6, 6, 6}},
			path:     []string{"root", "x", "y", "x", "root"},
			detached: 1,
		},
		{
			name:  "zero-length span",
			spans: []sp{{name: "root", start: 0, end: 100}, {name: "z", parent: "root", start: 50, end: 50}},
			want:  map[string]want{"root": {100, 100, 100}, "z": {0, 0, 0}},
			path:  []string{"root"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bd := computeBreakdown(spansOf(t, build("k", tc.spans...)))
			byName := map[string]SpanTiming{}
			for _, s := range bd.Spans {
				byName[s.Name] = s
			}
			for name, w := range tc.want {
				s, ok := byName[name]
				if !ok {
					t.Fatalf("span %s missing from breakdown", name)
				}
				if s.SelfNs != ms(w.self) || !approx(s.AttributedNs, float64(ms(w.attributed)), 1) || s.CriticalNs != ms(w.critical) {
					t.Errorf("%s: self=%v attributed=%v critical=%v ms, want %v/%v/%v", name,
						float64(s.SelfNs)/1e6, s.AttributedNs/1e6, float64(s.CriticalNs)/1e6, w.self, w.attributed, w.critical)
				}
			}
			var path []string
			for _, seg := range bd.CriticalPath {
				path = append(path, seg.Name)
			}
			if fmt.Sprint(path) != fmt.Sprint(tc.path) {
				t.Errorf("critical path = %v, want %v", path, tc.path)
			}
			if bd.Detached != tc.detached {
				t.Errorf("detached = %d, want %d", bd.Detached, tc.detached)
			}
			checkInvariants(t, bd)
		})
	}
}

// checkInvariants asserts what every breakdown promises.
func checkInvariants(t *testing.T, bd Breakdown) {
	t.Helper()
	var sumSpans, sumGroups float64
	for _, s := range bd.Spans {
		if s.SelfNs < 0 || s.AttributedNs < -1e-6 || s.CriticalNs < 0 {
			t.Fatalf("negative time in %+v", s)
		}
		if s.AttributedNs > float64(s.ClippedEndNs-s.ClippedStartNs)+1e-3 {
			t.Fatalf("span %s attributed %v > its clipped duration", s.Name, s.AttributedNs)
		}
		sumSpans += s.AttributedNs
	}
	for _, g := range bd.Groups {
		sumGroups += g.AttributedNs
	}
	tol := 1e-6 * float64(max(bd.DurationNs, 1))
	if !approx(sumSpans, float64(bd.DurationNs), tol) || !approx(sumGroups, float64(bd.DurationNs), tol) {
		t.Fatalf("attributed sums %v (spans) %v (groups), want root duration %d", sumSpans, sumGroups, bd.DurationNs)
	}
	// The critical path tiles [0, duration].
	cursor := int64(0)
	for _, seg := range bd.CriticalPath {
		if seg.StartNs != cursor || seg.EndNs <= seg.StartNs {
			t.Fatalf("critical path not contiguous at %d: %+v", cursor, seg)
		}
		cursor = seg.EndNs
	}
	if cursor != bd.DurationNs {
		t.Fatalf("critical path ends at %d, root at %d", cursor, bd.DurationNs)
	}
}

func TestBreakdownContractTrace(t *testing.T) {
	bd := computeBreakdown(spansOf(t, tracetest.Request{RequestID: "r1"}.Traces()))
	if bd.DurationNs != ms(180) || bd.RootName != "chat m1" || bd.RequestID != "r1" || len(bd.Spans) != 22 {
		t.Fatalf("breakdown header = %+v", bd)
	}
	checkInvariants(t, bd)
	if bd.Spans[0].Name != "chat m1" || bd.Spans[0].Depth != 0 || bd.Spans[0].Phase != "request" {
		t.Fatalf("first span = %+v", bd.Spans[0])
	}
	groups := map[string]GroupTiming{}
	for _, g := range bd.Groups {
		groups[g.Service+"/"+g.Phase] = g
	}
	// cb-blend's lookup subtree (cb.lookup 5.5–33 minus its l2 load 15.5–29.5) runs alone.
	if g := groups["cb-blend/lookup"]; g.SelfNs != ms(13.5) || !approx(g.AttributedNs, float64(ms(13.5)), 1) {
		t.Fatalf("cb-blend/lookup = %+v", g)
	}
	if g := groups["cb-blend/l2 load"]; g.SelfNs != ms(14) {
		t.Fatalf("cb-blend/l2 load = %+v", g)
	}
	// engine.prefill (41–124) runs beside cb.request (2–122): the overlap is shared.
	if g := groups["cb-engine/prefill"]; g.SelfNs != ms(83) || g.AttributedNs >= float64(ms(83)) {
		t.Fatalf("cb-engine/prefill = %+v", g)
	}
}

func TestBreakdownRandomTrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 300 {
		n := 1 + rng.IntN(40)
		rows := []sp{{name: "s0", start: 0, end: float64(1 + rng.IntN(1000))}}
		for i := 1; i < n; i++ {
			parent := fmt.Sprint("s", rng.IntN(i))
			if rng.IntN(20) == 0 {
				parent = "missing"
			}
			st := float64(rng.IntN(1200)) - 100
			rows = append(rows, sp{name: fmt.Sprint("s", i), parent: parent, start: st, end: st + float64(rng.IntN(300)),
				service: []string{tracetest.Engine, tracetest.Worker, tracetest.Blend}[rng.IntN(3)]})
		}
		bd := computeBreakdown(spansOf(t, build(fmt.Sprint("rand", iter), rows...)))
		if len(bd.Spans) != n {
			t.Fatalf("iteration %d: %d spans in the breakdown, want %d", iter, len(bd.Spans), n)
		}
		checkInvariants(t, bd)
	}
}

func BenchmarkBreakdown(b *testing.B) {
	td := tracetest.Request{RequestID: "bench"}.Traces()
	spans, _ := convertTraces(td)
	b.ReportAllocs()
	for b.Loop() {
		computeBreakdown(spans)
	}
}

// TestPhaseFromContract pins the groups of the trace page: each span's phase comes from the
// span contract, and the mapping is the one the page has always shown.
func TestPhaseFromContract(t *testing.T) {
	want := map[string]string{
		spanname.EngineQueue: "queue", spanname.EnginePrefill: "prefill", spanname.EngineDecode: "decode",
		spanname.CBRequest: "schedule", spanname.CBSchedule: "schedule", spanname.CBBuildMeta: "schedule",
		spanname.CBLookupRPC: "lookup", spanname.CBLookup: "lookup", spanname.MPLookupPrefetch: "lookup",
		spanname.CBFingerprintMatch: "lookup", spanname.CBCoordinatorMatch: "lookup",
		spanname.CBSparsePrefetch: "lookup", spanname.CBClassify: "lookup",
		spanname.CBL2Load:      "l2 load",
		spanname.CBExecute:     "execute",
		spanname.CBStartLoadKV: "kv load", spanname.CBRetrieve: "kv load", spanname.CBScatter: "kv load",
		spanname.CBModelForward: "forward", spanname.CBFullRecomp: "forward", spanname.CBCheck: "forward",
		spanname.CBPartial: "forward",
		spanname.CBStore:   "store", spanname.CBStorePreComputed: "store",
		spanname.KVTransfer: "kv load", spanname.KVReceive: "kv load", spanname.KVSend: "kv load",
		spanname.GatewayRequest: "request", spanname.GatewayAttempt: "route",
		spanname.CBQuality: "request",
	}
	set, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range set.Spans {
		if sp.NamePattern != "" {
			continue
		}
		if _, ok := want[sp.Name]; !ok {
			t.Errorf("contract span %s: no expected phase in this test", sp.Name)
		}
		if got := Phase(sp.Name, false); got != string(sp.Phase) {
			t.Errorf("Phase(%s) = %q, contract says %q", sp.Name, got, sp.Phase)
		}
	}
	for name, phase := range want {
		if got := Phase(name, false); got != phase {
			t.Errorf("Phase(%s) = %q, want %q", name, got, phase)
		}
		if got := Phase(name, true); got != "request" {
			t.Errorf("Phase(%s, root) = %q, want request", name, got)
		}
	}
	for _, name := range []string{spanname.Server("chat", "m1"), "my.span"} {
		if got := Phase(name, false); got != name {
			t.Errorf("Phase(%q) = %q, want its name", name, got)
		}
	}
	if got := Phase(spanname.Server("chat", "m1"), true); got != "request" {
		t.Errorf("root phase %q", got)
	}
}

// TestBreakdownLanesPerInstance: two processes of one service (the prefill and
// the decode engine of a disaggregated request, or the engines of two nodes)
// are two lanes, and their time is grouped apart.
func TestBreakdownLanesPerInstance(t *testing.T) {
	r := tracetest.Request{RequestID: "pd", Start: t0, Instances: map[string]string{"decode": "127.0.0.1:8002"}}
	defs := []tracetest.SpanDef{
		{Name: "root", Service: tracetest.Engine, StartMs: 0, EndMs: 100},
		{Name: "prefill", Service: tracetest.Engine, Parent: "root", StartMs: 0, EndMs: 40},
		{Name: "decode", Service: tracetest.Engine, Parent: "root", StartMs: 40, EndMs: 100},
		{Name: "store", Service: tracetest.Blend, Parent: "prefill", StartMs: 10, EndMs: 20},
	}
	for i := range defs {
		if defs[i].Name != "decode" {
			r.Instances[defs[i].Name] = map[string]string{tracetest.Engine: "127.0.0.1:8001", tracetest.Blend: ""}[defs[i].Service]
		}
	}
	bd := computeBreakdown(spansOf(t, tracetest.Build(r, defs)))
	var lanes []string
	for _, l := range bd.Lanes {
		lanes = append(lanes, fmt.Sprintf("%s/%s/%d", l.Name, l.Service, l.Spans))
	}
	// The blend span has no instance of its own in r.Instances: tracetest's default.
	want := []string{"cb-engine@127.0.0.1:8001/cb-engine/2", "cb-blend@cb-blend-0/cb-blend/1", "cb-engine@127.0.0.1:8002/cb-engine/1"}
	if fmt.Sprint(lanes) != fmt.Sprint(want) {
		t.Fatalf("lanes = %v, want %v", lanes, want)
	}
	perLane := map[string]float64{}
	for _, g := range bd.Groups {
		perLane[g.Lane] += g.AttributedNs
	}
	if !approx(perLane["cb-engine@127.0.0.1:8002"], float64(ms(60)), 1) || !approx(perLane["cb-engine@127.0.0.1:8001"], float64(ms(30)), 1) {
		t.Fatalf("attributed time per lane = %v, want 60 ms on the decode engine, 30 ms on the prefill engine", perLane)
	}
	for _, s := range bd.Spans {
		if s.Name == "decode" && (s.Instance != "127.0.0.1:8002" || s.Lane != "cb-engine@127.0.0.1:8002") {
			t.Fatalf("decode span: instance %q lane %q", s.Instance, s.Lane)
		}
	}
	if LaneName("svc", "") != "svc" {
		t.Fatal(`LaneName without an instance is the service`)
	}
}
