// Package scheduler is cb-engine's continuous-batching scheduler: a step
// loop that drives one cb-worker through the step protocol of
// rpc/worker.proto, with the scheduler side of the CacheBlend connector.
//
// Every step it builds one batch under a token budget (chunked prefill):
// running sequences first (one token each when decoding, the next chunk of
// their prompt when prefilling), then waiting requests in arrival order while
// the budget, the limit on running sequences and the KV blocks allow. KV
// blocks come from a [kvcache.Allocator] sized by the worker's Info: full
// blocks are registered in a prefix cache by hash chain, so a prompt sharing
// a prefix with earlier work skips it; when blocks run out the newest running
// sequence is preempted and later recomputed (its prompt plus the tokens
// generated so far), which yields the same tokens as an uninterrupted run.
//
// CacheBlend connector (cb.schedule): on first sight of a request the
// scheduler defers it and calls the blend server's Lookup on a goroutine of
// its own (at most Config.MaxLookupRPCs at a time; the call's deadline is
// the request's LookupTimeout); the outcome comes back to the step loop,
// which never blocks on it. cb.lookup.rpc's n_polls counts the steps the
// request waited. The result becomes the request's reuse plan (package
// reuseplan; cb.build_meta): the reused prefix is not computed, and the
// matches travel to the worker in the first prefill steps. A lookup that fails or times out falls back to a full prefill: the
// request is served, cb.lookup.rpc records the error, and the fallback is
// counted through [Deps.OnFallback].
//
// A finished request whose prompt KV the worker is storing in the blend
// server keeps its blocks until the worker reports the store done
// (ExecuteResponse.stored_request_ids), like vLLM's delay_free_blocks.
//
// Spans (docs/design.md, engine side): cb.request (a child of the context given
// with the request) ⊃ cb.schedule ⊃ {cb.lookup.rpc, cb.build_meta}; the
// worker's cb.execute is a remote child of cb.request through
// SeqStep.trace_context (and trace_state). cb.request carries the lookup
// outcome (lookup: done, skipped, a fallback reason, abandoned) and the
// statistics of contract/spans.yaml, zero hit statistics without a result.
package scheduler
