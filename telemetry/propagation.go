package telemetry

import (
	"context"
	"crypto/sha256"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Header (and gRPC metadata) keys of W3C Trace Context.
const (
	TraceparentKey = "traceparent"
	TracestateKey  = "tracestate"
)

// Propagator returns the W3C Trace Context propagator of this package. It
// differs from the SDK's propagation.TraceContext on extraction only:
//   - traceparent is parsed by [ParseTraceparent], which rejects a version 00
//     value followed by a lone '-' (the SDK accepts it) and masks reserved
//     flag bits of version 00 instead of rejecting the value (as the SDK
//     does);
//   - a carrier that holds more than one traceparent value (it implements
//     propagation.ValuesGetter, as propagation.HeaderCarrier and
//     [MetadataCarrier] do) is invalid: nothing is extracted and the receiver
//     starts a new trace;
//   - tracestate is kept only when traceparent is valid, and an invalid
//     tracestate is dropped without affecting traceparent (as the
//     specification requires); several tracestate values are joined with ','.
//
// Inject writes traceparent (version 00) and, when non-empty, tracestate.
// Extract returns ctx unchanged when there is no valid traceparent. The
// propagator is stateless and safe for concurrent use.
func Propagator() propagation.TextMapPropagator { return w3c{} }

type w3c struct{}

var _ propagation.TextMapPropagator = w3c{}

// Inject implements propagation.TextMapPropagator.
func (w3c) Inject(ctx context.Context, carrier propagation.TextMapCarrier) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return
	}
	carrier.Set(TraceparentKey, FormatTraceparent(sc))
	if ts := sc.TraceState().String(); ts != "" {
		carrier.Set(TracestateKey, ts)
	}
}

// Extract implements propagation.TextMapPropagator.
func (w3c) Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	sc, ok := extractSpanContext(carrier)
	if !ok {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// Fields implements propagation.TextMapPropagator.
func (w3c) Fields() []string { return []string{TraceparentKey, TracestateKey} }

func extractSpanContext(carrier propagation.TextMapCarrier) (trace.SpanContext, bool) {
	var tp, ts string
	if vg, ok := carrier.(propagation.ValuesGetter); ok {
		vals := vg.Values(TraceparentKey)
		if len(vals) != 1 { // absent, or duplicated: start a new trace
			return trace.SpanContext{}, false
		}
		tp = vals[0]
		if states := vg.Values(TracestateKey); len(states) > 0 {
			ts = strings.Join(states, ",")
		}
	} else {
		tp, ts = carrier.Get(TraceparentKey), carrier.Get(TracestateKey)
	}
	return SpanContextFromStrings(tp, ts)
}

// InjectHTTP writes the span context of ctx into h (traceparent and
// tracestate). Nothing is written when ctx holds no valid span context. It
// is safe for concurrent use with distinct headers.
func InjectHTTP(ctx context.Context, h http.Header) {
	w3c{}.Inject(ctx, propagation.HeaderCarrier(h))
}

// ExtractHTTP returns ctx with the remote span context carried by h, or ctx
// unchanged when h carries none that is valid (missing, malformed or
// duplicated traceparent). It is safe for concurrent use.
func ExtractHTTP(ctx context.Context, h http.Header) context.Context {
	return w3c{}.Extract(ctx, propagation.HeaderCarrier(h))
}

// InjectString returns the W3C traceparent of the span context in ctx, for
// the trace_context field of the CacheBlend RPC payloads, or "" when ctx
// holds no valid span context. It carries no tracestate: payloads that have a
// trace_state field use [InjectStrings]. It is safe for concurrent use.
func InjectString(ctx context.Context) string {
	return FormatTraceparent(trace.SpanContextFromContext(ctx))
}

// InjectStrings returns the W3C traceparent and tracestate of the span
// context in ctx, for the trace_context and trace_state fields of the
// CacheBlend RPC payloads: both "" when ctx holds no valid span context,
// tracestate "" when the context has none. Together they carry the caller's
// vendor entries to the far side. It is safe for concurrent use.
func InjectStrings(ctx context.Context) (traceparent, tracestate string) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return "", ""
	}
	return FormatTraceparent(sc), sc.TraceState().String()
}

// ExtractString returns ctx with the remote span context named by the
// traceparent s, or ctx unchanged when s is empty or invalid (the receiver
// then starts a new trace). It is safe for concurrent use.
func ExtractString(ctx context.Context, s string) context.Context {
	return ExtractStrings(ctx, s, "")
}

// ExtractStrings returns ctx with the remote span context named by the
// traceparent tp and carrying the tracestate ts, or ctx unchanged when tp is
// empty or invalid (the receiver then starts a new trace). An invalid ts is
// dropped without affecting tp, as W3C Trace Context requires. It is safe for
// concurrent use.
func ExtractStrings(ctx context.Context, tp, ts string) context.Context {
	sc, ok := SpanContextFromStrings(tp, ts)
	if !ok {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// SpanContextFromStrings returns the remote span context of the W3C
// traceparent tp (parsed strictly by [ParseTraceparent]) with the tracestate
// ts, and whether tp was valid. An invalid or empty ts leaves the tracestate
// empty. It is safe for concurrent use.
func SpanContextFromStrings(tp, ts string) (trace.SpanContext, bool) {
	if tp == "" {
		return trace.SpanContext{}, false
	}
	sc, err := ParseTraceparent(tp)
	if err != nil {
		return trace.SpanContext{}, false
	}
	if ts != "" {
		if state, err := trace.ParseTraceState(ts); err == nil {
			sc = sc.WithTraceState(state)
		}
	}
	return sc, true
}

// TraceIDFromRequestID derives a 128-bit trace id from a request id: the
// first 16 bytes of SHA-256(requestID). The result is deterministic, so every
// process that sees the same request id derives the same trace id (the
// design's option B), and never zero (if the hash prefix were all zeros its
// last byte is set to 1). It is safe for concurrent use.
func TraceIDFromRequestID(requestID string) trace.TraceID {
	sum := sha256.Sum256([]byte(requestID))
	return traceIDFromDigest(sum[:])
}

// traceIDFromDigest takes the first 16 bytes of a digest as a trace id,
// never zero.
func traceIDFromDigest(sum []byte) trace.TraceID {
	var id trace.TraceID
	copy(id[:], sum)
	if !id.IsValid() {
		id[15] = 1
	}
	return id
}

type forcedTraceIDKey struct{}

// ContextWithTraceID returns a context in which the next root span (a span
// without a valid parent in ctx) gets trace id id instead of a random one,
// when it is started by a tracer whose id generator honours it (the tracer
// provider of package telemetry/provider, or an SDK provider built with its
// NewIDGenerator), or by [Spans] when it generates ids itself. It is how a
// server opens its own root span with the trace id of [TraceIDFromRequestID]
// when a peer sent no trace context. A span with a parent keeps its parent's
// trace id. An invalid id is ignored.
func ContextWithTraceID(ctx context.Context, id trace.TraceID) context.Context {
	if !id.IsValid() {
		return ctx
	}
	return context.WithValue(ctx, forcedTraceIDKey{}, id)
}

// TraceIDFromContext returns the trace id stored in ctx by
// [ContextWithTraceID], and whether there is one. Id generators call it to
// give a root span that trace id. It is safe for concurrent use.
func TraceIDFromContext(ctx context.Context) (trace.TraceID, bool) {
	id, ok := ctx.Value(forcedTraceIDKey{}).(trace.TraceID)
	return id, ok
}
