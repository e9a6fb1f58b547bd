package blend

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/metrics"
)

// chunks is the part of a Server that owns the stored chunks and what
// indexes them: the chunk store, the fleet tier, the fingerprint tables,
// the rank aliases and the fingerprint registrations. Its methods are safe
// for concurrent use.
type chunks struct {
	store   *chunkstore.Store
	fleet   *fleet.Tier // nil without a fleet tier
	logger  *slog.Logger
	metrics *metrics.BlendMetrics
	window  int // the fingerprint window of new tables

	tmu    sync.RWMutex
	tables map[string]*fingerprint.Table // per key space

	amu     sync.Mutex
	aliases map[aliasKey]chunkstore.Key // (rank-0 key, rank) -> that rank's key
	aliasOf map[chunkstore.Key]aliasKey // reverse, to forget on eviction

	regQ                chan func() // fingerprint registrations waiting for their goroutine
	regDone, regDropped atomic.Uint64

	syncMu                             sync.Mutex // serializes syncCounters
	lastL1Evict, lastL2Evict, lastCorr int64
}

type aliasKey struct {
	base chunkstore.Key
	rank int
}

// init builds the store and the fleet tier of cfg.
func (c *chunks) init(cfg Config, logger *slog.Logger, bm *metrics.BlendMetrics) error {
	c.logger, c.metrics, c.window = logger, bm, cfg.FingerprintWindow
	c.tables = make(map[string]*fingerprint.Table)
	c.aliases = make(map[aliasKey]chunkstore.Key)
	c.aliasOf = make(map[chunkstore.Key]aliasKey)
	c.regQ = make(chan func(), cfg.RegisterQueue)
	var err error
	if cfg.Fleet.URL != "" {
		if c.fleet, err = fleet.New(cfg.Fleet, logger); err != nil {
			return fmt.Errorf("blend: %w", err)
		}
	}
	c.store, err = chunkstore.New(chunkstore.Config{
		L1Bytes: cfg.L1Bytes, Dir: cfg.L2Dir, L2Bytes: cfg.L2Bytes, ChunkSize: cfg.ChunkSize, OnEvict: c.onEvict,
	})
	if err != nil {
		return fmt.Errorf("blend: chunk store: %w", err)
	}
	return nil
}

// table returns the fingerprint table of key space ns, creating it when
// create.
func (c *chunks) table(ns string, create bool) *fingerprint.Table {
	c.tmu.RLock()
	t := c.tables[ns]
	c.tmu.RUnlock()
	if t != nil || !create {
		return t
	}
	c.tmu.Lock()
	defer c.tmu.Unlock()
	if t = c.tables[ns]; t == nil {
		t = fingerprint.NewTable(fingerprint.Config{Window: c.window})
		c.tables[ns] = t
	}
	return t
}

func (c *chunks) tableList() []*fingerprint.Table {
	c.tmu.RLock()
	defer c.tmu.RUnlock()
	out := make([]*fingerprint.Table, 0, len(c.tables))
	for _, t := range c.tables {
		out = append(out, t)
	}
	return out
}

// onEvict is the chunk store's eviction callback: a chunk held by no tier
// any more gets a stale strike in the fingerprint tables (two strikes
// unregister it) and loses its rank alias.
func (c *chunks) onEvict(key chunkstore.Key, _ chunkstore.Tier, gone bool) {
	if !gone {
		return
	}
	c.amu.Lock()
	if a, ok := c.aliasOf[key]; ok {
		delete(c.aliasOf, key)
		if c.aliases[a] == key {
			delete(c.aliases, a)
		}
	}
	c.amu.Unlock()
	c.markStale(key)
}

// markStale gives key a stale strike in every table holding it and counts
// the fingerprints that this unregisters.
func (c *chunks) markStale(key chunkstore.Key) {
	for _, t := range c.tableList() {
		if t.MarkStale(key) {
			c.metrics.AddFingerprintsUnregistered(1)
		}
	}
}

// rankKey translates a rank-0 chunk key to rank's key.
func (c *chunks) rankKey(key chunkstore.Key, rank int) (chunkstore.Key, bool) {
	if rank == 0 {
		return key, true
	}
	c.amu.Lock()
	defer c.amu.Unlock()
	k, ok := c.aliases[aliasKey{key, rank}]
	return k, ok
}

// setAlias records that key is rank's chunk of the rank-0 chunk base.
func (c *chunks) setAlias(base, key chunkstore.Key, rank int) {
	c.amu.Lock()
	defer c.amu.Unlock()
	a := aliasKey{base, rank}
	if old, ok := c.aliases[a]; ok && old != key {
		delete(c.aliasOf, old)
	}
	c.aliases[a] = key
	c.aliasOf[key] = a
}

// onRank reports whether rank's chunk of the rank-0 chunk k is held.
func (c *chunks) onRank(k chunkstore.Key, rank int) bool {
	rk, ok := c.rankKey(k, rank)
	return ok && c.store.Present(rk)
}

// onAllRanks reports whether the chunk of rank-0 key k is held for every
// rank 1..ws-1 too.
func (c *chunks) onAllRanks(k chunkstore.Key, ws int) bool {
	for rank := 1; rank < ws; rank++ {
		if !c.onRank(k, rank) {
			return false
		}
	}
	return true
}

// syncCounters advances chunks_evicted{tier} and l2_corrupt_chunks to the
// chunk store's totals (budget evictions only; corrupt files count apart).
func (c *chunks) syncCounters() {
	st := c.store.Stats()
	c.syncMu.Lock()
	defer c.syncMu.Unlock()
	if d := st.L1Evictions - c.lastL1Evict; d > 0 {
		c.metrics.AddChunksEvicted(metrics.TierL1, int(d))
		c.lastL1Evict = st.L1Evictions
	}
	if d := st.L2Evictions - c.lastL2Evict; d > 0 {
		c.metrics.AddChunksEvicted(metrics.TierL2, int(d))
		c.lastL2Evict = st.L2Evictions
	}
	if d := st.Corrupt - c.lastCorr; d > 0 {
		c.metrics.AddL2CorruptChunks(int(d))
		c.lastCorr = st.Corrupt
	}
}

// fingerprints sums the live fingerprints and the chunks unregistered by
// stale strikes over every table.
func (c *chunks) fingerprints() (live int, stale int64) {
	for _, t := range c.tableList() {
		ts := t.Stats()
		live += ts.Fingerprints
		stale += ts.StaleUnregistered
	}
	return live, stale
}
