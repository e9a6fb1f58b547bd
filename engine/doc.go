// Package engine is cb-engine: the OpenAI-compatible HTTP API in front of
// the continuous-batching scheduler (package engine/scheduler), and the serve
// loop that records every request.
//
// Routes: POST /v1/chat/completions and POST /v1/completions (streamed as
// server-sent events ending in "data: [DONE]", or not; with usage), GET
// /v1/models and /v1/models/{model}, POST /v1/documents (documents prefilled
// on their own and stored in the blend server for reuse), GET /health, GET
// /metrics. Errors use the OpenAI error body with a meaningful status: 400
// malformed JSON, bad parameters or a prompt longer than the model allows;
// 401 a missing or wrong API key (when one is configured); 404 an unknown
// model or route; 413 a body over the limit; 429 a full queue; 503 while the
// worker is unavailable. Bad input never yields a 500.
//
// Every generation request, streamed or not, failed or not, is traced,
// measured and logged once:
//   - a SERVER span "{operation} {model}" (GenAI naming), the child of the
//     caller's traceparent when it parses strictly, else a new trace, with
//     children engine.queue, engine.prefill, engine.decode (a "token" event
//     every 32 tokens) and the scheduler's cb.request subtree; 5xx marks it
//     ERROR with error.type (a 429 does not);
//   - metrics.EngineMetrics.RecordRequest (TTFT, TPOT, duration, error_type)
//     and RecordHTTP (per route and status);
//   - one JSON log line on the logger, emitted inside the SERVER span so it
//     carries trace_id and span_id, with request_id, status, TTFT, duration
//     and token counts.
//
// Head sampling is the tracer provider's (OTEL_TRACES_SAMPLER); the decision
// travels to the worker and the blend server in the trace flags of the
// trace_context fields.
//
// Prefill/decode disaggregation (Config.Role, handoff.go, docs/design.md
// §9): a prefill engine serves a generation request carrying
// X-CB-Decode-Engine by prefilling it (CacheBlend reuse included), sampling
// the first token and forwarding the request to that decode engine with
// X-CB-Handoff (where its worker keeps the prompt's KV, under which secret,
// the first token and the prompt's digest), under a kv.transfer CLIENT span;
// it relays the decode engine's answer. A decode engine takes such a
// request over under the same request id: its scheduler takes the prompt's
// blocks from its prefix cache by chain hash, its worker pulls the rest from
// the prefill worker (PullKV → ReadKV), and it decodes and streams from the
// first token, reporting the transfer in X-CB-KV-Bytes, X-CB-KV-Blocks-Sent
// and X-CB-KV-Blocks-Deduped. Failures are OpenAI-shaped: 400 wrong_role,
// invalid_handoff, handoff_mismatch; 503 decode_unavailable (nothing was
// streamed: the caller may try another decode engine) and
// kv_transfer_failed.
package engine
