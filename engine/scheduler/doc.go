// Package scheduler is cb-engine's continuous-batching scheduler: a step
// loop that drives one cb-worker through the step protocol of
// rpc/worker.proto, with the scheduler side of the CacheBlend connector.
//
// Every step it builds one batch under a token budget (chunked prefill):
// running sequences first (one token each when decoding, the next chunk of
// their prompt when prefilling), then waiting requests in arrival order while
// the budget, the limit on running sequences and the KV blocks allow. The KV
// blocks (blockManager: a [kvcache.Allocator] sized by the worker's Info,
// whose full blocks form a prefix cache by hash chain) are shared by prompts
// with a common prefix; when they run out the newest running sequence is
// preempted and later recomputed, which yields the same tokens. A token the
// CacheBlend plan reuses is charged its share of the forward, from the
// model's depth and the check layer the worker reports (InfoResponse).
//
// The calls the loop waits on, a request's Lookup and a Prefilled request's
// KV pull, run through one driver (calls): a bounded number in flight, a
// goroutine each, the outcome handed back to the loop, which never blocks on
// them. A request that looks its reuse up waits in the queue until the
// outcome (at most Config.LookupTimeout); its result becomes the reuse plan
// (package reuseplan) the worker gets in the first prefill steps. A lookup
// that fails or times out falls back to a full prefill, counted through
// [Deps.OnFallback]. A finished request whose prompt the worker is storing in
// the blend server keeps its blocks until the worker reports the store done
// (ExecuteResponse.stored_request_ids), like vLLM's delay_free_blocks.
//
// Spans (contract/spans.yaml): cb.request (a child of the request's context)
// ⊃ cb.schedule ⊃ {cb.lookup.rpc (n_polls: the steps the request waited),
// cb.build_meta}; the worker's cb.execute is a remote child of cb.request
// through SeqStep.trace_context. cb.request carries the lookup outcome (done,
// skipped, a fallback reason, abandoned) and the statistics the blend server
// reported, zero hit statistics without a result.
package scheduler
