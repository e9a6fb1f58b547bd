// Package offheap allocates large, pointer-free scratch buffers outside the
// Go heap, in private anonymous mappings.
//
// A serving process whose weights and KV cache already live in mappings
// still keeps long-lived scratch buffers on the heap: the model's per-call
// workspaces (tens of MiB for a 512-token chunk). The garbage collector
// counts them as live, so with the default GOGC=100 the heap is allowed to
// grow by as much again before the next collection: every MiB of workspace
// costs about two of resident memory. A buffer from [Floats] (or [Make],
// for any numeric element type) costs one.
//
// The caller owns each buffer and must call [Free] ([Release]) exactly
// once, when no slice of it is used any more; the memory is then returned
// to the operating system at once. Nothing here is tracked by the garbage
// collector, so a buffer must never hold a pointer into the Go heap (the
// element types, [Elem], cannot). These functions are safe for concurrent
// use.
//
// A [Buf] is one growable buffer owned by a long-lived value (the integer
// GEMM's quantized activations, a workspace's RoPE angles), released by
// its owner or by a cleanup when the owner is collected.
//
// A [Pool] recycles such buffers between calls, as a sync.Pool would but
// without the heap: it keeps a bounded number of free buffers for the life
// of the process (a collection does not drop them, so they are not mapped
// again, and the collector never counts them).
package offheap
