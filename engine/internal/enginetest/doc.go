// Package enginetest holds in-process test doubles of cb-worker and cb-blend
// for the engine's tests, served over real gRPC connections on 127.0.0.1.
//
// The worker double keeps a simulated paged KV pool: every slot holds the
// token whose KV it stands for. Each step writes the computed tokens into the
// slots of the request's block table, "retrieves" CacheBlend matches by
// writing the matched prompt tokens, and samples the next token as a hash of
// the whole sequence read back through the block table. A wrong block table,
// a stale reused block or a missing retrieve therefore changes the output or
// fails the step, so token-for-token equality with [Reference] is a real
// check of the scheduler's KV bookkeeping.
package enginetest
