// Package jaeger holds the JSON shapes of the Jaeger v1 HTTP query API (the API behind the
// Jaeger UI: /api/services, /api/services/{service}/operations, /api/traces and
// /api/traces/{traceID}) and a [Client] for any server that speaks it: a real Jaeger
// query service or the embedded collector of package tracestore.
//
// The types follow the wire format of Jaeger's api_v1 JSON model: every response is an
// envelope {"data", "total", "limit", "offset", "errors"}; a trace is a list of spans plus a
// process table keyed "p1", "p2", …; times are microseconds since the Unix epoch and
// durations microseconds; span attributes are typed tags (string, bool, int64, float64,
// binary).
//
// The package keeps no state; [Client] is safe for concurrent use.
package jaeger
