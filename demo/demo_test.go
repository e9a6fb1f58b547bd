package demo

import (
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
