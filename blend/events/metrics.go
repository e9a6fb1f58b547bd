package events

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/metrics"
)

// MetricsSink is the narrow view of the lmcache_blend_* instruments that
// [MetricsSubscriber] needs; *metrics.BlendMetrics implements it. Durations
// are END time − START time of one event pair. The ctx of a duration carries
// the remote span context that the request's CB_LOOKUP_START or
// CB_RETRIEVE_START brought, when it was valid and sampled, for a trace
// exemplar. Its methods are called from the bus's drain goroutine and return
// nothing: a record the sink cannot take (such as a negative count) is the
// sink's to count (BlendMetrics: Registry().RecordStats()).
type MetricsSink interface {
	// RecordLookup: lookup_requests, lookup_hit_tokens{leg},
	// lookup_requested_tokens, lookup_fingerprint_hits, lookup_storage_hits,
	// lookup_stale_chunks and lookup_duration_seconds.
	RecordLookup(ctx context.Context, r metrics.LookupRecord)
	// ObserveFingerprintMatch: fingerprint_match_duration_seconds.
	ObserveFingerprintMatch(ctx context.Context, d time.Duration)
	// ObserveSparsePrefetch: sparse_prefetch_duration_seconds.
	ObserveSparsePrefetch(ctx context.Context, d time.Duration)
	// RecordRetrieve: retrieve_requests, retrieve_failures (when failed),
	// retrieve_duration_seconds.
	RecordRetrieve(ctx context.Context, d time.Duration, failed bool)
	// RecordScatter: scattered_tokens and scatter_duration_seconds.
	RecordScatter(ctx context.Context, d time.Duration, tokens int)
	// RecordStore: store_requests and stored_chunks.
	RecordStore(chunks int)
}

// L2ThroughputSink receives coalesced L2 loads; *metrics.BlendMetrics
// implements it (l2_read_bytes and l2_load_throughput_gbps, bytes / 10⁹ / s).
// Called from the bus's drain goroutine; it returns nothing, as MetricsSink.
type L2ThroughputSink interface {
	RecordL2Load(bytes int64, d time.Duration)
}

var (
	_ MetricsSink      = (*metrics.BlendMetrics)(nil)
	_ L2ThroughputSink = (*metrics.BlendMetrics)(nil)
)

// SubscriberStats are the counters of [MetricsSubscriber] and
// [L2ThroughputSubscriber].
type SubscriberStats struct {
	// Pending is the number of STARTs waiting for their END.
	Pending int64
	// Unpaired counts END events recorded nothing because their START was
	// not seen (dropped, or forgotten after DefaultSpanTTL) or came later
	// than the END.
	Unpaired uint64
}

// pairKey identifies an open START within a subscriber.
type pairKey struct {
	start  EventType
	req    string
	copyID uint64
}

type pendingStart struct {
	at    time.Time
	sc    trace.SpanContext // valid and sampled, or zero
	bytes int64             // bytes announced by an L2_LOAD_TASK_START
}

// pairs pairs START and END events by (type, request, copy) and forgets
// STARTs older than DefaultSpanTTL on sweep. Its map is used by the drain
// goroutine only; the counters are atomic.
type pairs struct {
	m        map[pairKey]pendingStart
	pending  atomic.Int64
	unpaired atomic.Uint64
}

func (p *pairs) put(k pairKey, v pendingStart) {
	if p.m == nil {
		p.m = make(map[pairKey]pendingStart)
	}
	if _, dup := p.m[k]; !dup {
		p.pending.Add(1)
	}
	p.m[k] = v
}

// take returns and forgets the START of k with the time from it to end.
// A missing START, or one later than end, counts as unpaired.
func (p *pairs) take(k pairKey, end time.Time) (pendingStart, time.Duration, bool) {
	v, ok := p.m[k]
	if !ok {
		p.unpaired.Add(1)
		return v, 0, false
	}
	delete(p.m, k)
	p.pending.Add(-1)
	d := end.Sub(v.at)
	if d < 0 {
		p.unpaired.Add(1)
		return v, 0, false
	}
	return v, d, true
}

