// Package chunkstore is the chunk-granular KV store of the blend server.
//
// A [Chunk] is up to ChunkSize (default 256) consecutive tokens of a stored
// sequence (a document or a prompt) with K and V of every layer of one rank,
// the token ids, the positions K was rotated at, the layout (layers, KV heads,
// head dimension, RoPE base), the rank and the model name. Chunks are
// addressed by a [Key] chosen by the caller, normally the prefix chain hash of
// [ChainKeys]: key_i = SHA-256(key_{i-1} || model || rank || tokens of chunk i).
// [CountPrefix] and [Store.PrefixChunks] give the prefix leg of the unified
// lookup: how many leading chunks of a prompt are stored.
//
// A [Store] has two tiers. L1 is memory under a hard LRU byte budget: the
// accounted bytes never exceed it and a chunk larger than the budget is not
// admitted. L2 (optional) is a directory with one file per key, written to a
// temp file and renamed atomically, with an optional byte budget that evicts
// the oldest-written files. A chunk file holds a versioned header (magic,
// version, layout, rank, model, token count, positions start), the token ids
// and positions, the K/V data and a CRC-32C over everything; a file that is
// corrupt, truncated, of another version or layout is a counted miss, never a
// crash and never wrong KV. [Store.GetMany] is the sparse prefetch: L1 hits
// directly, L2 misses read in one coalesced parallel batch.
//
// The L2 directory is opened without following a symbolic link at it and
// must belong to this process's user ([MakeDir], ErrUnsafeDir); files are
// read with O_NOFOLLOW. The store deletes only files it can tell it wrote
// (its temp-file names, and chunk files it evicts): a chunk file that does
// not decode is renamed aside to <name>.corrupt, never deleted. A failed L2
// write (a full disk) leaves the chunk in L1, returns an [L2WriteError]
// (InL1, DiskFull), sets Stats.DiskFull and Stats.LastWriteError, and keeps
// the chunk pending: after a later L2 write succeeds the store writes a few
// pending chunks again, so a document stored while the disk was full
// becomes durable once there is room ([Store.Durable]).
//
// Evictions are counted per tier and reported through Config.OnEvict, called
// without store locks held, so a fingerprint table can mark chunks stale.
package chunkstore
