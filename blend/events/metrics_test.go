package events

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/metrics"
)

// sinkLog records the calls a MetricsSink / L2ThroughputSink receives.
type sinkLog struct {
	lookups   []metrics.LookupRecord
	durations map[string][]time.Duration
	contexts  map[string][]trace.SpanContext
	retrieves []bool
	scattered []int
	stores    []int
	l2        [][2]int64 // bytes, ns
}

func newSinkLog() *sinkLog {
	return &sinkLog{durations: map[string][]time.Duration{}, contexts: map[string][]trace.SpanContext{}}
}

func (l *sinkLog) obs(op string, ctx context.Context, d time.Duration) {
	l.durations[op] = append(l.durations[op], d)
	l.contexts[op] = append(l.contexts[op], trace.SpanContextFromContext(ctx))
}
func (l *sinkLog) RecordLookup(ctx context.Context, r metrics.LookupRecord) {
	l.lookups = append(l.lookups, r)
	l.obs("lookup", ctx, r.Duration)
}
func (l *sinkLog) ObserveFingerprintMatch(ctx context.Context, d time.Duration) {
	l.obs("fingerprint_match", ctx, d)
}
func (l *sinkLog) ObserveSparsePrefetch(ctx context.Context, d time.Duration) {
	l.obs("sparse_prefetch", ctx, d)
}
func (l *sinkLog) RecordRetrieve(ctx context.Context, d time.Duration, failed bool) {
	l.retrieves = append(l.retrieves, failed)
	l.obs("retrieve", ctx, d)
}
func (l *sinkLog) RecordScatter(ctx context.Context, d time.Duration, tokens int) {
	l.scattered = append(l.scattered, tokens)
	l.obs("scatter", ctx, d)
}
func (l *sinkLog) RecordStore(chunks int) { l.stores = append(l.stores, chunks) }
func (l *sinkLog) RecordL2Load(bytes int64, d time.Duration) {
	l.l2 = append(l.l2, [2]int64{bytes, int64(d)})
}

// metricsSeq is one request: a lookup, a failed retrieve with two scatter
// copies (one ending after the retrieve), a store, and an unpaired END.
func metricsSeq(req string) []Event {
	evs := lookupSeq(req, traceparent(lookupTID, lookupSID, true), 0)
	failed := retrieveEnd(req, 10600)
	failed.Err = errors.New("boom")
	return append(evs,
		retrieveStart(req, traceparent(lookupTID, retrieveID, true), 10000),
		scatterStart(req, 1, 10010), scatterStart(req, 2, 10020),
		scatterEnd(req, 1, 10500, 700), failed, scatterEnd(req, 2, 10900, 512),
		Event{Type: StoreStart, RequestID: req, Time: at(11000)},
		Event{Type: StoreEnd, RequestID: req, Time: at(12000), Attrs: []attribute.KeyValue{AttrStoredChunks.Int(5)}},
		retrieveEnd("never-started", 13000),
	)
}

