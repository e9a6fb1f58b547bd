// Package apiclient is a client of the cacheblend engine's OpenAI-compatible HTTP API, shared
// by the demo (cb demo), the load generator (cb load) and the stack evaluation (cb eval).
//
// A [Client] waits for GET /health ([Client.WaitHealthy]), stores documents for reuse
// (POST /v1/documents, [Client.Ingest]), reads the engine's Prometheus exposition
// ([Client.Metrics]) and sends streamed chat completions ([Client.ChatStream]). Every chat
// completion carries its own freshly generated, sampled W3C traceparent ([NewTraceparent]),
// so its trace can be found by the trace id in the [ChatResult]. The client measures the
// time to the first content delta (TTFT) and to the end of the stream (E2E), both from just
// before the request is sent, keeps the content deltas ([ChatResult.Deltas]) and reads token
// usage, with its "cacheblend" extension, from the final usage chunk. A [ChatRequest] carries
// one user message or any [Message] list, and the engine's "cacheblend" request extension
// ([CacheBlendOptions]: reuse, recompute ratio, selection, quality check).
//
// A failed chat completion is an [*Error] whose Kind says what went wrong (connection,
// timeout, canceled, an HTTP status, an error event, a malformed or truncated stream, or a
// stream without content); callers such as package loadgen count failures by kind.
// [ReadStream] is the server-sent-events parser ChatStream uses, exported for callers that
// read a chat-completion stream they obtained themselves.
package apiclient
