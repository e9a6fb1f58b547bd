package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

type profLine struct {
	Name       string         `json:"name"`
	Scope      string         `json:"scope"`
	TraceID    string         `json:"trace_id"`
	SpanID     string         `json:"span_id"`
	Parent     string         `json:"parent_span_id"`
	Start      string         `json:"start"`
	DurationMS float64        `json:"duration_ms"`
	Attributes map[string]any `json:"attributes"`
}

// newSDKProvider returns an SDK tracer provider (parent-based, always on)
// that hands every span to sp, shut down at the end of the test. The tests of
// this package use the SDK directly; the Provider of telemetry/provider is
// tested in its own package.
func newSDKProvider(t testing.TB, sp sdktrace.SpanProcessor) *sdktrace.TracerProvider {
	t.Helper()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

func parseProfile(t *testing.T, b []byte) map[string]profLine {
	t.Helper()
	out := map[string]profLine{}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	for dec.More() {
		var l profLine
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("profile %q: %v", b, err)
		}
		if _, err := time.Parse(time.RFC3339Nano, l.Start); err != nil {
			t.Fatalf("start %q: %v", l.Start, err)
		}
		if l.DurationMS < 0 || len(l.TraceID) != 32 || len(l.SpanID) != 16 {
			t.Fatalf("line %+v", l)
		}
		out[l.Name] = l
	}
	return out
}

func TestProfileLinesTracingOff(t *testing.T) {
	var buf bytes.Buffer
	s := NewSpans(nil, "cacheblend/worker", &buf) // tracing off
	ctx, exec := s.Start(context.Background(), "cb.execute", trace.WithAttributes(attribute.String("request_id", "req-1")))
	fctx, fwd := s.Start(ctx, "cb.model_forward")
	_, check := s.Start(fctx, "cb.check")
	check.SetAttributes(attribute.Int("imp_count", 12), attribute.Float64("recomp_ratio", 0.15), attribute.Bool("imp_empty", false),
		attribute.StringSlice("dispatch", []string{"flex"}), attribute.Float64("nan", math.NaN()))
	check.End()
	downstream := InjectString(fctx) // the generated ids propagate too
	fwd.End()
	_, load := s.Start(ctx, "cb.start_load_kv")
	load.SetError("retrieve_failed", errors.New("blend unreachable"))
	load.End()
	exec.End()
	exec.End() // a second End writes nothing
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}

	lines := parseProfile(t, buf.Bytes())
	if len(lines) != 4 {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	e, f, c, l := lines["cb.execute"], lines["cb.model_forward"], lines["cb.check"], lines["cb.start_load_kv"]
	if e.Parent != "" {
		t.Errorf("root has parent %q", e.Parent)
	}
	if f.Parent != e.SpanID || c.Parent != f.SpanID || l.Parent != e.SpanID {
		t.Errorf("parents: forward %s (want %s), check %s (want %s), load %s", f.Parent, e.SpanID, c.Parent, f.SpanID, l.Parent)
	}
	for _, x := range []profLine{f, c, l} {
		if x.TraceID != e.TraceID {
			t.Errorf("%s: trace %s, want %s", x.Name, x.TraceID, e.TraceID)
		}
		if x.Scope != "cacheblend/worker" {
			t.Errorf("scope %q", x.Scope)
		}
	}
	if e.Attributes["request_id"] != "req-1" {
		t.Errorf("start attributes %v", e.Attributes)
	}
	want := map[string]any{"imp_count": 12.0, "recomp_ratio": 0.15, "imp_empty": false, "dispatch": []any{"flex"}, "nan": "NaN"}
	for k, v := range want {
		if fmt.Sprint(c.Attributes[k]) != fmt.Sprint(v) {
			t.Errorf("attribute %s = %v, want %v", k, c.Attributes[k], v)
		}
	}
	if l.Attributes["error.type"] != "retrieve_failed" {
		t.Errorf("error.type %v", l.Attributes)
	}
	if downstream != "00-"+f.TraceID+"-"+f.SpanID+"-00" {
		t.Errorf("propagated %q", downstream)
	}
	if e.DurationMS < f.DurationMS {
		t.Errorf("root %v ms shorter than child %v ms", e.DurationMS, f.DurationMS)
	}
}

