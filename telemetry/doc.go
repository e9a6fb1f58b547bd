// Package telemetry is the tracing API layer shared by cb-engine, cb-worker
// and cb-blend: what libraries need to create spans and propagate trace
// context. It depends on the OpenTelemetry API only (go.opentelemetry.io/otel,
// .../trace, .../propagation), never on the SDK or an exporter; the tracer
// provider, its span processors, sampler, id generator and OTLP exporters
// live in package telemetry/provider, which only process setup imports (as
// the OpenTelemetry Go API/SDK split).
//
// It provides:
//
//   - a strict W3C trace-context (traceparent) parser and formatter
//     ([ParseTraceparent], [FormatTraceparent]) and a
//     [go.opentelemetry.io/otel/propagation.TextMapPropagator] built on it
//     ([Propagator]), with helpers for HTTP headers ([InjectHTTP],
//     [ExtractHTTP]), gRPC metadata ([MetadataCarrier] and the unary and
//     stream interceptors) and the trace_context and trace_state string
//     fields of the CacheBlend RPC payloads ([InjectStrings],
//     [ExtractStrings], [SpanContextFromStrings]; [InjectString] and
//     [ExtractString] for the traceparent alone);
//   - deterministic trace ids derived from a request id, the "option B"
//     fallback of the design ([TraceIDFromRequestID], [ContextWithTraceID],
//     read back by id generators with [TraceIDFromContext]);
//   - one span helper for engine and worker code ([Spans], [Span]) that
//     records an OpenTelemetry span through any trace.TracerProvider and,
//     under CB_PROFILE=1, one JSONL line per span ([ProfileSink]);
//   - a [log/slog] handler that stamps trace_id and span_id on every record
//     ([NewLogHandler]).
//
// Invalid trace context is never half trusted: a header that does not parse
// strictly is ignored and the receiver starts a new trace.
//
// The package keeps no global state: it never calls otel.SetTracerProvider or
// otel.SetTextMapPropagator; callers pass the tracer provider (from
// telemetry/provider's Provider, or a no-op one) where it is needed.
package telemetry
