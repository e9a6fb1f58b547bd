// Package loadgen is cacheblend's RAG-style load generator (cb load) and its cross-check
// against the engine's own metrics.
//
// Every request is a streamed chat completion whose user message is a random subset of a
// shared document corpus (by default the sample documents of package corpus) in random order,
// optionally after a random-length filler prefix so the documents land at arbitrary,
// non-block-aligned offsets, followed by a question; each carries its own W3C traceparent.
// The client measures per request TTFT, E2E and TPOT = (E2E − TTFT)/(n − 1) ([Result]).
//
// Load is closed-loop (Concurrency workers back to back) or open-loop (Rate requests/s,
// evenly spaced or Poisson, at most Concurrency in flight), always bounded by a request count
// and a duration ([Config]). [Run] then compares the client's numbers with the engine's
// /metrics, scraped before and after the run ([ServerCheck]): the requests counted against
// those sent, and the server's percentiles estimated as PromQL's histogram_quantile does
// ([HistogramQuantile]).
//
// Run is safe to call concurrently (runs share nothing); a [Report] is a plain value that
// must not be mutated while it is being printed or written.
package loadgen
