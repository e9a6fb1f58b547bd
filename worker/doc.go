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
//
// Prefill/decode hand-over (handoff.go, docs/design.md §9): a prefill
// worker keeps a handed-over prompt's blocks (the step carried a
// handoff_secret) for one read by a decode worker through its
// KVTransferService (ReadKV, kv.send; under mutual TLS only the cb-worker
// role may call it); a decode worker pulls them into the blocks its engine
// allocated (PullKV, kv.receive). Every field of both calls and of every
// streamed message is bounded by the KV layout before use; a finished id
// stops a pull before the step's sequences run, so its blocks are never
// written after the engine reused them.
//
// Tensor parallelism (cb worker --tp N, docs/design.md §11): with
// Deps.Reducer the worker is one rank (model.NewShard; its KV memory, its
// registration, retrieves and stores are the rank's, its spans carry rank);
// rank 0 also has Deps.Peers (package rankgroup), which runs every step on
// the other ranks. With a CacheBlend plan every rank runs the blended
// forward, which reuses only what every rank loaded. A failed group is
// Unavailable.
package worker
