// Package blend is cb-blend, the blend server (the LMCache analogue;
// docs/design.md): it owns the chunk store (L1 memory, optional L2 directory),
// the fingerprint table, the unified lookup, the retrieve with its
// token-granular scatter and re-RoPE into workers' KV memory, and the event
// bus whose subscribers turn the server's paired events into spans, metrics
// and L2 throughput.
//
// A [Server] implements cbv1.BlendServiceServer ([Server.Service]):
//
//   - A worker registers its KV memory on the server's KV socket
//     (Config.KVSocket; package rpc/kvsock), not by RPC: a peer of the
//     server's own user (SO_PEERCRED) sends a KVRegistration with the
//     memory's descriptor attached; the server checks it, maps it (it never
//     opens a path) and answers with a random 256-bit registration token.
//     The registration is kept per (worker_id, rank) as long as the
//     connection lives, until replaced or unregistered (UnregisterKV).
//     Connections are capped in total and per peer process.
//   - Retrieve, Store and UnregisterKV must carry the registration's token,
//     compared in constant time: without it they are PermissionDenied.
//     Every field is bounded by the registered layout before use (block ids
//     inside the memory and distinct, at most NumBlocks of them, tokens and
//     matches bounded by MaxTokens and MaxMatches).
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
//     non-prefix matches (segments from package reuseplan); slots beyond the
//     block table are dropped, positions below from_token skipped; chunks
//     gone since the lookup come back as missing ranges.
//   - Store copies a prefilled sequence's KV out of the worker's memory
//     during the call, into chunks (full chunks and the partial tail) keyed
//     by the prefix chain, and registers the fingerprints asynchronously.
//
// The lookup statistics are reuseplan.Hits (docs/design.md, "The request's
// statistics"): the non-prefix leg searches the complement of the prefix
// leg's coverage, so the two hit counts are disjoint.
//
// Tensor parallelism: fingerprints are registered for rank 0's stores; a
// store by rank r > 0 records, for each chunk, the rank-0 key it
// corresponds to, so Retrieve by rank r translates the lookup's rank-0 keys
// and a lookup with world_size > 1 checks every rank (per_rank_ok). With a
// fleet tier every rank's chunks are written to Redis under their rank-0
// keys too, so another node's lookup of world_size N (cb.coordinator_match)
// loads every rank's chunk, and counts a chunk only when all N are there.
// A fleet write that fails (Redis down or paused) waits on the tier's
// bounded retry queue and is written again when Redis answers; the writes
// of a stored document are followed (fleet.Group) so that the engine can
// say in its ingest answer whether other nodes find the document yet
// (BlendService.FleetStatus).
//
// The fingerprint tables and rank aliases live in memory: after a restart,
// chunks found in the L2 directory serve the prefix leg only, until they
// are stored again.
//
// The data path never calls the tracer: every stage publishes a START/END
// pair of events (package events) with its own timestamps on the bus, and
// a copy's END is published when the copy completes.
package blend
