// Package fingerprint is the non-prefix leg of the blend server's unified
// lookup (CacheBlend V3): a table of stored chunks' fingerprints that finds
// token-exact reusable ranges of a prompt at any offset.
//
// Every registered chunk of at least W tokens (the window, default 16) is
// fingerprinted by a 64-bit polynomial rolling hash of its first W tokens
// (mod 2^64, odd base, tokens pre-mixed by a multiply); chunks shorter than W
// get no fingerprint, so they never start a match, though matches extend
// into them. [Table.Match] rolls the hash over the prompt at every offset
// (probe stride 1) and probes an open-addressing table (no map lookup and no
// allocation per probe). A hit is verified token by token (hash collisions are
// rejected and counted), then extended forward across consecutive stored
// chunks of the same sequence and backward while tokens agree. Results are
// ranges (stored_st, stored_ed, cur_st, cur_ed) that never overlap in the
// prompt, with the chunk keys they span, matching the cbv1.Match message.
//
// Registration is asynchronous to the store and safe concurrently with Match.
// A chunk whose KV is gone is marked stale ([Table.MarkStale]); after
// StaleStrikes (default 2) marks it is unregistered.
//
// The prefix leg lives in package chunkstore (ChainKeys, CountPrefix).
package fingerprint
