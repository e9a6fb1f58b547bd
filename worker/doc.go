// Package worker is cb-worker, the vLLM-worker analogue: it owns the model
// and the paged KV cache (a memfd whose descriptor it hands to the blend
// server over a Unix socket, docs/design.md §5), and
// executes the scheduler's steps over gRPC (rpc/worker.proto). Its side of
// the CacheBlend connector loads reused KV through the blend server
// (cb.start_load_kv → Retrieve), runs the selective-recompute forward
// (cb.model_forward: cb.full_recomp, cb.check, cb.partial) and hands a
// prefill's KV to the blend server's Store without delaying the response.
//
// Spans: cb.execute is a remote child of the engine's cb.request (the step's
// trace_context, with its trace_state); without one (the engine does not
// trace) it is a root of the trace whose id is derived from the request id
// (option B), where the blend server's spans of the request land too.
// cb.retrieve in cb-blend is a remote child of cb.start_load_kv. When the blend server is unreachable, a request is
// computed in full and the failure recorded: reuse failing never fails a
// request.
package worker
