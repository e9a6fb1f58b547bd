// Package blend is cb-blend, the blend server (the LMCache analogue;
// docs/design.md): it owns the chunk store (L1 memory, optional L2 directory),
// the fingerprint table, the unified lookup, the retrieve with its
// token-granular scatter and re-RoPE into workers' KV memory, and the event
// bus whose subscribers turn the server's paired events into spans, metrics
// and L2 throughput.
//
// A [Server] implements cbv1.BlendServiceServer ([Server.Service]):
//
//   - RegisterKV maps a worker's shared-memory KV file (package kvcache: a
//     regular cb-kv-*.shm file of exactly the layout's size, at an absolute
//     path) and keeps it per (worker_id, rank); re-registering with the same file is
//     idempotent, a new file replaces the old mapping. Registrations that are
//     not renewed within Config.RegistrationTTL are dropped. The response
//     carries the server epoch, random per process start.
//   - Lookup queues the unified lookup of a prompt on a bounded pool
//     (ResourceExhausted when the queue is full) and answers when it is
//     done, or DeadlineExceeded when the caller's deadline passes first (a
//     queued lookup whose caller is gone is skipped); the server keeps
//     nothing of it afterwards. The lookup runs the prefix leg
//     (mp.lookup_prefetch: prefix-chain keys over the prompt's full chunks),
//     the non-prefix leg (cb.fingerprint_match from the prefix coverage on),
//     the sparse prefetch of every matched chunk into L1 (cb.sparse_prefetch
//     with a coalesced cb.l2_load), and the classification (cb.classify:
//     found, stale, per_rank_ok). Chunks held by no tier are stale: their
//     fingerprints get a strike (two strikes unregister them) and their
//     tokens are cut out of the matches.
//   - Retrieve scatters the matched token ranges into the worker's KV memory
//     slot by slot on the copy pool (package scatter), re-RoPE'ing K of
//     non-prefix matches (every match is validated and cut into per-chunk
//     segments by package reuseplan); slots beyond the given block table are dropped,
//     positions below from_token skipped; chunks gone since the lookup come
//     back as missing ranges.
//   - Store copies a prefilled sequence's KV out of the worker's memory
//     during the call, into chunks (full chunks and the partial tail) keyed
//     by the prefix chain, and registers the fingerprints asynchronously.
//
// Lookup statistics: requested_tokens is the prompt length;
// prefix_hit_tokens = prefix_chunks × chunk_size; non_prefix_hit_tokens sums
// the non-prefix matches (disjoint from the prefix); hit_rate is their sum
// over requested_tokens (hit_tokens). prefix_coverage_tokens is the leading
// chunks found by the prefix leg before classification, × chunk_size: the
// non-prefix leg searches its complement (n_non_prefix_tokens =
// requested_tokens − prefix_coverage_tokens), so the two hit counts are
// disjoint. fingerprint_hits counts the distinct chunks the non-prefix
// matches span, storage_hits the matched chunks (both legs) found in
// storage, stale_chunks the matched chunks found in no tier.
//
// Tensor parallelism: fingerprints are registered for rank 0's stores; a
// store by rank r > 0 records, for each chunk, the rank-0 key it
// corresponds to, so Retrieve by rank r translates the lookup's rank-0 keys
// and a lookup with world_size > 1 checks every rank (per_rank_ok).
//
// The fingerprint tables and rank aliases live in memory: after a restart,
// chunks found in the L2 directory serve the prefix leg only, until they
// are stored again.
//
// The data path never calls the tracer: every stage publishes a START/END
// pair of events (package events) with its own timestamps on the bus, and
// a copy's END is published when the copy completes.
package blend
