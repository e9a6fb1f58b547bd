package events

import (
	"context"
	"math/rand/v2"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/telemetry"
)

type traceIDKey struct{}

// ContextWithTraceID returns a copy of ctx asking the id generator to give
// the next root span started with it the trace id id instead of a random one.
// Both an [IDGenerator] and the id generator of a telemetry.Provider honour
// it (it also applies telemetry.ContextWithTraceID). An invalid (zero) id is
// ignored and ctx is returned unchanged.
func ContextWithTraceID(ctx context.Context, id trace.TraceID) context.Context {
	if !id.IsValid() {
		return ctx
	}
	return context.WithValue(telemetry.ContextWithTraceID(ctx, id), traceIDKey{}, id)
}

// TraceIDFromContext returns the trace id set by [ContextWithTraceID], if any.
func TraceIDFromContext(ctx context.Context) (trace.TraceID, bool) {
	id, ok := ctx.Value(traceIDKey{}).(trace.TraceID)
	return id, ok
}

// IDGenerator is an sdktrace.IDGenerator that gives a root span the trace id
// placed in its start context by [ContextWithTraceID] and random ids
// otherwise. A TracerProvider built directly with the SDK must use it
// (sdktrace.WithIDGenerator(events.NewIDGenerator())) for the option-B
// cb.request roots to carry the trace id derived from the request id; a
// telemetry.Provider needs nothing more, its own generator honours
// [ContextWithTraceID]. It is safe for concurrent use.
type IDGenerator struct{}

var _ sdktrace.IDGenerator = IDGenerator{}

// NewIDGenerator returns an [IDGenerator].
func NewIDGenerator() IDGenerator { return IDGenerator{} }

// NewIDs implements sdktrace.IDGenerator.
func (g IDGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if id, ok := TraceIDFromContext(ctx); ok {
		return id, g.NewSpanID(ctx, id)
	}
	var tid trace.TraceID
	for !tid.IsValid() {
		putUint64(tid[:8], rand.Uint64())
		putUint64(tid[8:], rand.Uint64())
	}
	return tid, g.NewSpanID(ctx, tid)
}

// NewSpanID implements sdktrace.IDGenerator.
func (IDGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		putUint64(sid[:], rand.Uint64())
	}
	return sid
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
}
