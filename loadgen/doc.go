// Package loadgen is cacheblend's RAG-style load generator (cb load) and its cross-check
// against the engine's own metrics.
//
// Every request is a streamed chat completion whose user message is a random subset of a
// shared document corpus (by default the sample documents of package demo) in random order,
// optionally after a random-length filler prefix so the documents land at arbitrary,
// non-block-aligned offsets, followed by a question. Each request carries its own W3C
// traceparent, so its trace can be found by trace id. The client measures, per request, the
// time to the first content delta (TTFT), the end-to-end time (E2E) and the time per output
// token TPOT = (E2E − TTFT)/(n − 1) for n ≥ 2 completion tokens (from the usage chunk).
//
// Load is closed-loop (Config.Rate == 0: Concurrency workers send back to back) or open-loop
// (Config.Rate > 0 requests/s, evenly spaced or Poisson, with at most Concurrency requests in
// flight; an arrival that finds every slot busy waits and is counted as delayed). A run is
// always bounded, by a request count and by a duration, both with defaults.
//
// After the run, [Run] reads the engine's /metrics before and after and reports a
// [ServerCheck]: the requests the server counted (the delta of the summed
// gen_ai_server_request_duration_seconds_count) against the requests sent, and the client's
// TTFT percentiles beside the server's, estimated from the histogram's bucket deltas with
// Prometheus' histogram_quantile interpolation ([HistogramQuantile]), and whether the client
// p95 lies within one bucket of the server p95.
//
// Run is safe to call concurrently (runs share nothing); a [Report] is a plain value that
// must not be mutated while it is being printed or written.
package loadgen
