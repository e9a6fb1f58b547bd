package demo

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/tracecheck"
)

func TestDocumentsShipped(t *testing.T) {
	docs := Documents()
	if len(docs) < 6 {
		t.Fatalf("%d documents", len(docs))
	}
	for _, d := range docs {
		if d.ID == "" || len(d.Text) < 400 {
			t.Errorf("document %q too short (%d bytes)", d.ID, len(d.Text))
		}
	}
}

func TestPromptHoldsDocumentsVerbatim(t *testing.T) {
	docs := Documents()[:3]
	p := Prompt(docs, "Question: why?")
	last := -1
	for _, d := range docs {
		i := strings.Index(p, d.Text)
		if i < 0 || i <= last {
			t.Fatalf("document %s missing or out of order", d.ID)
		}
		last = i
	}
	if !strings.HasSuffix(p, "Question: why?") {
		t.Fatal("question not last")
	}
}

func TestWaterfallTreeAndBars(t *testing.T) {
	t0 := time.Unix(0, 0)
	tr := &tracecheck.Trace{TraceID: "t", Spans: []tracecheck.Span{
		{SpanID: "a", Name: "root", Service: "cb-engine", Start: t0, End: t0.Add(100 * time.Millisecond)},
		{SpanID: "c", ParentSpanID: "a", Name: "late", Service: "cb-worker", Start: t0.Add(50 * time.Millisecond), End: t0.Add(100 * time.Millisecond)},
		{SpanID: "b", ParentSpanID: "a", Name: "early", Service: "cb-blend", Start: t0, End: t0.Add(50 * time.Millisecond)},
	}}
	var sb strings.Builder
	Waterfall(&sb, tr, 10)
	lines := strings.Split(strings.TrimSpace(sb.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "root") || !strings.Contains(lines[1], "  early") || !strings.Contains(lines[2], "  late") {
		t.Fatalf("tree order:\n%s", sb.String())
	}
	if !strings.Contains(lines[0], "|██████████|") || !strings.Contains(lines[1], "|█████     |") || !strings.Contains(lines[2], "|     █████|") {
		t.Fatalf("bars:\n%s", sb.String())
	}
}

// TestNodeSummaryAndRouting: behind the gateway (cb demo --nodes N) the report
// names the node of every request and each node's token-weighted hit rate, in
// the table and in --json.
func TestNodeSummaryAndRouting(t *testing.T) {
	i64 := func(n int64) *int64 { return &n }
	rep := &Report{Requests: []Result{
		{RequestID: "r1", Engine: "127.0.0.1:8001", FullEngine: "127.0.0.1:8002", TraceStats: TraceStats{HitTokens: i64(0), RequestedTokens: i64(100)}},
		{RequestID: "r2", Engine: "127.0.0.1:8001", FullEngine: "127.0.0.1:8001", TraceStats: TraceStats{HitTokens: i64(90), RequestedTokens: i64(100)}},
		{RequestID: "r3", Engine: "127.0.0.1:8002", FullEngine: "127.0.0.1:8002"},
	}}
	rep.Summarize()
	if len(rep.Nodes) != 2 {
		t.Fatalf("nodes = %+v", rep.Nodes)
	}
	a, b := rep.Nodes[0], rep.Nodes[1]
	if a.Engine != "127.0.0.1:8001" || a.Requests != 2 || a.FullRequests != 1 || a.HitRate == nil || *a.HitRate != 0.45 {
		t.Fatalf("node 1 = %+v", a)
	}
	if b.Engine != "127.0.0.1:8002" || b.Requests != 1 || b.FullRequests != 2 || b.HitRate != nil {
		t.Fatalf("node 2 = %+v", b)
	}
	var sb strings.Builder
	rep.Print(&sb)
	out := sb.String()
	for _, want := range []string{"node", "Routing", "127.0.0.1:8001", "45.0%", "90/200"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	path := t.TempDir() + "/demo.json"
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	b2, _ := os.ReadFile(path)
	for _, want := range []string{`"engine": "127.0.0.1:8001"`, `"nodes": [`, `"hit_rate": 0.45`} {
		if !strings.Contains(string(b2), want) {
			t.Errorf("JSON lacks %s:\n%s", want, b2)
		}
	}

	// Without a gateway: no node column, no routing table.
	one := &Report{Requests: []Result{{RequestID: "r1"}}}
	one.Summarize()
	sb.Reset()
	one.Print(&sb)
	if one.Nodes != nil || strings.Contains(sb.String(), "Routing") {
		t.Fatalf("single engine report shows routing:\n%s", sb.String())
	}
}

func TestShapeCeilingAndMedian(t *testing.T) {
	ceilings := []struct {
		name  string
		shape Shape
		want  float64
	}{
		{name: "default model: 12 layers, cl 1, ratio 0.15", shape: Shape{Layers: 12, CheckLayer: 1, RecompRatio: 0.15}, want: 12 / 3.5},
		{name: "16 layers, ratio 0.15", shape: Shape{Layers: 16, CheckLayer: 1, RecompRatio: 0.15}, want: 16 / 4.1},
		{name: "ratio 1: no speedup", shape: Shape{Layers: 12, CheckLayer: 1, RecompRatio: 1}, want: 1},
		{name: "unknown shape", shape: Shape{}, want: 0},
		{name: "check layer past the model", shape: Shape{Layers: 2, CheckLayer: 2, RecompRatio: 0.15}, want: 0},
	}
	for _, tc := range ceilings {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.shape.Ceiling(); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("Ceiling = %v, want %v", got, tc.want)
			}
		})
	}
	medians := []struct {
		name string
		xs   []float64
		want float64
	}{
		{name: "none", want: 0},
		{name: "odd", xs: []float64{3, 1, 2}, want: 2},
		{name: "even", xs: []float64{4, 1, 3, 2}, want: 2.5},
	}
	for _, tc := range medians {
		t.Run(tc.name, func(t *testing.T) {
			if got := Median(tc.xs); got != tc.want {
				t.Fatalf("Median(%v) = %v, want %v", tc.xs, got, tc.want)
			}
		})
	}
}

func TestPrefillForward(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	span := func(name string, from, to int) tracecheck.Span {
		return tracecheck.Span{Name: name, Start: at(from), End: at(to)}
	}
	tests := []struct {
		name   string
		spans  []tracecheck.Span
		want   time.Duration
		wantOK bool
	}{
		{name: "no engine.prefill", spans: []tracecheck.Span{span("cb.model_forward", 0, 10)}},
		{name: "prefill forwards summed, decode forwards left out", spans: []tracecheck.Span{
			span("engine.prefill", 0, 100), span("cb.model_forward", 5, 45), span("cb.model_forward", 50, 95),
			span("cb.model_forward", 101, 110)}, want: 85 * time.Millisecond, wantOK: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := prefillForward(&tracecheck.Trace{Spans: tc.spans})
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("prefillForward = %v, %v; want %v, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
