// Package provider is the tracing SDK setup of a CacheBlend process: it
// builds the OpenTelemetry tracer provider that package telemetry's span
// helpers record through. Only process setup (package service, which cmd/cb
// uses) and tests import it; libraries import package telemetry, which does
// not depend on the OpenTelemetry SDK or any exporter (as the OpenTelemetry
// Go API/SDK split).
//
// It provides:
//
//   - a [Config] read from the OTEL_* and CB_* environment ([ConfigFromEnv]);
//   - a [Provider] ([New]) whose export never blocks a request: a bounded
//     batch queue per exporter, export timeouts, OTLP exporters over gRPC,
//     HTTP/protobuf or HTTP/JSON, the head sampler named by
//     OTEL_TRACES_SAMPLER, and monotonic counters of lost spans (dropped
//     by the queue, or in failed exports: [Provider.DroppedSpans]); [Provider.Spans] returns a [telemetry.Spans] bound to its tracer
//     provider and its CB_PROFILE span profile;
//   - the id generator every Provider uses ([NewIDGenerator]), which gives a
//     root span the trace id stored by [telemetry.ContextWithTraceID] (trace
//     ids derived from request ids, option B, docs/design.md §6).
//
// The package keeps no global state: it never calls otel.SetTracerProvider;
// callers pass [Provider.TracerProvider] where it is needed.
package provider
