package metrics

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LookupRecord is one finished unified lookup for BlendMetrics.RecordLookup.
type LookupRecord struct {
	// Duration is the lookup's wall time on the server.
	Duration time.Duration
	// PrefixHitTokens and NonPrefixHitTokens are the tokens found by each leg (disjoint).
	PrefixHitTokens, NonPrefixHitTokens int
	// RequestedTokens is the prompt length asked for.
	RequestedTokens int
	// FingerprintHits counts verified fingerprint table hits.
	FingerprintHits int
	// StorageHits counts matched chunks found in storage; StaleChunks those whose fingerprint
	// hit but whose storage missed.
	StorageHits, StaleChunks int
}

// StorageStats is the blend server's storage snapshot for BlendMetrics.SetStorage.
type StorageStats struct {
	// L1Bytes and L1Chunks are held in L1 memory; Fingerprints are registered in the table.
	L1Bytes, L1Chunks, Fingerprints int64
}

// BlendMetrics records every lmcache_blend_* instrument of the contract (cb-blend). Duration
// methods take a context: a sampled span context in it becomes an exemplar. Safe for
// concurrent use.
type BlendMetrics struct {
	reg *Registry

	lookupRequests, lookupRequested, fingerprintHits, storageHits, staleChunks *series
	hitPrefix, hitNonPrefix                                                    *series
	unregistered, retrieveRequests, retrieveFailures, scattered                *series
	storeRequests, storedChunks, l2Corrupt, l2ReadBytes                        *series
	busPublished, busDropped                                                   *series
	evicted                                                                    *Counter

	l1Bytes, l1Chunks, fingerprints *series

	lookupDur, fingerprintDur, prefetchDur, retrieveDur, scatterDur *Histogram
	l2Throughput                                                    *series

	busMu sync.Mutex // serialises SetEventBusTotals so both totals are checked before either moves
}

// NewBlendMetrics registers the blend server's contract instruments on reg. Options:
// WithContract, WithLabelCap.
func NewBlendMetrics(reg prometheus.Registerer, opts ...Option) (*BlendMetrics, error) {
	r, err := newFacadeRegistry("blend", reg, opts)
	if err != nil {
		return nil, err
	}
	b := &builder{r: r}
	m := &BlendMetrics{
		reg:              r,
		lookupRequests:   b.counterSeries("lmcache_blend_lookup_requests_total"),
		hitPrefix:        b.counterSeries("lmcache_blend_lookup_hit_tokens_total", "prefix"),
		hitNonPrefix:     b.counterSeries("lmcache_blend_lookup_hit_tokens_total", "non_prefix"),
		lookupRequested:  b.counterSeries("lmcache_blend_lookup_requested_tokens_total"),
		fingerprintHits:  b.counterSeries("lmcache_blend_lookup_fingerprint_hits_total"),
		storageHits:      b.counterSeries("lmcache_blend_lookup_storage_hits_total"),
		staleChunks:      b.counterSeries("lmcache_blend_lookup_stale_chunks_total"),
		unregistered:     b.counterSeries("lmcache_blend_fingerprints_unregistered_total"),
		retrieveRequests: b.counterSeries("lmcache_blend_retrieve_requests_total"),
		retrieveFailures: b.counterSeries("lmcache_blend_retrieve_failures_total"),
		scattered:        b.counterSeries("lmcache_blend_scattered_tokens_total"),
		storeRequests:    b.counterSeries("lmcache_blend_store_requests_total"),
		storedChunks:     b.counterSeries("lmcache_blend_stored_chunks_total"),
		evicted:          b.counter("lmcache_blend_chunks_evicted_total"),
		l2Corrupt:        b.counterSeries("lmcache_blend_l2_corrupt_chunks_total"),
		l2ReadBytes:      b.counterSeries("lmcache_blend_l2_read_bytes_total"),
		busPublished:     b.counterSeries("lmcache_blend_event_bus_published_total"),
		busDropped:       b.counterSeries("lmcache_blend_event_bus_dropped_total"),
		l1Bytes:          b.gaugeSeries("lmcache_blend_l1_bytes"),
		l1Chunks:         b.gaugeSeries("lmcache_blend_l1_chunks"),
		fingerprints:     b.gaugeSeries("lmcache_blend_fingerprints"),
		lookupDur:        b.histogram("lmcache_blend_lookup_duration_seconds"),
		fingerprintDur:   b.histogram("lmcache_blend_fingerprint_match_duration_seconds"),
		prefetchDur:      b.histogram("lmcache_blend_sparse_prefetch_duration_seconds"),
		retrieveDur:      b.histogram("lmcache_blend_retrieve_duration_seconds"),
		scatterDur:       b.histogram("lmcache_blend_scatter_duration_seconds"),
	}
	if h := b.histogram("lmcache_blend_l2_load_throughput_gbps"); h != nil {
		m.l2Throughput = b.series(h.in, nil)
	}
	if b.err != nil {
		return nil, fmt.Errorf("metrics: blend: %w", b.err)
	}
	return m, nil
}

// Registry returns the registry the facade registers through.
func (m *BlendMetrics) Registry() *Registry { return m.reg }