func TestMetricsSubscriber(t *testing.T) {
	log := newSinkLog()
	sub, err := NewMetricsSubscriber(log)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range metricsSeq("req-m") {
		sub.HandleEvent(ev)
	}
	want := metrics.LookupRecord{Duration: 2530 * time.Microsecond, RequestedTokens: 1500, PrefixHitTokens: 512,
		NonPrefixHitTokens: 700, FingerprintHits: 3, StorageHits: 4, StaleChunks: 0}
	if len(log.lookups) != 1 || log.lookups[0] != want {
		t.Errorf("lookups = %+v, want [%+v]", log.lookups, want)
	}
	if len(log.retrieves) != 1 || !log.retrieves[0] {
		t.Errorf("retrieves = %v, want [true] (the unpaired END records nothing)", log.retrieves)
	}
	if len(log.scattered) != 2 || log.scattered[0] != 700 || log.scattered[1] != 512 {
		t.Errorf("scattered = %v", log.scattered)
	}
	if len(log.stores) != 1 || log.stores[0] != 5 {
		t.Errorf("stores = %v", log.stores)
	}
	us := time.Microsecond
	durs := []struct {
		op     string
		want   []time.Duration
		parent string
	}{
		{"lookup", []time.Duration{2530 * us}, lookupSID},
		{"fingerprint_match", []time.Duration{400 * us}, lookupSID},
		{"sparse_prefetch", []time.Duration{2020 * us}, lookupSID},
		{"retrieve", []time.Duration{600 * us}, retrieveID},
		{"scatter", []time.Duration{490 * us, 880 * us}, retrieveID},
	}
	for _, d := range durs {
		t.Run(d.op, func(t *testing.T) {
			got := log.durations[d.op]
			if len(got) != len(d.want) {
				t.Fatalf("durations = %v, want %v", got, d.want)
			}
			for i := range got {
				if got[i] != d.want[i] {
					t.Errorf("duration %d = %v, want %v", i, got[i], d.want[i])
				}
				if sc := log.contexts[d.op][i]; sc.SpanID().String() != d.parent || sc.TraceID().String() != lookupTID || !sc.IsSampled() {
					t.Errorf("exemplar context = %s/%s, want %s/%s", sc.TraceID(), sc.SpanID(), lookupTID, d.parent)
				}
			}
		})
	}
	if st := sub.Stats(); st != (SubscriberStats{Unpaired: 1}) {
		t.Errorf("Stats = %+v, want 1 unpaired", st)
	}

	// A sampled-out context gives no exemplar.
	sub.HandleEvent(Event{Type: LookupStart, RequestID: "u", Time: at(0), TraceContext: traceparent(lookupTID, lookupSID, false)})
	sub.HandleEvent(Event{Type: LookupEnd, RequestID: "u", Time: at(5)})
	if sc := log.contexts["lookup"][1]; sc.IsValid() {
		t.Errorf("sampled-out lookup gave exemplar context %v", sc)
	}
	// A START without END is forgotten after the TTL.
	sub.HandleEvent(Event{Type: RetrieveStart, RequestID: "lost", Time: at(0)})
	sub.HandleEvent(Event{Type: Tick, Time: at(1)})
	if st := sub.Stats(); st.Pending != 1 {
		t.Errorf("Pending = %d before the TTL, want 1", st.Pending)
	}
	sub.HandleEvent(Event{Type: Tick, Time: at(0).Add(DefaultSpanTTL)})
	if st := sub.Stats(); st.Pending != 0 {
		t.Errorf("Pending = %d after the TTL, want 0", st.Pending)
	}
	// An END before its START is counted.
	sub.HandleEvent(Event{Type: FingerprintMatchStart, RequestID: "x", Time: at(10)})
	sub.HandleEvent(Event{Type: FingerprintMatchEnd, RequestID: "x", Time: at(5)})
	sub.HandleEvent(Event{Type: SparsePrefetchStart, RequestID: "x", Time: at(10)})
	sub.HandleEvent(Event{Type: SparsePrefetchEnd, RequestID: "x", Time: at(15)})
	if st := sub.Stats(); st.Unpaired != 2 {
		t.Errorf("Stats = %+v, want 2 unpaired", st)
	}
	if _, err := NewMetricsSubscriber(nil); err == nil {
		t.Error("nil sink accepted")
	}
}

