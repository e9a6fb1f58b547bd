// Package rope implements rotary position embeddings (RoPE) in the "rotate
// half" layout of Llama, for the model of cb-worker and for the blend
// server's re-RoPE of reused keys.
//
// [New] builds a [RoPE] for a head size and base θ ([DefaultTheta] by
// default). [RoPE.RotateHeads] rotates every head of a vector to a position;
// since rotations compose, [RoPE.Shift] moves keys computed at one position
// to another (re-RoPE), which is how CacheBlend reuses a document's KV at a
// new offset in a prompt. [RoPE.Angles] computes a position's angles once
// and [RoPE.RotateBy] rotates by them, bit for bit as RotateHeads would: the
// model's forward computes them once per token and rotates every layer's Q
// and K with them (a table of every position was 4 MiB that stayed live for
// the model's life).
//
// The rotations run on the vector kernels of package simd (AVX-512, AVX2 or
// pure Go; every level gives the same bits, since no product is fused).
// The package is a leaf apart from simd (itself a leaf over the standard
// library and golang.org/x/sys/cpu), so the blend server links it without
// the model. Every value is immutable after construction and safe for
// concurrent use.
package rope
