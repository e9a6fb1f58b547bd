// Package rope implements rotary position embeddings (RoPE) in the "rotate
// half" layout of Llama, for the model of cb-worker and for the blend
// server's re-RoPE of reused keys.
//
// [New] builds a [RoPE] for a head size and base θ ([DefaultTheta] by
// default). [RoPE.RotateHeads] rotates every head of a vector to a position;
// since rotations compose, [RoPE.Shift] moves keys computed at one position
// to another (re-RoPE), which is how CacheBlend reuses a document's KV at a
// new offset in a prompt. [Table] caches the rotation angles of positions
// [0, maxPos) so the model's forward pass rotates bit for bit as RotateHeads
// would, without a Sincos per token.
//
// The rotations run on the vector kernels of package simd (AVX-512, AVX2 or
// pure Go; every level gives the same bits, since no product is fused).
// The package is a leaf apart from simd (itself a leaf over the standard
// library and golang.org/x/sys/cpu), so the blend server links it without
// the model. Every value is immutable after construction and safe for
// concurrent use.
package rope
