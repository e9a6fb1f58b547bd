// Package tracestore is the embedded trace collector of `cb traces` (also started by
// `cb up`): an OTLP/HTTP receiver, a bounded in-memory trace store, a query API compatible
// with Jaeger's, a request index, and a web page that shows each request's trace across
// cb-engine, cb-worker and cb-blend and where its time went.
//
// The pieces, each usable on its own:
//
//   - [Store]: spans grouped by trace id, bounded in traces, spans and estimated bytes (the
//     oldest traces evicted, a trace that alone would exceed a limit truncated) and per span
//     as an OpenTelemetry SDK bounds it, what is left out counted as OTLP's dropped counts
//     (see [StoreConfig]). Durations are end minus start as recorded, negative ones included
//     (flagged, never repaired). [Store.Add] takes collector pdata directly.
//   - [Receiver]: POST /v1/traces, protobuf or JSON, optionally gzip-compressed, bodies
//     capped before and after decompression, answering as the OTLP/HTTP specification says
//     (see [Receiver]). Hostile input never produces a 5xx or a panic.
//   - [NewQueryHandler]: the Jaeger v1 query API (/api/services, /api/traces, …, in the
//     JSON shapes of package [github.com/cacheblend/cacheblend/tracestore/jaeger], so tools
//     that talk to Jaeger work against it), plus /api/requests (the request index:
//     request id, trace id, TTFT, hit rate, duration), /api/traces/{id}/breakdown
//     ([Breakdown]: self time per span, time per process and phase summing to the root's
//     duration, the critical path), /api/traces/{id}/linked (the spans of other traces that
//     link to it, from the store's link index: e.g. the worker's cb.quality check of a
//     request, shown on the request's page next to its reuse) and the web page, served
//     from embedded files.
//   - [Collector]: both listeners (127.0.0.1:4318 and 127.0.0.1:16686 by default) with
//     Start/Shutdown.
//
// Counters are exposed as getters ([Store.Stats], [Receiver.Stats]); the package registers
// no metrics and keeps no global state. Every exported type is safe for concurrent use
// unless its documentation says otherwise.
package tracestore
