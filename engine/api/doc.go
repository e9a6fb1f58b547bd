// Package api holds the OpenAI-compatible wire types of cb-engine: the
// request bodies of POST /v1/chat/completions, /v1/completions and
// /v1/documents, their strict decoding and validation into a normalized
// [Generation], the response and streaming-chunk shapes, and the OpenAI error
// body ([Error]) with its HTTP status and the error_type label recorded in
// the request metrics.
//
// Decoding never panics and never trusts the input: every malformed body or
// parameter yields an *[Error] with a 4xx status, the offending parameter
// named in its param field. All functions are safe for concurrent use.
package api
