// Package eval measures CacheBlend's two numbers side by side on a loaded
// model: how much faster a blended prompt's prefill is than a full one, and
// how far its answer drifts from the full prefill's. It is `cb eval`.
//
// A workload is RAG prompts: documents (the sample corpus by default) at
// varying offsets of chat-templated prompts, each ending in a question.
// Every document is computed alone, from position 0, as the stack stores
// it; each prompt is then run as a full prefill and blended (package
// quality) at every recompute ratio and selection rule — the check layer's
// KV deviation (CacheBlend's HKVD) and random tokens at the same ratio;
// ratio 0 is full reuse without recompute. For each configuration the
// report gives the mean next-token KL(full ‖ blend) at the first output
// token and over the first K tokens (teacher-forced on the full prefill's
// greedy continuation), the top-1 agreement, the share of prompts whose K
// greedy tokens match, and the model-only speedup (full prefill time over
// blended forward time on the same machine, in the same process).
//
// With Config.Stack, Run also measures every configuration through a
// running stack (Stack): the documents are ingested with POST
// /v1/documents, each prompt is sent with the configuration's "cacheblend"
// settings and as a full prefill ("reuse": false), streaming, and the
// report's TTFT speedup is the ratio of the median client-side times to the
// first token (the API returns no logits: quality is still measured in
// this process, on the same documents and questions).
//
// Run is not safe for concurrent use with other work on the same model
// (it measures time).
package eval
