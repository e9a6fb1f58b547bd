package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func decodeLines(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestLogHandlerCarriesSpanIDs(t *testing.T) {
	s := NewSpans(newSDKProvider(t, tracetest.NewSpanRecorder()), "engine", nil)
	ctx, sp := s.Start(context.Background(), "chat tiny")
	defer sp.End()
	tid, sid := sp.SpanContext().TraceID().String(), sp.SpanContext().SpanID().String()

	var buf bytes.Buffer
	base := slog.New(NewLogHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))

	tests := []struct {
		name  string
		log   func()
		check func(t *testing.T, m map[string]any)
	}{
		{"plain", func() { base.InfoContext(ctx, "request done", "request_id", "req-1", "status", 200) }, func(t *testing.T, m map[string]any) {
			if m["trace_id"] != tid || m["span_id"] != sid || m["request_id"] != "req-1" || m["msg"] != "request done" {
				t.Fatalf("%v", m)
			}
		}},
		{"no span", func() { base.InfoContext(context.Background(), "startup") }, func(t *testing.T, m map[string]any) {
			if _, ok := m["trace_id"]; ok {
				t.Fatalf("ids without a span: %v", m)
			}
			if _, ok := m["span_id"]; ok {
				t.Fatalf("ids without a span: %v", m)
			}
		}},
		{"with attrs", func() { base.With("service", "cb-engine").InfoContext(ctx, "x") }, func(t *testing.T, m map[string]any) {
			if m["service"] != "cb-engine" || m["trace_id"] != tid {
				t.Fatalf("%v", m)
			}
		}},
		{"ids stay top-level under groups", func() {
			base.With("service", "cb-engine").WithGroup("req").With("a", 1).WithGroup("tok").InfoContext(ctx, "x", "n", 3)
		}, func(t *testing.T, m map[string]any) {
			if m["trace_id"] != tid || m["span_id"] != sid || m["service"] != "cb-engine" {
				t.Fatalf("%v", m)
			}
			req, _ := m["req"].(map[string]any)
			tok, _ := req["tok"].(map[string]any)
			if req["a"] != 1.0 || tok["n"] != 3.0 {
				t.Fatalf("groups %v", m)
			}
		}},
		{"remote parent only", func() { base.InfoContext(ExtractString(context.Background(), w3cExample), "x") }, func(t *testing.T, m map[string]any) {
			if m["trace_id"] != exTrace || m["span_id"] != exSpan {
				t.Fatalf("%v", m)
			}
		}},
		{"level filter kept", func() {
			slog.New(NewLogHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})).InfoContext(ctx, "dropped")
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			buf.Reset()
			tc.log()
			lines := decodeLines(t, buf.Bytes())
			if tc.check == nil {
				if len(lines) != 0 {
					t.Fatalf("logged %v", lines)
				}
				return
			}
			if len(lines) != 1 {
				t.Fatalf("%d lines", len(lines))
			}
			tc.check(t, lines[0])
		})
	}
}

// With tracing off and profiling on, logs carry the generated ids, the same
// as the profile lines.
func TestLogHandlerProfileOnlyIDs(t *testing.T) {
	var prof, logs bytes.Buffer
	ctx, sp := NewSpans(nil, "engine", &prof).Start(context.Background(), "chat tiny")
	slog.New(NewLogHandler(&logs, nil)).InfoContext(ctx, "x")
	sp.End()
	l := decodeLines(t, logs.Bytes())[0]
	pl := decodeLines(t, prof.Bytes())[0]
	if l["trace_id"] != pl["trace_id"] || l["span_id"] != pl["span_id"] || l["trace_id"] == nil {
		t.Fatalf("log %v, profile %v", l, pl)
	}
}
