package events

import (
	"github.com/cacheblend/cacheblend/telemetry/provider"

	"context"
	"strconv"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkPublish measures the publisher's cost: one non-blocking send of a
// prebuilt event into a bus drained by a trivial subscriber.
func BenchmarkPublish(b *testing.B) {
	bus := NewBus(Config{})
	if err := bus.Subscribe(SubscriberFunc(func(Event) {})); err != nil {
		b.Fatal(err)
	}
	bus.Start()
	ev := Event{Type: ScatterEnd, RequestID: "req-bench", Time: t0, CopyID: 1,
		Attrs: []attribute.KeyValue{AttrScatteredTokens.Int(700), AttrSlotWrites.Int(700)}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bus.Publish(ev)
	}
	b.StopTimer()
	if err := bus.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(bus.Dropped())/float64(b.N), "dropped/op")
}

// BenchmarkPublishAccepted measures Publish when the event is accepted: the
// queue is emptied (timer stopped) whenever it fills, so nothing is dropped.
func BenchmarkPublishAccepted(b *testing.B) {
	bus := NewBus(Config{QueueSize: 1 << 16})
	ev := Event{Type: ScatterEnd, RequestID: "req-bench", Time: t0, CopyID: 1,
		Attrs: []attribute.KeyValue{AttrScatteredTokens.Int(700), AttrSlotWrites.Int(700)}}
	b.ReportAllocs()
	for b.Loop() {
		if bus.Len() == bus.Cap() {
			b.StopTimer()
			for bus.Len() > 0 {
				<-bus.queue
			}
			b.StartTimer()
		}
		if !bus.Publish(ev) {
			b.Fatal("dropped")
		}
	}
	b.StopTimer()
	for bus.Len() > 0 {
		<-bus.queue
	}
	if err := bus.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkPublishParallel is BenchmarkPublish from GOMAXPROCS publishers.
func BenchmarkPublishParallel(b *testing.B) {
	bus := NewBus(Config{})
	if err := bus.Subscribe(SubscriberFunc(func(Event) {})); err != nil {
		b.Fatal(err)
	}
	bus.Start()
	ev := Event{Type: ScatterEnd, RequestID: "req-bench", Time: t0}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bus.Publish(ev)
		}
	})
	b.StopTimer()
	if err := bus.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(bus.Dropped())/float64(b.N), "dropped/op")
}

// requestSeq is one request's full event sequence: a lookup with its five
// stages and a retrieve with two scatter copies (12 + 6 events).
func requestSeq(req, lookupTC, retrieveTC string) []Event {
	evs := lookupSeq(req, lookupTC, 0)
	return append(evs,
		retrieveStart(req, retrieveTC, 10000),
		scatterStart(req, 1, 10010), scatterStart(req, 2, 10020),
		scatterEnd(req, 1, 10500, 700), retrieveEnd(req, 10600), scatterEnd(req, 2, 10900, 512))
}

// BenchmarkTracingSubscriberRequest measures the drain goroutine's cost of
// turning one request's 18 events into its spans with the OTel SDK (spans
// recorded and handed to a no-op exporter).
func BenchmarkTracingSubscriberRequest(b *testing.B) {
	cases := []struct {
		name     string
		lookup   string
		retrieve string
	}{
		{"remote_parent", traceparent(lookupTID, lookupSID, true), traceparent(lookupTID, retrieveID, true)},
		{"option_b_root", "", ""},
		{"sampled_out", traceparent(lookupTID, lookupSID, false), traceparent(lookupTID, retrieveID, false)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()),
				sdktrace.WithIDGenerator(provider.NewIDGenerator(nil)))
			defer func() { _ = tp.Shutdown(context.Background()) }()
			sub, err := NewTracingSubscriber(tp)
			if err != nil {
				b.Fatal(err)
			}
			seqs := make([][]Event, 1024)
			for i := range seqs {
				seqs[i] = requestSeq("req-"+strconv.Itoa(i), c.lookup, c.retrieve)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				for _, ev := range seqs[i%len(seqs)] {
					sub.HandleEvent(ev)
				}
				i++
			}
			if st := sub.Stats(); st.Open != 0 || st.Lost != 0 {
				b.Fatalf("Stats = %+v", st)
			}
		})
	}
	b.Run("noop_provider", func(b *testing.B) {
		sub, err := NewTracingSubscriber(noop.NewTracerProvider())
		if err != nil {
			b.Fatal(err)
		}
		seq := requestSeq("req", "", "")
		b.ReportAllocs()
		for b.Loop() {
			for _, ev := range seq {
				sub.HandleEvent(ev)
			}
		}
	})
}
