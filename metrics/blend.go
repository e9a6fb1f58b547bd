package metrics

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cacheblend/cacheblend/contract"
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

// BlendMetrics records every lmcache_blend_* instrument of the contract (cb-blend). Every
// series is resolved by NewBlendMetrics. Duration methods take a context: a sampled span
// context in it becomes an exemplar (a nil context records none). The record methods return
// nothing; a record they cannot take (negative counts or durations, running totals going
// down, a Tier that is not a constant) is refused whole — nothing recorded, counted in
// Registry().RecordStats(), reported to Config.OnRefused — as described on Registry. Safe for
// concurrent use.
type BlendMetrics struct {
	facade
	lookup   blendLookup
	transfer blendTransfer
	storage  blendStorage
	bus      eventBus
	remote   remoteSeries
}

// blendLookup measures the unified lookup: requests, tokens asked for and found per leg,
// fingerprint and storage hits, stale chunks, and the durations of the lookup and its phases.
type blendLookup struct {
	requests, requested, hitPrefix, hitNonPrefix *series
	fingerprintHits, storageHits, staleChunks    *series
	duration, fingerprintDur, prefetchDur        *HistogramSeries
}

// blendTransfer measures KV moving between the server and the workers: retrieves, the scatter
// into worker KV memory, and stores.
type blendTransfer struct {
	retrieves, retrieveFailures, scattered, stores, storedChunks *series
	retrieveDur, scatterDur                                      *HistogramSeries
}

// blendStorage measures what the server holds: L1 and the fingerprint table, evictions per
// tier, and L2 reads.
type blendStorage struct {
	l1Bytes, l1Chunks, fingerprints, unregistered *series
	evicted                                       enumSeries // one series per Tier
	l2Corrupt, l2ReadBytes                        *series
	l2Throughput                                  *HistogramSeries
}

// eventBus measures the event bus's published and dropped events.
type eventBus struct {
	mu                 sync.Mutex // serialises SetEventBusTotals so both totals are checked before either moves
	published, dropped *series
}

// NewBlendMetrics registers the blend server's contract instruments on reg and resolves all
// their series (one per Tier and per hit leg); a contract that lacks one of them is an error
// here. Options: WithContract (default: the embedded contract), WithLabelCap, WithOnRefused
// (default: refusals are only counted).
func NewBlendMetrics(reg prometheus.Registerer, opts ...Option) (*BlendMetrics, error) {
	return newFacade("blend", reg, opts, func(b *builder) *BlendMetrics {
		return &BlendMetrics{
			facade: facade{b.r},
			lookup: blendLookup{
				requests:        b.counterSeries("lmcache_blend_lookup_requests_total"),
				requested:       b.counterSeries("lmcache_blend_lookup_requested_tokens_total"),
				hitPrefix:       b.counterSeries("lmcache_blend_lookup_hit_tokens_total", "prefix"),
				hitNonPrefix:    b.counterSeries("lmcache_blend_lookup_hit_tokens_total", "non_prefix"),
				fingerprintHits: b.counterSeries("lmcache_blend_lookup_fingerprint_hits_total"),
				storageHits:     b.counterSeries("lmcache_blend_lookup_storage_hits_total"),
				staleChunks:     b.counterSeries("lmcache_blend_lookup_stale_chunks_total"),
				duration:        b.histogramSeries("lmcache_blend_lookup_duration_seconds"),
				fingerprintDur:  b.histogramSeries("lmcache_blend_fingerprint_match_duration_seconds"),
				prefetchDur:     b.histogramSeries("lmcache_blend_sparse_prefetch_duration_seconds"),
			},
			transfer: blendTransfer{
				retrieves:        b.counterSeries("lmcache_blend_retrieve_requests_total"),
				retrieveFailures: b.counterSeries("lmcache_blend_retrieve_failures_total"),
				scattered:        b.counterSeries("lmcache_blend_scattered_tokens_total"),
				stores:           b.counterSeries("lmcache_blend_store_requests_total"),
				storedChunks:     b.counterSeries("lmcache_blend_stored_chunks_total"),
				retrieveDur:      b.histogramSeries("lmcache_blend_retrieve_duration_seconds"),
				scatterDur:       b.histogramSeries("lmcache_blend_scatter_duration_seconds"),
			},
			storage: blendStorage{
				l1Bytes:      b.gaugeSeries("lmcache_blend_l1_bytes"),
				l1Chunks:     b.gaugeSeries("lmcache_blend_l1_chunks"),
				fingerprints: b.gaugeSeries("lmcache_blend_fingerprints"),
				unregistered: b.counterSeries("lmcache_blend_fingerprints_unregistered_total"),
				evicted:      b.enum(contract.Counter, "lmcache_blend_chunks_evicted_total", tierNames[:]),
				l2Corrupt:    b.counterSeries("lmcache_blend_l2_corrupt_chunks_total"),
				l2ReadBytes:  b.counterSeries("lmcache_blend_l2_read_bytes_total"),
				l2Throughput: b.histogramSeries("lmcache_blend_l2_load_throughput_gbps"),
			},
			bus: eventBus{
				published: b.counterSeries("lmcache_blend_event_bus_published_total"),
				dropped:   b.counterSeries("lmcache_blend_event_bus_dropped_total"),
			},
			remote: newRemoteSeries(b),
		}
	})
}

