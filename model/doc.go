// Package model is a small Llama-architecture decoder in pure Go (float32):
// token embedding, layers of RMSNorm → grouped-query attention with RoPE →
// residual → RMSNorm → SwiGLU MLP → residual, a final RMSNorm and a tied LM
// head, with weights generated deterministically from a seed. It runs prefill
// and batched decode over the paged KV cache of package kvcache, and the
// three-phase CacheBlend forward (full recompute, check, partial).
package model
