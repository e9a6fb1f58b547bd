// Package model is a small Llama-architecture decoder in pure Go (float32):
// token embedding, layers of RMSNorm → grouped-query attention with RoPE →
// residual → RMSNorm → SwiGLU MLP → residual, a final RMSNorm and a tied LM
// head, with weights generated deterministically from a seed. It runs prefill
// and batched decode over the paged KV cache of package kvcache, and the
// three-phase CacheBlend forward (full recompute, check, partial).
//
// # Entry points
//
//   - [New] builds a [Model] from a [Config] (zero fields are defaults; see
//     [DefaultConfig]). [Config.KVLayout] gives the kvcache.Layout to map.
//   - [Model.Prefill] computes a chunk of a prompt at positions
//     [Start, Start+n), writing its K/V into the cache slots of its block
//     table, and returns the last token's logits.
//   - [Model.Decode] runs one token for each sequence of a batch.
//   - [Model.BlendForward] runs the CacheBlend selective recompute over a
//     prompt whose K/V are partly reused (a prefix and/or ranges scattered
//     and re-RoPE'd by the blend server) and reports per-phase times.
//   - [Sample] / [Argmax] pick the next token.
//
// The byte-level tokenizer shared with cb-engine is package
// [github.com/cacheblend/cacheblend/tokenizer] (vocabulary [DefaultVocab]),
// and the rotary embedding, shared with the blend server's re-RoPE, is
// package [github.com/cacheblend/cacheblend/rope] ([Model.RoPE] returns the
// model's); both are leaf packages, so the engine and the blend server link
// them without this package.
//
// # Defaults
//
// 16 layers, width 256, 8 query heads and 2 KV heads of 32, SwiGLU 768,
// vocabulary 258, 8,192 positions, RoPE θ 10000, check layer 1, recompute
// ratio 0.15: a full prefill of 2,000 tokens costs about 0.5 s of CPU
// (spread over the cores), the KV cache holds 8 KiB per token and
// the CacheBlend speed-up ceiling L/(cl+1+(L−cl−1)·ratio) is 3.90.
//
// # Kernels and concurrency
//
// Every call spreads its matrix multiplies and attention over at most
// Config.Threads goroutines (default GOMAXPROCS) and waits for them: a Model
// owns no background goroutines and needs no Close. The kernels are package
// simd's (AVX-512, AVX2+FMA or pure Go, chosen from the CPU at start-up;
// CB_SIMD=off forces pure Go): matrix multiplies on tiles scheduled by this
// package against weights packed once by New (and by NewShard for a rank's
// slice), a fused flash-style attention for prefill and blend, row kernels
// over the cache slots for decode (a decode row's positions in chunks of at
// most 64, one task each over every query head, merged as flash decoding
// does), and vector RMSNorm, SwiGLU, softmax and
// RoPE. BenchmarkMatMul, BenchmarkAttention2048 and BenchmarkPrefill1536
// report them against the per-core FP32 peak. A Model is safe for
// concurrent use provided concurrent calls write disjoint KV slots.
//
// NewShard builds one rank's slice of the model for tensor parallelism
// (docs/design.md §11): the ranks' partial attention and MLP outputs, the
// check layer's deviations and the reused positions they agree on go
// through a tp.AllReducer, so the ranks of a group compute the whole
// model's logits (within float rounding) and agree with each other exactly.
// With weights of a type whose products round their activations (F16,
// BF16, the block types; see actround.go), "within float rounding" is
// looser: where the ranks' partial sums differ from the whole model's in
// the last bit across a rounding boundary, one activation moves by a
// quantization step and the logits by up to a few tenths (measured on Q8_0:
// 0.2–0.35), so greedy outputs can part after some tokens. The ranks still
// agree with each other exactly.
package model
