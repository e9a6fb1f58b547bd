package events

import (
	"github.com/cacheblend/cacheblend/telemetry/provider"

	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// FuzzTracingSubscriber feeds arbitrary event sequences (types, requests,
// copies, trace contexts, times out of order) to the tracing subscriber. It
// must never panic, and a sweep after the TTL must leave nothing open and no
// request state behind.
func FuzzTracingSubscriber(f *testing.F) {
	f.Add([]byte{1, 0, 0, 2, 0, 0}, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add([]byte{15, 1, 0, 17, 1, 1, 16, 1, 0, 18, 1, 1, 18, 1, 1}, "")
	f.Add([]byte{1, 2, 0, 15, 2, 0, 21, 0, 0, 2, 2, 0}, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	f.Add([]byte{9, 3, 0, 11, 3, 0, 12, 3, 0, 10, 3, 0}, "garbage")
	f.Fuzz(func(t *testing.T, data []byte, tc string) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithIDGenerator(provider.NewIDGenerator(nil)))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		sub, err := NewTracingSubscriber(tp)
		if err != nil {
			t.Fatal(err)
		}
		reqs := []string{"a", "b", "c", ""}
		last := t0
		for i := 0; i+2 < len(data); i += 3 {
			ev := Event{
				Type:      EventType(data[i] % (uint8(numEventTypes) + 2)),
				RequestID: reqs[int(data[i+1])%len(reqs)],
				CopyID:    uint64(data[i+2] % 3),
				Time:      t0.Add(time.Duration(int8(data[i+2])) * time.Millisecond),
			}
			if data[i+1]&0x80 != 0 {
				ev.TraceContext = tc
			}
			if ev.Type == Tick {
				ev.Time = t0 // a tick before the TTL sweeps nothing
			}
			if ev.Time.After(last) {
				last = ev.Time
			}
			sub.HandleEvent(ev)
		}
		sub.HandleEvent(Event{Type: Tick, Time: last.Add(DefaultSpanTTL)})
		if st := sub.Stats(); st.Open != 0 {
			t.Fatalf("Stats after the final sweep = %+v", st)
		}
		if len(sub.reqs) != 0 {
			t.Fatalf("%d request states left after the final sweep", len(sub.reqs))
		}
	})
}
