// Package kvcache holds the paged KV-cache memory shared between cb-worker and
// cb-blend: a [Layout] descriptor, slot-mapping helpers and [Memory], a
// shared-memory file (mode 0600) that the worker creates and the blend server
// maps with the same code, so the server can scatter reused KV straight into
// the worker's cache (our analogue of CUDA IPC).
//
// Memory layout: for every layer l, the K plane then the V plane, each of
// shape [NumBlocks, BlockSize, KVHeads, HeadDim] float32 (little endian). The
// slot of token position pos of a request with block table bt is
// bt[pos/BlockSize]*BlockSize + pos%BlockSize.
package kvcache
