// Package gateway is cb-gateway: an OpenAI-compatible front (the engine's API paths, errors,
// streaming, API key, /metrics, /health) that forwards each request to one of N engines,
// chosen by a routing policy, and fails over to another engine when one is down.
//
// # Routing
//
// Every request is tokenized as the engine does, so token positions match. Per engine the
// gateway keeps a reuse index (a bounded fingerprint table of the prompts and documents it
// routed there, see reuseIndex) whose Match gives the prompt tokens the engine is expected to
// reuse, at any offset. Load comes from each engine's /metrics, read with the health check
// every second, and from the gateway's own in-flight count (see [Candidate].Load). The
// policies (Config.Policy) are kv-aware (default: the expected reuse against the load, spread
// to a less loaded engine beyond Config.SpreadMargin, so that a hot document ends up on
// several engines; new documents go where they fit, see [Candidate].KVHeld), least-loaded
// and round-robin.
//
// Only healthy engines with fewer than Config.MaxInFlight requests from the gateway are
// candidates. When none has a free slot the request waits in a bounded FIFO queue
// (Config.MaxQueue; full: 429 with Retry-After; Config.QueueTimeout: 503 with Retry-After);
// when no engine is healthy it gets 503 with Retry-After at once. [Policy] is the extension
// point for other routing (Deps.Policy); a policy may add headers to the forwarded request
// (Decision.Header).
//
// # Prefill/decode routing
//
// With Config.Prefill and Config.Decode (cb gateway --prefill/--decode) the policy chooses
// among the prefill engines, and a generation also takes a slot on the least loaded healthy
// decode engine (a second pool, health-checked alike), named in the forwarded request's
// X-CB-Decode-Engine header (docs/design.md §9). A 503 decode_unavailable before anything was
// written to the client takes that decode engine out of routing and retries on the same
// prefill engine with another one; when no decode engine is left the request is served whole
// on the prefill engine (without the header), and /health answers 200 "degraded" listing the
// decode engines. route.decode_engine names it on both spans.
//
// # Failover
//
// Health: Config.HealthFailures failed probes in a row (each bounded by Config.ProbeTimeout)
// take an engine out of routing; a failed attempt takes it out at once. Taking an engine out
// cuts only its attempts that are stalled (no byte of their answer within the stall window,
// HealthFailures×HealthInterval); those still receiving bytes go on. Every attempt is bounded
// by the request's deadline and by Config.IdleTimeout of silence from the engine; a relayed
// stream gets ": keep-alive" comments every Config.KeepAlive while the engine is silent. An
// attempt the gateway gives up on carries gateway.abandoned=true (AttrAbandoned).
//
// An attempt that fails before anything was written to the client — the engine unreachable,
// 503, 429, a non-streamed body cut short, or a stream lost (or opened with an unavailable
// worker's error event) before its first content event, which the gateway holds back — is
// retried on another engine (each engine once per request); an engine that failed this way
// is taken out of routing until its next health check passes, and the attempts on it whose
// response has not begun are cut and fail over too. A stream lost after it began ends with
// an OpenAI-shaped error event (code engine_lost) and data: [DONE].
//
// # Trace and metrics
//
// The SERVER span gateway.request continues the caller's traceparent and carries the route.*
// attributes; each attempt is a CLIENT span gateway.attempt whose context the forwarded
// request carries, so the engine's SERVER span is its remote child: one trace
// (contract/spans.yaml, the gateway as an optional caller). Metrics: metrics.GatewayMetrics
// (the GenAI request histograms as seen at the gateway, and cb_gateway_*). One JSON log line
// per request with the trace id, engine, policy, score and expected reuse.
package gateway
