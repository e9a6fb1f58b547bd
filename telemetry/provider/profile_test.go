package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/telemetry"
)

const (
	w3cExample = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	exTrace    = "4bf92f3577b34da6a3ce929d0e0e4736"
	exSpan     = "00f067aa0ba902b7"
)

func exampleContext(t *testing.T) (context.Context, trace.SpanContext) {
	t.Helper()
	sc, err := telemetry.ParseTraceparent(w3cExample)
	if err != nil {
		t.Fatal(err)
	}
	return trace.ContextWithRemoteSpanContext(context.Background(), sc), sc
}

// profLine is one line of the CB_PROFILE JSONL span profile.
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
		out[l.Name] = l
	}
	return out
}

// The Provider's span helpers write the profile given by WithProfileWriter
// with the ids of the spans its SDK provider records.
func TestProfileWriterOption(t *testing.T) {
	var buf bytes.Buffer
	rec := tracetest.NewSpanRecorder()
	p := newProvider(t, Config{Enabled: true}, WithSpanProcessor(rec), WithProfileWriter(&buf))
	if p.ProfileWriter() == nil || !p.Spans("engine").Profiling() {
		t.Fatal("profiling off")
	}
	ctx, _ := exampleContext(t)
	_, sp := p.Spans("engine").Start(ctx, "server")
	sp.End()
	if err := p.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	l, ok := parseProfile(t, buf.Bytes())["server"]
	ended := rec.Ended()
	if !ok || len(ended) != 1 {
		t.Fatalf("profile %q, %d spans recorded", buf.Bytes(), len(ended))
	}
	if sc := ended[0].SpanContext(); l.TraceID != exTrace || l.TraceID != sc.TraceID().String() || l.SpanID != sc.SpanID().String() || l.Parent != exSpan {
		t.Fatalf("profile line %+v, span %s/%s", l, sc.TraceID(), sc.SpanID())
	}
}

func TestProfileDefaultFile(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	p, err := New(context.Background(), Config{ServiceName: "cb-engine", Profile: true})
	if err != nil {
		t.Fatal(err)
	}
	_, sp := p.Spans("engine").Start(context.Background(), "engine.queue")
	sp.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("cb-profile-cb-engine-%d.jsonl", os.Getpid())
	if p.Config().ProfilePath != want {
		t.Fatalf("profile path %q, want %q", p.Config().ProfilePath, want)
	}
	b, err := os.ReadFile(filepath.Join(dir, want))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := parseProfile(t, b)["engine.queue"]; !ok {
		t.Fatalf("file holds %q", b)
	}
}

func TestProfileBadPath(t *testing.T) {
	_, err := New(context.Background(), Config{Profile: true, ProfilePath: filepath.Join(t.TempDir(), "missing", "p.jsonl")})
	if err == nil {
		t.Fatal("opened a profile in a missing directory")
	}
}

func BenchmarkSpans(b *testing.B) {
	run := func(b *testing.B, s *telemetry.Spans) {
		ctx := telemetry.ExtractString(context.Background(), w3cExample)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			_, sp := s.Start(ctx, "engine.queue")
			sp.End()
		}
	}
	b.Run("tracing_off", func(b *testing.B) {
		p, _ := New(context.Background(), Config{})
		defer p.Shutdown(context.Background())
		run(b, p.Spans("bench"))
	})
	b.Run("tracing_on", func(b *testing.B) {
		p, _ := New(context.Background(), Config{Enabled: true}, WithSpanExporter(tracetest.NewNoopExporter()))
		defer p.Shutdown(context.Background())
		run(b, p.Spans("bench"))
	})
	b.Run("tracing_on_sampled_out", func(b *testing.B) {
		p, _ := New(context.Background(), Config{Enabled: true, Sampler: SamplerAlwaysOff}, WithSpanExporter(tracetest.NewNoopExporter()))
		defer p.Shutdown(context.Background())
		run(b, p.Spans("bench"))
	})
	b.Run("profile_only", func(b *testing.B) {
		p, _ := New(context.Background(), Config{}, WithProfileWriter(telemetry.NewProfileSink(discard{})))
		defer p.Shutdown(context.Background())
		run(b, p.Spans("bench"))
	})
	b.Run("tracing_on_and_profile", func(b *testing.B) {
		p, _ := New(context.Background(), Config{Enabled: true}, WithSpanExporter(tracetest.NewNoopExporter()), WithProfileWriter(telemetry.NewProfileSink(discard{})))
		defer p.Shutdown(context.Background())
		run(b, p.Spans("bench"))
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
