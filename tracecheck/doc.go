// Package tracecheck validates captured traces against the span contract
// (contract/spans.yaml): the engine of `cb check`.
//
// Traces are read into a backend-neutral model ([Trace], [Span], typed [Value]s) from
// collector pdata ([FromPtrace]), from the Jaeger JSON model ([FromJaeger],
// [ParseJaegerJSON], [FromQuery] against any Jaeger-compatible query API, including the
// embedded collector's), from OTLP/JSON files ([ParseOTLPJSON]; [Parse] detects the format),
// or from the embedded store in process ([FromStore]). [Check] and [CheckWith] apply the
// rules listed on [CheckWith] and return a [Report]: one PASS/FAIL verdict per trace with
// the violations found, a text rendering, and [Report.OK] for the exit status.
//
// The package keeps no state; its functions are safe for concurrent use on distinct
// inputs.
package tracecheck