// RecordLookup records one unified lookup: the request, hit tokens per leg, requested tokens,
// fingerprint hits, storage hits, stale chunks and the lookup duration. Negative values are
// refused with nothing recorded.
func (m *BlendMetrics) RecordLookup(ctx context.Context, r LookupRecord) error {
	if r.Duration < 0 || r.PrefixHitTokens < 0 || r.NonPrefixHitTokens < 0 || r.RequestedTokens < 0 ||
		r.FingerprintHits < 0 || r.StorageHits < 0 || r.StaleChunks < 0 {
		return fmt.Errorf("metrics: lookup record %+v: %w", r, ErrNegative)
	}
	m.lookupRequests.counter.Inc()
	m.hitPrefix.counter.Add(float64(r.PrefixHitTokens))
	m.hitNonPrefix.counter.Add(float64(r.NonPrefixHitTokens))
	m.lookupRequested.counter.Add(float64(r.RequestedTokens))
	m.fingerprintHits.counter.Add(float64(r.FingerprintHits))
	m.storageHits.counter.Add(float64(r.StorageHits))
	m.staleChunks.counter.Add(float64(r.StaleChunks))
	return m.lookupDur.ObserveContext(ctx, r.Duration.Seconds())
}

// ObserveFingerprintMatch records the duration of a lookup's fingerprint match.
func (m *BlendMetrics) ObserveFingerprintMatch(ctx context.Context, d time.Duration) error {
	return m.fingerprintDur.ObserveContext(ctx, d.Seconds())
}

// ObserveSparsePrefetch records the duration of a lookup's sparse prefetch.
func (m *BlendMetrics) ObserveSparsePrefetch(ctx context.Context, d time.Duration) error {
	return m.prefetchDur.ObserveContext(ctx, d.Seconds())
}

// RecordL2Load records one coalesced L2 read: the bytes read, and its throughput in GB/s
// (bytes / 1e9 / seconds) when d is positive.
func (m *BlendMetrics) RecordL2Load(bytes int64, d time.Duration) error {
	if bytes < 0 || d < 0 {
		return fmt.Errorf("metrics: l2 load of %d bytes in %v: %w", bytes, d, ErrNegative)
	}
	m.l2ReadBytes.counter.Add(float64(bytes))
	if d > 0 {
		m.l2Throughput.obs.Observe(float64(bytes) / 1e9 / d.Seconds())
	}
	return nil
}

// AddL2CorruptChunks counts L2 chunk files that failed their integrity check.
func (m *BlendMetrics) AddL2CorruptChunks(n int) error { return addInt(m.l2Corrupt, n) }

// RecordRetrieve records one retrieve call: the request, its failure if failed, and its
// duration.
func (m *BlendMetrics) RecordRetrieve(ctx context.Context, d time.Duration, failed bool) error {
	if err := checkValue("lmcache_blend_retrieve_duration_seconds", d.Seconds(), false); err != nil {
		return err
	}
	m.retrieveRequests.counter.Inc()
	if failed {
		m.retrieveFailures.counter.Inc()
	}
	return m.retrieveDur.ObserveContext(ctx, d.Seconds())
}

// RecordScatter records one scatter into worker KV memory: the tokens written and its
// duration.
func (m *BlendMetrics) RecordScatter(ctx context.Context, d time.Duration, tokens int) error {
	if tokens < 0 || d < 0 {
		return fmt.Errorf("metrics: scatter of %d tokens in %v: %w", tokens, d, ErrNegative)
	}
	m.scattered.counter.Add(float64(tokens))
	return m.scatterDur.ObserveContext(ctx, d.Seconds())
}

// RecordStore records one store call and the chunks it wrote.
func (m *BlendMetrics) RecordStore(chunks int) error {
	if chunks < 0 {
		return fmt.Errorf("metrics: store of %d chunks: %w", chunks, ErrNegative)
	}
	m.storeRequests.counter.Inc()
	m.storedChunks.counter.Add(float64(chunks))
	return nil
}

// AddFingerprintsUnregistered counts fingerprints removed from the table.
func (m *BlendMetrics) AddFingerprintsUnregistered(n int) error { return addInt(m.unregistered, n) }

// AddChunksEvicted counts chunks evicted from a tier, "l1" or "l2".
func (m *BlendMetrics) AddChunksEvicted(tier string, n int) error {
	return m.evicted.Add(float64(n), tier)
}

// SetEventBusTotals advances the event-bus counters to the bus's running totals of published
// and dropped events (call before each scrape); lower totals are refused (ErrCounterDecrease).
func (m *BlendMetrics) SetEventBusTotals(published, dropped uint64) error {
	m.busMu.Lock()
	defer m.busMu.Unlock()
	if err := m.busDropped.checkTotal("lmcache_blend_event_bus_dropped_total", float64(dropped)); err != nil {
		return err
	}
	if err := m.busPublished.checkTotal("lmcache_blend_event_bus_published_total", float64(published)); err != nil {
		return err
	}
	if err := m.busDropped.setTotal("lmcache_blend_event_bus_dropped_total", float64(dropped)); err != nil {
		return err
	}
	return m.busPublished.setTotal("lmcache_blend_event_bus_published_total", float64(published))
}

// SetStorage sets the storage gauges from a snapshot; negative values are refused.
func (m *BlendMetrics) SetStorage(s StorageStats) error {
	if s.L1Bytes < 0 || s.L1Chunks < 0 || s.Fingerprints < 0 {
		return fmt.Errorf("metrics: storage stats %+v: %w", s, ErrNegative)
	}
	m.l1Bytes.gauge.Set(float64(s.L1Bytes))
	m.l1Chunks.gauge.Set(float64(s.L1Chunks))
	m.fingerprints.gauge.Set(float64(s.Fingerprints))
	return nil
}

func addInt(s *series, n int) error {
	if n < 0 {
		return fmt.Errorf("metrics: increment %d: %w", n, ErrNegative)
	}
	s.counter.Add(float64(n))
	return nil
}
