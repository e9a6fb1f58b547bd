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

	inflight inflight // the stores not registered yet, for the lookups that would find them
	arrivals arrivals // the rank-0 stores that reached the server, for the lookups of their engine

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
	c.inflight = inflight{window: cfg.FingerprintWindow, spaces: make(map[string]*pendingSpace)}
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

// inflight tracks the rank-0 stores in flight: from the start of a store
// until its sequence is registered in its fingerprint table (or its
// registration failed or was dropped), so that a lookup arriving meanwhile
// can wait for the ones it would match instead of missing them. Safe for
// concurrent use.
type inflight struct {
	window int // the fingerprint window of the tables it builds

	mu     sync.Mutex
	spaces map[string]*pendingSpace // per key space
}

// pendingSpace is the stores in flight of one key space, and the
// fingerprint table of their sequences (built by the first lookup after a
// change; nil until then).
type pendingSpace struct {
	stores map[*pendingStore]struct{}
	snap   *pendingSnapshot
}

// pendingStore is one store in flight. done is closed once its sequence is
// registered (or will not be).
type pendingStore struct {
	ns   string
	seq  fingerprint.Sequence
	done chan struct{}
	once sync.Once
}

// pendingSnapshot is a fingerprint table of the sequences of a key space's
// stores in flight; owners[i] is the store of the table's registration i+1.
// Immutable once built.
type pendingSnapshot struct {
	table  *fingerprint.Table
	owners []*pendingStore
}

// owner returns the store of a match of the snapshot's table.
func (p *pendingSnapshot) owner(m fingerprint.Match) *pendingStore {
	if m.Sequence == 0 || m.Sequence > uint64(len(p.owners)) {
		return nil
	}
	return p.owners[m.Sequence-1]
}

// begin records a store of seq in key space ns as in flight; end it once
// its registration is decided.
func (f *inflight) begin(ns string, seq fingerprint.Sequence) *pendingStore {
	p := &pendingStore{ns: ns, seq: seq, done: make(chan struct{})}
	f.mu.Lock()
	defer f.mu.Unlock()
	sp := f.spaces[ns]
	if sp == nil {
		sp = &pendingSpace{stores: make(map[*pendingStore]struct{})}
		f.spaces[ns] = sp
	}
	sp.stores[p] = struct{}{}
	sp.snap = nil
	return p
}

// end marks p registered (or given up): lookups waiting for it go on.
// Idempotent; nil is a no-op.
func (f *inflight) end(p *pendingStore) {
	if p == nil {
		return
	}
	p.once.Do(func() {
		f.mu.Lock()
		if sp := f.spaces[p.ns]; sp != nil {
			delete(sp.stores, p)
			sp.snap = nil
			if len(sp.stores) == 0 {
				delete(f.spaces, p.ns)
			}
		}
		f.mu.Unlock()
		close(p.done)
	})
}

// snapshot returns the fingerprint table of key space ns's stores in
// flight, or nil when there are none. The table is built once per change of
// the set (under the lock: a handful of sequences, hashed once each).
func (f *inflight) snapshot(ns string) *pendingSnapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	sp := f.spaces[ns]
	if sp == nil || len(sp.stores) == 0 {
		return nil
	}
	if sp.snap == nil {
		snap := &pendingSnapshot{table: fingerprint.NewTable(fingerprint.Config{Window: f.window})}
		for p := range sp.stores {
			if _, err := snap.table.Register(p.seq); err == nil {
				snap.owners = append(snap.owners, p) // registration ids count from 1
			}
		}
		sp.snap = snap
	}
	return sp.snap
}

// inFlight counts the stores in flight (for tests and health).
func (f *inflight) inFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, sp := range f.spaces {
		n += len(sp.stores)
	}
	return n
}