func (p *pairs) sweep(now time.Time) {
	for k, v := range p.m {
		if now.Sub(v.at) >= DefaultSpanTTL {
			delete(p.m, k)
			p.pending.Add(-1)
		}
	}
}

func (p *pairs) stats() SubscriberStats {
	return SubscriberStats{Pending: p.pending.Load(), Unpaired: p.unpaired.Load()}
}

// MetricsSubscriber is the [Subscriber] that turns event pairs into the
// lmcache_blend_* counters and duration histograms through a [MetricsSink]:
// one record per END (CB_LOOKUP_END, CB_FINGERPRINT_MATCH_END,
// CB_SPARSE_PREFETCH_END, CB_RETRIEVE_END, CB_SCATTER_END, CB_STORE_END),
// with the duration from the START of the same request and CopyID. An END
// whose START was not seen records nothing (see SubscriberStats.Unpaired);
// CB_STORE_END needs no START. A START whose END has not come after
// [DefaultSpanTTL] is forgotten on the next [Tick].
//
// HandleEvent must be called from one goroutine at a time (the bus's drain
// goroutine); Stats is safe for concurrent use.
type MetricsSubscriber struct {
	sink  MetricsSink
	pairs pairs
}

// NewMetricsSubscriber returns a metrics subscriber writing to sink
// (typically a *metrics.BlendMetrics).
func NewMetricsSubscriber(sink MetricsSink) (*MetricsSubscriber, error) {
	if sink == nil {
		return nil, errors.New("new metrics subscriber: nil sink")
	}
	return &MetricsSubscriber{sink: sink}, nil
}

// EventTypes returns the event types the subscriber handles. Register it
// with bus.Subscribe(s, s.EventTypes()...).
func (s *MetricsSubscriber) EventTypes() []EventType {
	return []EventType{
		LookupStart, LookupEnd, FingerprintMatchStart, FingerprintMatchEnd,
		SparsePrefetchStart, SparsePrefetchEnd, RetrieveStart, RetrieveEnd,
		ScatterStart, ScatterEnd, StoreEnd, Tick,
	}
}

// Stats returns the subscriber's counters. It is safe for concurrent use.
func (s *MetricsSubscriber) Stats() SubscriberStats { return s.pairs.stats() }

// HandleEvent implements [Subscriber].
func (s *MetricsSubscriber) HandleEvent(ev Event) {
	switch ev.Type {
	case Tick:
		s.pairs.sweep(ev.Time)
	case LookupStart, RetrieveStart:
		s.pairs.put(pairKey{ev.Type, ev.RequestID, ev.CopyID}, pendingStart{at: ev.Time, sc: sampledContext(ev.TraceContext)})
	case FingerprintMatchStart, SparsePrefetchStart, ScatterStart:
		// These carry no trace context: take the enclosing lookup's or
		// retrieve's, while it is open.
		outer := LookupStart
		if ev.Type == ScatterStart {
			outer = RetrieveStart
		}
		sc := s.pairs.m[pairKey{outer, ev.RequestID, 0}].sc
		s.pairs.put(pairKey{ev.Type, ev.RequestID, ev.CopyID}, pendingStart{at: ev.Time, sc: sc})
	case StoreEnd:
		s.sink.RecordStore(int(intAttr(&ev, AttrStoredChunks)))
	case LookupEnd, FingerprintMatchEnd, SparsePrefetchEnd, RetrieveEnd, ScatterEnd:
		start, d, ok := s.pairs.take(pairKey{ev.Type.Pair(), ev.RequestID, ev.CopyID}, ev.Time)
		if !ok {
			return
		}
		ctx := exemplarContext(start.sc)
		switch ev.Type {
		case LookupEnd:
			s.sink.RecordLookup(ctx, metrics.LookupRecord{
				Duration:           d,
				RequestedTokens:    int(intAttr(&ev, AttrRequestedTokens)),
				PrefixHitTokens:    int(intAttr(&ev, AttrPrefixHitTokens)),
				NonPrefixHitTokens: int(intAttr(&ev, AttrNonPrefixHitTokens)),
				FingerprintHits:    int(intAttr(&ev, AttrFingerprintHits)),
				StorageHits:        int(intAttr(&ev, AttrStorageHits)),
				StaleChunks:        int(intAttr(&ev, AttrStaleChunks)),
			})
		case FingerprintMatchEnd:
			s.sink.ObserveFingerprintMatch(ctx, d)
		case SparsePrefetchEnd:
			s.sink.ObserveSparsePrefetch(ctx, d)
		case RetrieveEnd:
			s.sink.RecordRetrieve(ctx, d, ev.Err != nil)
		case ScatterEnd:
			s.sink.RecordScatter(ctx, d, int(intAttr(&ev, AttrScatteredTokens)))
		}
	}
}

