// Package telemetry is the tracing layer shared by cb-engine, cb-worker and
// cb-blend.
//
// It provides:
//
//   - a strict W3C trace-context (traceparent) parser and formatter
//     ([ParseTraceparent], [FormatTraceparent]) and a
//     [go.opentelemetry.io/otel/propagation.TextMapPropagator] built on it
//     ([Propagator]), with helpers for HTTP headers ([InjectHTTP],
//     [ExtractHTTP]), gRPC metadata ([MetadataCarrier] and the unary and
//     stream interceptors) and the trace_context string field of the
//     CacheBlend RPC payloads ([InjectString], [ExtractString]);
//   - deterministic trace ids derived from a request id, the "option B"
//     fallback of the design ([TraceIDFromRequestID], [ContextWithTraceID]);
//   - a tracer provider configured from the OTEL_* and CB_* environment
//     ([ConfigFromEnv], [New], [Provider]) whose export never blocks a
//     request: a bounded batch queue, export timeouts, and monotonic counters
//     of dropped and failed spans;
//   - one span helper for engine and worker code ([Spans], [Span]) that
//     records an OpenTelemetry span and, under CB_PROFILE=1, one JSONL line
//     per span;
//   - a [log/slog] handler that stamps trace_id and span_id on every record
//     ([NewLogHandler]).
//
// Invalid trace context is never half trusted: a header that does not parse
// strictly is ignored and the receiver starts a new trace.
//
// The package keeps no global state: it never calls otel.SetTracerProvider or
// otel.SetTextMapPropagator; callers pass the [Provider]'s TracerProvider
// where it is needed.
package telemetry
