// Package demo runs the README's main job: it ingests the sample documents
// shipped in package corpus, sends RAG-style requests (documents in varying order and
// positions, then a question) once with CacheBlend reuse and once as a full
// prefill, and reports per request TTFT with and without reuse, hit rates,
// imp_count and the trace that shows where the time went, checked against
// the span contract. Beside the speed, the quality: every request with reuse
// asks for the worker's online quality check ("cacheblend": {"quality_check":
// true}); the report carries the check's cb.quality figures (first-token KL
// against a full prefill, top-1 agreement), read from the trace backend, or
// why there are none, and whether the greedy output equals the baseline's.
//
// Run sends its requests one at a time and may be called concurrently, but two
// runs against one stack disturb each other's timings; Report is plain data.
package demo
