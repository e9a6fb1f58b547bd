// Package randid generates random, valid OpenTelemetry trace and span ids.
// It is shared by package telemetry (ids of profiled spans when tracing is
// off) and package telemetry/provider (its id generator), so that neither
// imports the other's internals.
package randid

import (
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"
)

// TraceID returns a random, valid (non-zero) trace id. It is safe for
// concurrent use.
func TraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		hi, lo := rand.Uint64(), rand.Uint64()
		for i := range 8 {
			id[i] = byte(hi >> (56 - 8*i))
			id[8+i] = byte(lo >> (56 - 8*i))
		}
	}
	return id
}

// SpanID returns a random, valid (non-zero) span id. It is safe for
// concurrent use.
func SpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		v := rand.Uint64()
		for i := range 8 {
			id[i] = byte(v >> (56 - 8*i))
		}
	}
	return id
}
