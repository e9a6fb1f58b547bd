// Package rpc holds the .proto files of the CacheBlend protocol (blend.proto:
// engine/worker ↔ blend server; worker.proto: engine ↔ worker) and, in cbv1,
// the generated gRPC code. Every CB payload carries request_id and an
// optional trace_context (W3C traceparent) with its trace_state (W3C
// tracestate, field 20). Run `go generate ./rpc/...` to
// regenerate cbv1 with the generator versions pinned in tools/go.mod.
package rpc
