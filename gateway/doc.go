// Package gateway is cb-gateway: an OpenAI-compatible front (the engine's API paths, errors,
// streaming, API key, /metrics, /health) that forwards each request to one of N engines,
// chosen by a routing policy, and fails over to another engine when one is down.
//
// # Routing
//
// Every request is tokenized as the engine does (the byte tokenizer, BOS, the chat template
// api.ChatPrompt), so token positions match. Per engine the gateway keeps a reuse index: a
// fingerprint table (package blend/fingerprint) of the prompts and documents it routed there,
// in 256-token chunks keyed by chunkstore.ChainKeys, bounded in bytes and registrations
// (least recently used evicted). Its Match gives the prompt tokens the engine is expected to
// reuse, at any offset. Load comes from each engine's /metrics (cb_engine_requests_waiting,
// cb_engine_requests_running, cb_engine_kv_blocks, cb_engine_kv_pool_blocks), read with the
// health check every second, and from the gateway's own in-flight count:
//
//	load(e) = in_flight(e) + max(0, waiting(e) + running(e) − in_flight at that scrape) + kv_used(e)/kv_pool(e)
//
// Policies (Config.Policy):
//
//   - kv-aware (default): score(e) = expected_hit_tokens(e)/prompt_tokens − α·load(e), α =
//     Config.Alpha (0.1: a fully reused prompt outweighs ten requests of load); the highest
//     score wins (ties: lower load, less KV held, fewer recent requests, rotation). When the winner's load
//     exceeds the least loaded engine's by more than Config.SpreadMargin (4 requests), the
//     request is spread: it goes to the best-scoring engine among those within the margin of
//     the least load. The engine it lands on then holds the prompt too, so a hot document
//     ends up on several engines and its requests balance by load, instead of piling up on
//     one. New documents (no engine expected to reuse them) go to the least loaded engine,
//     then the one with fewer recent requests, which spreads documents over the engines.
//   - least-loaded: the lowest load.
//   - round-robin: rotation.
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
// prefill engine with another one. route.decode_engine names it on both spans.
//
// # Failover
//
// An attempt that fails before anything was written to the client — the engine unreachable,
// 503, 429, a non-streamed body cut short, or a stream lost (or opened with an unavailable
// worker's error event) before its first content event, which the gateway holds back — is
// retried on another engine (each engine once per request); an engine that failed this way
// is taken out of routing until its next health check passes, and the attempts on it whose
// response has not begun (e.g. on a hung engine, when its health check fails) are cut and fail
// over too. A stream lost after it began
// ends with an OpenAI-shaped error event (code engine_lost) and data: [DONE].
//
// # Trace and metrics
//
// The gateway's SERVER span gateway.request continues the caller's traceparent and carries
// route.engine, route.policy, route.score and route.expected_hit_tokens; each attempt is a
// CLIENT span gateway.attempt whose context the forwarded request carries, so the engine's
// SERVER span is its remote child: one trace (contract/spans.yaml, the gateway as an optional
// caller). Metrics: metrics.GatewayMetrics (the GenAI request histograms as seen at the
// gateway, so `cb load` cross-checks against it unchanged, and cb_gateway_*). One JSON log
// line per request with the trace id, engine, policy, score and expected reuse.
package gateway