func TestProfileLinesMatchOTelSpans(t *testing.T) {
	var buf bytes.Buffer
	rec := tracetest.NewSpanRecorder()
	ctx := ExtractString(context.Background(), w3cExample)
	s := NewSpans(newSDKProvider(t, rec), "engine", &buf)
	ctx, root := s.Start(ctx, "server", trace.WithSpanKind(trace.SpanKindServer))
	_, child := s.Start(ctx, "child")
	child.End()
	root.End()
	_, newRoot := s.Start(ctx, "detached", trace.WithNewRoot())
	newRoot.End()

	lines := parseProfile(t, buf.Bytes())
	for _, sp := range rec.Ended() {
		l, ok := lines[sp.Name()]
		if !ok {
			t.Fatalf("no profile line for %s", sp.Name())
		}
		if l.TraceID != sp.SpanContext().TraceID().String() || l.SpanID != sp.SpanContext().SpanID().String() {
			t.Errorf("%s: profile ids %s/%s, OTel %s/%s", sp.Name(), l.TraceID, l.SpanID, sp.SpanContext().TraceID(), sp.SpanContext().SpanID())
		}
		wantParent := ""
		if sp.Parent().IsValid() {
			wantParent = sp.Parent().SpanID().String()
		}
		if l.Parent != wantParent {
			t.Errorf("%s: profile parent %q, OTel %q", sp.Name(), l.Parent, wantParent)
		}
		if got, want := l.Start, sp.StartTime().UTC().Format(time.RFC3339Nano); got != want {
			t.Errorf("%s: start %s, OTel %s", sp.Name(), got, want)
		}
		if got, want := l.DurationMS, float64(sp.EndTime().Sub(sp.StartTime()))/1e6; got != want {
			t.Errorf("%s: duration %v ms, OTel %v ms", sp.Name(), got, want)
		}
	}
	if lines["server"].Parent != exSpan || lines["server"].TraceID != exTrace {
		t.Errorf("server line %+v", lines["server"])
	}
}

func TestProfileForcedTraceIDWithoutTracing(t *testing.T) {
	var buf bytes.Buffer
	s := NewSpans(nil, "blend", &buf)
	want := TraceIDFromRequestID("req-9")
	_, sp := s.Start(ContextWithTraceID(context.Background(), want), "cb.request")
	sp.End()
	if got := parseProfile(t, buf.Bytes())["cb.request"].TraceID; got != want.String() {
		t.Fatalf("trace id %s, want %s", got, want)
	}
}

func TestProfileConcurrentLinesDoNotInterleave(t *testing.T) {
	var buf bytes.Buffer
	sink := NewProfileSink(&buf)
	a, b := NewSpans(nil, "a", sink), NewSpans(nil, "b", sink) // two helpers, one file
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			s := a
			if g%2 == 1 {
				s = b
			}
			for i := range 200 {
				ctx, sp := s.Start(context.Background(), fmt.Sprintf("g%d-%d", g, i))
				sp.SetAttributes(attribute.String("text", "quote \" backslash \\ newline \n tab \t ctl \x01 bad \xff utf8 é"))
				_, c := s.Start(ctx, "child")
				c.End()
				sp.End()
			}
		})
	}
	wg.Wait()
	if err := sink.Flush(); err != nil {
		t.Fatal(err)
	}
	n := 0
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var l profLine
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		if l.Name != "child" && l.Attributes["text"] != "quote \" backslash \\ newline \n tab \t ctl \x01 bad \ufffd utf8 é" {
			t.Fatalf("escaped text decoded as %q", l.Attributes["text"])
		}
		n++
	}
	if n != 8*200*2 {
		t.Fatalf("%d lines", n)
	}
}

func TestNilAndUnprofiledSpans(t *testing.T) {
	var sp *Span
	sp.SetAttributes(attribute.Int("a", 1))
	sp.AddEvent("e")
	sp.SetError("x", errors.New("y"))
	sp.End()
	if sp.SpanContext().IsValid() || sp.IsRecording() {
		t.Fatal("nil span has a context")
	}
	s := NewSpans(nil, "x", nil)
	if s.Profiling() || s.Flush() != nil {
		t.Fatal("profiling without a writer")
	}
	ctx, sp2 := s.Start(context.Background(), "y")
	sp2.End()
	if trace.SpanContextFromContext(ctx).IsValid() {
		t.Fatal("no-op tracer made ids without profiling")
	}
}

func BenchmarkParseTraceparent(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseTraceparent(w3cExample); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFormatTraceparent(b *testing.B) {
	sc, _ := ParseTraceparent(w3cExample)
	b.ReportAllocs()
	for b.Loop() {
		_ = FormatTraceparent(sc)
	}
}

func TestAsProfileSink(t *testing.T) {
	sink := NewProfileSink(&bytes.Buffer{})
	if AsProfileSink(sink) != sink {
		t.Fatal("a sink was wrapped")
	}
	var buf bytes.Buffer
	s := AsProfileSink(&buf)
	if _, err := s.Write([]byte("line\n")); err != nil || buf.String() != "line\n" {
		t.Fatalf("unbuffered sink wrote %q, %v", buf.String(), err)
	}
}
