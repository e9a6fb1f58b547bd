package telemetry

import (
	"context"
	"io"
	"log/slog"
	"slices"

	"go.opentelemetry.io/otel/trace"
)

// Log attribute keys added by the handler of [NewLogHandler].
const (
	LogTraceIDKey = "trace_id"
	LogSpanIDKey  = "span_id"
)

// NewLogHandler returns a JSON slog handler (slog.NewJSONHandler(w, opts))
// that adds trace_id and span_id, as lowercase hex, to every record whose
// context holds a valid span context (the active span). The ids are
// top-level keys even under WithGroup. It is safe for concurrent use, as is
// the JSON handler.
func NewLogHandler(w io.Writer, opts *slog.HandlerOptions) slog.Handler {
	return &logHandler{inner: slog.NewJSONHandler(w, opts)}
}

type logHandler struct {
	inner  slog.Handler // with every WithAttrs made before the first group
	groups []logGroup   // groups opened by WithGroup, outermost first
}

type logGroup struct {
	name  string
	attrs []slog.Attr // attributes added inside this group
}

func (h *logHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *logHandler) Handle(ctx context.Context, r slog.Record) error {
	sc := trace.SpanContextFromContext(ctx)
	if len(h.groups) == 0 {
		if sc.IsValid() {
			r.AddAttrs(
				slog.String(LogTraceIDKey, sc.TraceID().String()),
				slog.String(LogSpanIDKey, sc.SpanID().String()),
			)
		}
		return h.inner.Handle(ctx, r)
	}
	// Rebuild the record: ids at the top level, then the groups with the
	// record's attributes in the innermost one.
	inner := make([]slog.Attr, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool { inner = append(inner, a); return true })
	for i := len(h.groups) - 1; i >= 0; i-- {
		g := h.groups[i]
		attrs := append(slices.Clip(g.attrs), inner...)
		inner = []slog.Attr{{Key: g.name, Value: slog.GroupValue(attrs...)}}
	}
	nr := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	if sc.IsValid() {
		nr.AddAttrs(
			slog.String(LogTraceIDKey, sc.TraceID().String()),
			slog.String(LogSpanIDKey, sc.SpanID().String()),
		)
	}
	nr.AddAttrs(inner...)
	return h.inner.Handle(ctx, nr)
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	if len(h.groups) == 0 {
		return &logHandler{inner: h.inner.WithAttrs(attrs)}
	}
	groups := slices.Clone(h.groups)
	last := &groups[len(groups)-1]
	last.attrs = append(slices.Clip(last.attrs), attrs...)
	return &logHandler{inner: h.inner, groups: groups}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	groups := append(slices.Clip(h.groups), logGroup{name: name})
	return &logHandler{inner: h.inner, groups: groups}
}
