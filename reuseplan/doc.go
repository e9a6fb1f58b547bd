// Package reuseplan is the arithmetic of CacheBlend KV reuse, shared by the
// engine, the worker and the blend server: token ranges, matches between a
// prompt and stored chunks, the plan of one request, and its segmentation
// into the pieces that are taken from the engine's prefix cache, loaded as an
// exact prefix, loaded and re-RoPE'd (reused), or recomputed.
//
// It is a leaf package: it knows nothing of gRPC, protobuf or tracing. The
// conversion to and from the protobuf messages lives in package rpc
// ([github.com/cacheblend/cacheblend/rpc]).
//
// The path of a plan (docs/design.md, "The reuse plan"):
//
//  1. The blend server's lookup finds matches ([Match]) and cuts them to the
//     chunks it holds ([Match.Runs]).
//  2. The engine clips them to what its own prefix cache does not cover and
//     decides where computation starts ([New], [Plan.ComputeStart]).
//  3. The worker asks the blend server to write the plan's matches into the
//     blocks allocated so far; the server validates every match
//     ([Match.Validate]) and cuts it into per-chunk [Segment]s whose
//     writable part is bounded by the allocation ([Segment.Window]).
//  4. The worker records what was written ([Loaded]) and hands the forward
//     pass its prefix and reused ranges ([Loaded.Forward]).
//
// Every type here is a plain value; nothing is safe for concurrent mutation,
// everything is safe for concurrent reading.
package reuseplan