func TestL2ThroughputSubscriber(t *testing.T) {
	ms := int64(time.Millisecond)
	tests := []struct {
		name string
		evs  []Event
		want [][2]int64
	}{
		{"bytes on end", []Event{
			{Type: L2LoadTaskStart, RequestID: "r", Time: t0},
			{Type: L2LoadTaskEnd, RequestID: "r", Time: t0.Add(500 * time.Millisecond), Attrs: []attribute.KeyValue{AttrBytes.Int64(1e9)}},
		}, [][2]int64{{1e9, 500 * ms}}},
		{"bytes on start", []Event{
			{Type: L2LoadTaskStart, RequestID: "r", Time: t0, Attrs: []attribute.KeyValue{AttrBytes.Int64(4e6)}},
			{Type: L2LoadTaskEnd, RequestID: "r", Time: t0.Add(time.Millisecond)},
		}, [][2]int64{{4e6, ms}}},
		{"copies paired by id", []Event{
			{Type: L2LoadTaskStart, RequestID: "r", CopyID: 1, Time: t0},
			{Type: L2LoadTaskStart, RequestID: "r", CopyID: 2, Time: t0.Add(time.Second)},
			{Type: L2LoadTaskEnd, RequestID: "r", CopyID: 2, Time: t0.Add(2 * time.Second), Attrs: []attribute.KeyValue{AttrBytes.Int64(7)}},
			{Type: L2LoadTaskEnd, RequestID: "r", CopyID: 1, Time: t0.Add(2 * time.Second), Attrs: []attribute.KeyValue{AttrBytes.Int64(9)}},
		}, [][2]int64{{7, 1000 * ms}, {9, 2000 * ms}}},
		{"no bytes", []Event{
			{Type: L2LoadTaskStart, RequestID: "r", Time: t0},
			{Type: L2LoadTaskEnd, RequestID: "r", Time: t0.Add(time.Second)},
		}, nil},
		{"unpaired end", []Event{
			{Type: L2LoadTaskEnd, RequestID: "r", Time: t0, Attrs: []attribute.KeyValue{AttrBytes.Int64(10)}},
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log := newSinkLog()
			sub, err := NewL2ThroughputSubscriber(log)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range tc.evs {
				sub.HandleEvent(ev)
			}
			if len(log.l2) != len(tc.want) {
				t.Fatalf("recorded %v, want %v", log.l2, tc.want)
			}
			for i := range tc.want {
				if log.l2[i] != tc.want[i] {
					t.Errorf("record %d = %v, want %v", i, log.l2[i], tc.want[i])
				}
			}
			if sub.Stats().Pending != 0 {
				t.Errorf("Pending = %d", sub.Stats().Pending)
			}
		})
	}
	sub, _ := NewL2ThroughputSubscriber(newSinkLog())
	sub.HandleEvent(Event{Type: L2LoadTaskStart, RequestID: "x", Time: t0})
	sub.HandleEvent(Event{Type: Tick, Time: t0.Add(DefaultSpanTTL)})
	if sub.Stats().Pending != 0 {
		t.Errorf("sweep kept %d pending", sub.Stats().Pending)
	}
	if _, err := NewL2ThroughputSubscriber(nil); err == nil {
		t.Error("nil sink accepted")
	}
}