// L2ThroughputSubscriber is the [Subscriber] that turns each L2_LOAD_TASK
// START/END pair (same request and CopyID) into one L2 load record: the
// END's bytes attribute (or the START's, when the END has none) and the time
// between the two events; the sink derives GB/s. Pairs without bytes record
// nothing. A START whose END has not come after [DefaultSpanTTL] is
// forgotten on the next [Tick].
//
// HandleEvent must be called from one goroutine at a time (the bus's drain
// goroutine); Stats is safe for concurrent use.
type L2ThroughputSubscriber struct {
	sink  L2ThroughputSink
	pairs pairs
}

// NewL2ThroughputSubscriber returns an L2 throughput subscriber writing to
// sink (typically a *metrics.BlendMetrics).
func NewL2ThroughputSubscriber(sink L2ThroughputSink) (*L2ThroughputSubscriber, error) {
	if sink == nil {
		return nil, errors.New("new L2 throughput subscriber: nil sink")
	}
	return &L2ThroughputSubscriber{sink: sink}, nil
}

// EventTypes returns L2LoadTaskStart, L2LoadTaskEnd and Tick.
func (s *L2ThroughputSubscriber) EventTypes() []EventType {
	return []EventType{L2LoadTaskStart, L2LoadTaskEnd, Tick}
}

// Stats returns the subscriber's counters. It is safe for concurrent use.
func (s *L2ThroughputSubscriber) Stats() SubscriberStats { return s.pairs.stats() }

// HandleEvent implements [Subscriber].
func (s *L2ThroughputSubscriber) HandleEvent(ev Event) {
	switch ev.Type {
	case Tick:
		s.pairs.sweep(ev.Time)
	case L2LoadTaskStart:
		s.pairs.put(pairKey{L2LoadTaskStart, ev.RequestID, ev.CopyID}, pendingStart{at: ev.Time, bytes: intAttr(&ev, AttrBytes)})
	case L2LoadTaskEnd:
		start, d, ok := s.pairs.take(pairKey{L2LoadTaskStart, ev.RequestID, ev.CopyID}, ev.Time)
		if !ok {
			return
		}
		b := intAttr(&ev, AttrBytes)
		if b <= 0 {
			b = start.bytes
		}
		if b <= 0 {
			return
		}
		s.sink.RecordL2Load(b, d)
	}
}

// intAttr returns the attribute key of ev as an int64 (a float is
// truncated), or 0 when it is missing or not a number.
func intAttr(ev *Event, key attribute.Key) int64 {
	v, ok := ev.Attr(key)
	if !ok {
		return 0
	}
	switch v.Type() {
	case attribute.INT64:
		return v.AsInt64()
	case attribute.FLOAT64:
		return int64(v.AsFloat64())
	}
	return 0
}

// sampledContext returns the span context of traceparent s when it is
// valid and sampled, else the zero SpanContext.
func sampledContext(s string) trace.SpanContext {
	sc := parseTraceContext(s, "")
	if !sc.IsValid() || !sc.IsSampled() {
		return trace.SpanContext{}
	}
	return sc
}

func exemplarContext(sc trace.SpanContext) context.Context {
	if !sc.IsValid() {
		return context.Background()
	}
	return trace.ContextWithRemoteSpanContext(context.Background(), sc)
}