// RecordLookup records one unified lookup: the request, hit tokens per leg, requested tokens,
// fingerprint hits, storage hits, stale chunks and the lookup duration. A negative value
// refuses the record (ErrNegative; see Registry).
func (m *BlendMetrics) RecordLookup(ctx context.Context, r LookupRecord) {
	if r.Duration < 0 || r.PrefixHitTokens < 0 || r.NonPrefixHitTokens < 0 || r.RequestedTokens < 0 ||
		r.FingerprintHits < 0 || r.StorageHits < 0 || r.StaleChunks < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: lookup record %+v: %w", r, ErrNegative))
		return
	}
	l := &m.lookup
	l.requests.counter.Inc()
	l.hitPrefix.counter.Add(float64(r.PrefixHitTokens))
	l.hitNonPrefix.counter.Add(float64(r.NonPrefixHitTokens))
	l.requested.counter.Add(float64(r.RequestedTokens))
	l.fingerprintHits.counter.Add(float64(r.FingerprintHits))
	l.storageHits.counter.Add(float64(r.StorageHits))
	l.staleChunks.counter.Add(float64(r.StaleChunks))
	l.duration.ObserveContext(ctx, r.Duration.Seconds())
}

// ObserveFingerprintMatch records the duration of a lookup's fingerprint match; a negative d
// is refused (see Registry).
func (m *BlendMetrics) ObserveFingerprintMatch(ctx context.Context, d time.Duration) {
	m.lookup.fingerprintDur.ObserveContext(ctx, d.Seconds())
}

// ObserveSparsePrefetch records the duration of a lookup's sparse prefetch; a negative d is
// refused (see Registry).
func (m *BlendMetrics) ObserveSparsePrefetch(ctx context.Context, d time.Duration) {
	m.lookup.prefetchDur.ObserveContext(ctx, d.Seconds())
}

// RecordL2Load records one coalesced L2 read: the bytes read, and its throughput in GB/s
// (bytes / 1e9 / seconds) when d is positive. Negative bytes or d refuse the record (see
// Registry).
func (m *BlendMetrics) RecordL2Load(bytes int64, d time.Duration) {
	if bytes < 0 || d < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: l2 load of %d bytes in %v: %w", bytes, d, ErrNegative))
		return
	}
	m.storage.l2ReadBytes.counter.Add(float64(bytes))
	if d > 0 {
		m.storage.l2Throughput.Observe(float64(bytes) / 1e9 / d.Seconds())
	}
}

// AddL2CorruptChunks counts L2 chunk files that failed their integrity check; a negative n is
// refused (see Registry).
func (m *BlendMetrics) AddL2CorruptChunks(n int) { m.addInt(m.storage.l2Corrupt, n) }

// RecordRetrieve records one retrieve call: the request, its failure if failed, and its
// duration. A negative d refuses the record (see Registry).
func (m *BlendMetrics) RecordRetrieve(ctx context.Context, d time.Duration, failed bool) {
	if d < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: retrieve in %v: %w", d, ErrNegative))
		return
	}
	m.transfer.retrieves.counter.Inc()
	if failed {
		m.transfer.retrieveFailures.counter.Inc()
	}
	m.transfer.retrieveDur.ObserveContext(ctx, d.Seconds())
}

// RecordScatter records one scatter into worker KV memory: the tokens written and its
// duration. Negative tokens or d refuse the record (see Registry).
func (m *BlendMetrics) RecordScatter(ctx context.Context, d time.Duration, tokens int) {
	if tokens < 0 || d < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: scatter of %d tokens in %v: %w", tokens, d, ErrNegative))
		return
	}
	m.transfer.scattered.counter.Add(float64(tokens))
	m.transfer.scatterDur.ObserveContext(ctx, d.Seconds())
}

// RecordStore records one store call and the chunks it wrote; negative chunks refuse the
// record (see Registry).
func (m *BlendMetrics) RecordStore(chunks int) {
	if chunks < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: store of %d chunks: %w", chunks, ErrNegative))
		return
	}
	m.transfer.stores.counter.Inc()
	m.transfer.storedChunks.counter.Add(float64(chunks))
}

// AddFingerprintsUnregistered counts fingerprints removed from the table; a negative n is
// refused (see Registry).
func (m *BlendMetrics) AddFingerprintsUnregistered(n int) { m.addInt(m.storage.unregistered, n) }

// AddChunksEvicted counts chunks evicted from tier. A negative n, or a tier that is not a Tier
// constant, is refused (see Registry).
func (m *BlendMetrics) AddChunksEvicted(tier Tier, n int) {
	if s := pick(m.storage.evicted, tier); s != nil {
		m.addInt(s, n)
	}
}

// SetEventBusTotals advances the event-bus counters to the bus's running totals of published
// and dropped events (call before each scrape). A total lower than the previous one refuses
// the pair — neither counter moves (ErrCounterDecrease; see Registry).
func (m *BlendMetrics) SetEventBusTotals(published, dropped uint64) {
	m.bus.mu.Lock()
	err := setTotals(runningTotal{m.bus.dropped, dropped}, runningTotal{m.bus.published, published})
	m.bus.mu.Unlock()
	m.reg.sink.refuseErr(err)
}

// SetStorage sets the storage gauges from a snapshot; a negative value refuses the snapshot
// (see Registry).
func (m *BlendMetrics) SetStorage(s StorageStats) {
	if s.L1Bytes < 0 || s.L1Chunks < 0 || s.Fingerprints < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: storage stats %+v: %w", s, ErrNegative))
		return
	}
	m.storage.l1Bytes.gauge.Set(float64(s.L1Bytes))
	m.storage.l1Chunks.gauge.Set(float64(s.L1Chunks))
	m.storage.fingerprints.gauge.Set(float64(s.Fingerprints))
}

// addInt adds n to the counter series s; a negative n is refused.
func (m *BlendMetrics) addInt(s *series, n int) {
	if n < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: %s: increment %d: %w", s.name, n, ErrNegative))
		return
	}
	s.counter.Add(float64(n))
}