// TestBlendMetricsThroughBus wires the real metrics.BlendMetrics into a
// fresh registry and checks the exposed values after a request's events went
// through the bus.
func TestBlendMetricsThroughBus(t *testing.T) {
	reg := prometheus.NewRegistry()
	bm, err := metrics.NewBlendMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	msub, err := NewMetricsSubscriber(bm)
	if err != nil {
		t.Fatal(err)
	}
	l2sub, err := NewL2ThroughputSubscriber(bm)
	if err != nil {
		t.Fatal(err)
	}
	bus := NewBus(Config{})
	for _, s := range []interface {
		Subscriber
		EventTypes() []EventType
	}{msub, l2sub} {
		if err := bus.Subscribe(s, s.EventTypes()...); err != nil {
			t.Fatal(err)
		}
	}
	bus.Start()
	for _, ev := range metricsSeq("req-real") {
		bus.Publish(ev)
	}
	if err := bus.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	bm.SetEventBusTotals(bus.Published(), bus.Dropped())

	const want = `
# HELP lmcache_blend_lookup_hit_tokens_total Prompt tokens found by unified lookups, by reuse leg.
# TYPE lmcache_blend_lookup_hit_tokens_total counter
lmcache_blend_lookup_hit_tokens_total{leg="non_prefix"} 700
lmcache_blend_lookup_hit_tokens_total{leg="prefix"} 512
# HELP lmcache_blend_lookup_requests_total Unified lookups served.
# TYPE lmcache_blend_lookup_requests_total counter
lmcache_blend_lookup_requests_total 1
# HELP lmcache_blend_lookup_requested_tokens_total Prompt tokens asked for by unified lookups.
# TYPE lmcache_blend_lookup_requested_tokens_total counter
lmcache_blend_lookup_requested_tokens_total 1500
# HELP lmcache_blend_retrieve_failures_total Retrieve calls that failed.
# TYPE lmcache_blend_retrieve_failures_total counter
lmcache_blend_retrieve_failures_total 1
# HELP lmcache_blend_retrieve_requests_total Retrieve calls served.
# TYPE lmcache_blend_retrieve_requests_total counter
lmcache_blend_retrieve_requests_total 1
# HELP lmcache_blend_scattered_tokens_total Tokens written into worker KV memory by retrieves.
# TYPE lmcache_blend_scattered_tokens_total counter
lmcache_blend_scattered_tokens_total 1212
# HELP lmcache_blend_stored_chunks_total Chunks written to storage by store calls.
# TYPE lmcache_blend_stored_chunks_total counter
lmcache_blend_stored_chunks_total 5
# HELP lmcache_blend_l2_read_bytes_total Bytes read from L2 storage.
# TYPE lmcache_blend_l2_read_bytes_total counter
lmcache_blend_l2_read_bytes_total 4.194304e+06
# HELP lmcache_blend_event_bus_published_total Events published on the blend server's event bus.
# TYPE lmcache_blend_event_bus_published_total counter
lmcache_blend_event_bus_published_total 21
`
	names := []string{
		"lmcache_blend_lookup_hit_tokens_total", "lmcache_blend_lookup_requests_total",
		"lmcache_blend_lookup_requested_tokens_total", "lmcache_blend_retrieve_failures_total",
		"lmcache_blend_retrieve_requests_total", "lmcache_blend_scattered_tokens_total",
		"lmcache_blend_stored_chunks_total", "lmcache_blend_l2_read_bytes_total",
		"lmcache_blend_event_bus_published_total",
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	hist := map[string]*dto.Histogram{}
	for _, mf := range families {
		if mf.GetType() == dto.MetricType_HISTOGRAM && len(mf.GetMetric()) == 1 {
			hist[mf.GetName()] = mf.GetMetric()[0].GetHistogram()
		}
	}
	checks := []struct {
		name  string
		count uint64
		sum   float64
	}{
		{"lmcache_blend_lookup_duration_seconds", 1, 2530e-6},
		{"lmcache_blend_fingerprint_match_duration_seconds", 1, 400e-6},
		{"lmcache_blend_sparse_prefetch_duration_seconds", 1, 2020e-6},
		{"lmcache_blend_retrieve_duration_seconds", 1, 600e-6},
		{"lmcache_blend_scatter_duration_seconds", 2, (490 + 880) * 1e-6},
		// 4 MiB in 2 ms = 2.097152 GB/s.
		{"lmcache_blend_l2_load_throughput_gbps", 1, float64(4<<20) / 1e9 / 2e-3},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			h := hist[c.name]
			if h == nil {
				t.Fatal("histogram not gathered")
			}
			if h.GetSampleCount() != c.count || math.Abs(h.GetSampleSum()-c.sum) > 1e-9 {
				t.Errorf("count %d sum %v, want %d %v", h.GetSampleCount(), h.GetSampleSum(), c.count, c.sum)
			}
		})
	}
	if st := msub.Stats(); st.Pending != 0 {
		t.Errorf("metrics subscriber Stats = %+v", st)
	}
	if st := bm.Registry().RecordStats(); st != (metrics.RecordStats{}) {
		t.Errorf("BlendMetrics refused records: %+v", st)
	}
}
