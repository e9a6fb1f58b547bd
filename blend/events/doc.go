// Package events is the blend server's event bus and its subscribers.
//
// The blend server (cb-blend) never calls the tracer on its data path.
// Instead every stage publishes a pair of [Event]s, a START and an END, each
// with its own timestamp (the END of an asynchronous copy is published when
// the copy completes), on a bounded [Bus] that never blocks the publisher:
// when the queue is full the event is dropped and counted.
//
// One drain goroutine, owned by the Bus, delivers the events to the
// subscribers registered for their type:
//
//   - [TracingSubscriber] turns the pairs into OpenTelemetry spans through a
//     table of [SpanDef]s and a registry of open spans keyed by request and
//     span: cb.lookup (a remote child of the engine's cb.lookup.rpc) with
//     mp.lookup_prefetch, cb.fingerprint_match or cb.coordinator_match,
//     cb.sparse_prefetch ⊃ cb.l2_load and cb.classify below it; cb.retrieve
//     (a remote child of the worker's cb.start_load_kv) with one cb.scatter
//     per copy; cb.store in a trace of its own. When a peer sent no trace
//     context it opens its own cb.request root whose trace id is derived from
//     the request id (telemetry.TraceIDFromRequestID, option B, docs/design.md §6), and
//     closes it once the retrieve has ended and no copy is pending.
//   - [MetricsSubscriber] turns them into the lmcache_blend_* counters and
//     duration histograms through a [MetricsSink] (*metrics.BlendMetrics
//     implements it).
//   - [L2ThroughputSubscriber] turns L2_LOAD_TASK pairs into L2 read bytes
//     and GB/s through an [L2ThroughputSink] (also *metrics.BlendMetrics).
//
// Wiring in cb-blend:
//
//	bus := events.NewBus(events.Config{})
//	ts, _ := events.NewTracingSubscriber(provider.TracerProvider())
//	ms, _ := events.NewMetricsSubscriber(blendMetrics)
//	ls, _ := events.NewL2ThroughputSubscriber(blendMetrics)
//	bus.Subscribe(ts, ts.EventTypes()...) // likewise ms, ls
//	bus.Start()
//	defer bus.Shutdown(ctx)
//
// For option-B roots to carry the derived trace id, the TracerProvider is a
// telemetry/provider Provider's, or an SDK provider built with
// sdktrace.WithIDGenerator(provider.NewIDGenerator(nil)).
//
// Subscribers are called only from the drain goroutine, one event at a time,
// so they keep their own state without locks. Spans whose END never arrives
// are ended by an age-based sweep driven by the bus's periodic [Tick] event,
// also on the drain goroutine.
package events
