// Package fleet is the blend server's fleet tier on Redis: KV chunks shared
// by every node of a fleet, and the fingerprint directory behind
// cb.coordinator_match (docs/design.md §3).
//
// Keys are namespaced by key space (model and tensor-parallel world size)
// and KV layout ([Namespace]): cb:<ns>:c:<chunk key> holds an encoded rank-0
// chunk (the L2 file format, with its CRC32C), cb:<ns>:c:<rank-0 key>:r<r>
// rank r's chunk of it ([Ref]: a node finds every rank's chunk from the
// rank-0 keys a match holds), cb:<ns>:s:<id> a stored sequence (tokens
// and chunk keys, CRC32C), cb:<ns>:f:<fingerprint> the sequence and chunk a
// fingerprint points at. Writes are asynchronous on a bounded queue that
// drops and counts when full; a write that fails waits on a bounded retry
// queue (full: dropped and counted) and is written again, oldest first, with
// a backoff while Redis keeps failing (while it fails, new writes join the
// queue without a first attempt), so a pause or restart of Redis loses no
// write the queue can hold; a [Group] follows a document's writes (shared,
// pending, not shared). Reads are pipelined, one round trip per shard.
//
// Redis is untrusted storage (auth.go): every value is sealed with an
// HMAC-SHA256 under the fleet key (Config.Key, never stored in Redis) over
// its key name, its layout (dtype, shape, RoPE base, rank) and its bytes. A
// read asks for at most the most a value of its layout can be (GETRANGE:
// a larger one is refused without being read whole), then checks the tag
// before decoding, then the chunk's identity, layout and finite K/V. A
// value that fails (another fleet's key, tampered, moved, too large, NaN,
// or of the unsigned version 1 format) is a counted miss, never served
// and so never kept in L1/L2 nor written back; a local chunk with
// non-finite K/V is never written. [Tier.Health] tells whether Redis
// answers, the retry queue's depth and the last error. Eviction is
// Redis's own (maxmemory with an LRU policy): a directory entry whose chunk
// is gone is found stale by the lookup's classification.
//
// A single server or a Redis Cluster (go-redis UniversalClient), redis:// or
// rediss:// with an ACL user and password ([ReadSecretFile] and
// [WithPassword] take them from files: never from a command line). Redis down, slow or full never
// fails a request: calls are bounded by timeouts, errors are counted, and the
// client reconnects by itself.
package fleet
