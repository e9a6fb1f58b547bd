// Package httpfront is the HTTP front of the OpenAI-compatible API that cb-engine and
// cb-gateway share: a [Front] holds the routes (chat, completions, documents, models, health,
// metrics), answers unknown paths and methods with OpenAI-shaped 404 and 405 errors, records
// every request's duration, checks the API key, reads request bodies within their bounds
// (415 when not declared JSON, 413, 408, 499), and runs the HTTP server (package httpserve)
// from Start to Shutdown. Handlers write through a [StatusWriter], which renews the write
// deadline before every write so that a stream is never cut while a stalled client is.
//
// The components keep what differs: their handlers, their own start-up (the engine's
// scheduler, the gateway's health checks) and shutdown, which the front runs within its own.
package httpfront
