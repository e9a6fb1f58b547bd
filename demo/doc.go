// Package demo runs the README's main job: it ingests the sample documents
// shipped in package corpus, sends RAG-style requests (documents in varying order and
// positions, then a question) once with CacheBlend reuse and once as a full
// prefill, and reports per request TTFT with and without reuse, hit rates,
// imp_count and the trace that shows where the time went, checked against
// the span contract.
package demo
