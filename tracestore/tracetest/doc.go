// Package tracetest builds synthetic traces shaped like the span contract
// (contract/spans.yaml) for tests of the collector, the checker and the web page: one
// request's spans across cb-engine, cb-worker and cb-blend, with deterministic ids and
// timings, as the three processes would export them over OTLP.
//
// The traces are test fixtures, not measurements; nothing outside tests should use them.
// The functions are pure and safe for concurrent use.
package tracetest
