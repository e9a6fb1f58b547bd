// Package tracestore is the embedded trace collector of `cb traces` (also started by
// `cb up`): an OTLP/HTTP receiver, a bounded in-memory trace store, a query API compatible
// with Jaeger's, a request index, and a web page that shows each request's trace across
// cb-engine, cb-worker and cb-blend and where its time went.
//
// The pieces, each usable on its own:
//
//   - [Store]: spans grouped by trace id, at most MaxTraces traces, MaxSpans spans and
//     MaxBytes estimated bytes (defaults 10000, 1,000,000 and 256 MiB); when full, the
//     oldest traces (by first arrival) are evicted and counted, and a trace that alone
//     would exceed a limit keeps what fits and is marked truncated. Per span, at most 128
//     attributes (also per event and per resource), 128 events and 128 links are kept,
//     values and names are cut to 64 KiB, and what is left out is counted as OTLP's
//     dropped counts. Attribute handling is linear in the input; the request index is kept
//     in order and each row computed once per change of its trace. Durations are end minus
//     start as recorded, negative ones included (flagged, never repaired).
//     [Store.Add] takes collector pdata ([go.opentelemetry.io/collector/pdata/ptrace.Traces])
//     directly.
//   - [Receiver]: POST /v1/traces, protobuf or JSON (decoded with the collector's pdata),
//     optionally gzip-compressed, bodies capped before and after decompression (16 MiB by
//     default, never more than the store's byte budget), answering 200/400/405/413/415 as
//     the OTLP/HTTP specification says, and 429 with Retry-After while 4 × the body limit
//     is being read and decoded. Hostile input never produces a 5xx or a panic.
//   - [NewQueryHandler]: the Jaeger v1 query API (/api/services, /api/traces, …, in the
//     JSON shapes of package [github.com/cacheblend/cacheblend/tracestore/jaeger], so tools
//     that talk to Jaeger work against it), plus /api/requests (the request index:
//     request id, trace id, TTFT, hit rate, duration), /api/traces/{id}/breakdown
//     ([Breakdown]: self time per span, time per process and phase summing to the root's
//     duration, the critical path) and the web page, served from embedded files.
//   - [Collector]: both listeners (127.0.0.1:4318 and 127.0.0.1:16686 by default) with
//     Start/Shutdown.
//
// Counters are exposed as getters ([Store.Stats], [Receiver.Stats]); the package registers
// no metrics and keeps no global state. Every exported type is safe for concurrent use
// unless its documentation says otherwise.
package tracestore
