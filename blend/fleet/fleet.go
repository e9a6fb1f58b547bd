package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/reuseplan"
)

// Defaults of a zero Config (other than URL).
const (
	DefaultOpTimeout          = 250 * time.Millisecond
	DefaultCoordinatorTimeout = 20 * time.Millisecond
	DefaultWriteQueue         = 1024
	DefaultWriters            = 2
	DefaultRetryQueue         = 4096
	DefaultRetryMinBackoff    = 100 * time.Millisecond
	DefaultRetryMaxBackoff    = 5 * time.Second
	DefaultHealthMaxAge       = time.Second
	// MaxSequenceTokens bounds a directory sequence read back from Redis.
	MaxSequenceTokens = 1 << 20
)

// ErrTimeout is returned (wrapped) by a call that ran out of its time bound.
var ErrTimeout = errors.New("fleet: timed out")

// Config holds the settings of a Tier. URL is required; every other zero
// field takes its default. A Config is a plain value, read once by New.
type Config struct {
	// URL is the Redis server: redis://[user:password@]host:port[/db] or
	// rediss:// (TLS). A cluster is named by redis://…?addr=host2:port2
	// (more seed nodes) or ?cluster=true: a Redis Cluster client is used.
	URL string
	// Key is the fleet key (required, at least MinKeyLen bytes): every value
	// written is sealed with an HMAC-SHA256 under it, every value read is
	// checked against it (see auth.go). Every node of a fleet has the same
	// key; Redis never sees it.
	Key []byte
	// HealthMaxAge is how old the last Redis outcome may be before Health
	// probes Redis again (one PING within the OpTimeout). Default 1 s.
	HealthMaxAge time.Duration
	// OpTimeout bounds one Redis round trip of the data path (chunk reads
	// and writes, directory writes). Default 250 ms.
	OpTimeout time.Duration
	// CoordinatorTimeout bounds a whole coordinator match (both round trips).
	// Default 20 ms.
	CoordinatorTimeout time.Duration
	// WriteQueue bounds the writes waiting for a writer; a write beyond it is
	// dropped and counted. Default 1024.
	WriteQueue int
	// Writers is the number of goroutines writing to Redis. Default 2.
	Writers int
	// RetryQueue bounds the writes that failed (Redis down, paused, timing
	// out) and wait to be written again; a failed write beyond it is dropped
	// and counted (its Group is then lost). Default 4096 writes (a write is
	// one chunk or one sequence's directory entries; a queued chunk shares
	// its memory with the local store).
	RetryQueue int
	// RetryMinBackoff and RetryMaxBackoff bound the wait between retries
	// while Redis keeps failing: it doubles from the first to the second and
	// resets when a write succeeds; the queue then drains without waiting.
	// Defaults 100 ms and 5 s.
	RetryMinBackoff, RetryMaxBackoff time.Duration
}

func (c Config) withDefaults() Config {
	if c.OpTimeout <= 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.CoordinatorTimeout <= 0 {
		c.CoordinatorTimeout = DefaultCoordinatorTimeout
	}
	if c.WriteQueue <= 0 {
		c.WriteQueue = DefaultWriteQueue
	}
	if c.Writers <= 0 {
		c.Writers = DefaultWriters
	}
	if c.RetryQueue <= 0 {
		c.RetryQueue = DefaultRetryQueue
	}
	if c.RetryMinBackoff <= 0 {
		c.RetryMinBackoff = DefaultRetryMinBackoff
	}
	if c.RetryMaxBackoff <= 0 {
		c.RetryMaxBackoff = DefaultRetryMaxBackoff
	}
	c.RetryMaxBackoff = max(c.RetryMaxBackoff, c.RetryMinBackoff)
	if c.HealthMaxAge <= 0 {
		c.HealthMaxAge = DefaultHealthMaxAge
	}
	return c
}

// Stats are a Tier's running totals.
type Stats struct {
	// Chunk reads by outcome, and the bytes read.
	Hits, Misses, Corrupt, ReadErrors, BytesRead uint64
	// Writes by outcome (chunks and directory entries), and the bytes written.
	Writes, WritesDropped, WriteErrors, BytesWritten uint64
	// Failed writes put on the retry queue, retries that wrote them
	// (re-published), retries that failed again, failed writes dropped
	// (retry queue full, or left at Shutdown); RetryQueued is the queue's
	// length now.
	RetriesQueued, RetriesOK, RetriesFailed, RetriesDropped uint64
	RetryQueued                                             int
	// Coordinator matches by outcome.
	Matches, MatchTimeouts, MatchErrors uint64
	// Values read from Redis and refused (each also a miss, and counted in
	// Corrupt for a chunk), by reason: no valid tag under the fleet key
	// (another fleet's key, tampered, moved from another key, or of the
	// unauthenticated version 1 format), larger than the layout allows (not
	// read past the bound), authenticated but malformed, a chunk with
	// non-finite K/V. WritesRefused counts local chunks with non-finite K/V
	// that were not written to Redis.
	RefusedUnauthenticated, RefusedOversize, RefusedMalformed, RefusedNonFinite uint64
	WritesRefused                                                               uint64
}

// Tier is the fleet tier of one blend server: chunks shared by many nodes in
// Redis, and the fingerprint directory that finds them at any offset of a
// prompt. Create it with New, Start it, Shutdown it. Its methods are safe for
// concurrent use.
type Tier struct {
	cfg    Config
	client redis.UniversalClient
	log    *slog.Logger
	queue  chan *write
	stop   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	started bool
	stopped bool

	retry retryQueue
	seal  sealer

	probeMu sync.Mutex // one Health probe at a time
	hmu     sync.Mutex
	hstate  healthState

	tierCounters
}

// healthState is the outcome of the last Redis operations (guarded by hmu).
type healthState struct {
	lastOK, lastErrAt time.Time
	lastErr           string
}

// write is one queued write: a chunk or a sequence's directory entries.
type write struct {
	do func(ctx context.Context) error // counts its own writes and bytes
	g  *Group                          // nil: untracked
}

// retryQueue holds the writes that failed, oldest first, at most cap.
type retryQueue struct {
	mu    sync.Mutex
	items []*write
	cap   int
	kick  chan struct{} // capacity 1: something was queued
	// down is set while Redis fails: new writes skip their first attempt
	// and join the queue behind the older ones.
	down atomic.Bool
}

// tierCounters are a Tier's running totals (see Stats).
type tierCounters struct {
	hits, misses, corrupt, readErrs, bytesRead atomic.Uint64
	writes, dropped, writeErrs, bytesWritten   atomic.Uint64
	matches, matchTimeouts, matchErrs          atomic.Uint64
	pending                                    atomic.Int64 // writes queued or running
	retriesQueued, retriesOK, retriesFailed    atomic.Uint64
	retriesDropped                             atomic.Uint64
	refusedUnauth, refusedOversize             atomic.Uint64
	refusedMalformed, refusedNonFinite         atomic.Uint64
	writesRefused                              atomic.Uint64
}

// Group follows the writes of one stored document (its chunks on every rank
// and its directory entry) to tell whether another node can find it:
// [Group.State]. Create it with NewGroup; safe for concurrent use.
type Group struct {
	mu      sync.Mutex
	unsaved int  // writes not written yet (queued, running or waiting for a retry)
	untried int  // writes not attempted once yet
	lost    bool // a write was dropped
	settled chan struct{}
}

// NewGroup returns an empty Group (State Shared until writes are added).
func NewGroup() *Group {
	g := &Group{settled: make(chan struct{})}
	close(g.settled)
	return g
}

// GroupState is what a Group's writes came to.
type GroupState string

// The states of a Group.
const (
	// Shared: every write reached Redis.
	Shared GroupState = "shared"
	// Pending: some writes failed and wait on the retry queue (or are not
	// attempted yet); they are written when Redis answers again.
	Pending GroupState = "pending"
	// NotShared: a write was dropped (a full queue, or Shutdown): other nodes
	// will not find the whole document until it is stored again.
	NotShared GroupState = "not_shared"
)

func (g *Group) add() {
	if g == nil {
		return
	}
	g.mu.Lock()
	if g.untried == 0 {
		g.settled = make(chan struct{})
	}
	g.unsaved++
	g.untried++
	g.mu.Unlock()
}

// tried records a write's first attempt (or its skipping: Redis down).
func (g *Group) tried() {
	if g == nil {
		return
	}
	g.mu.Lock()
	if g.untried--; g.untried == 0 {
		close(g.settled)
	}
	g.mu.Unlock()
}

// done records a write's end: written, or dropped.
func (g *Group) done(written bool) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.unsaved--
	g.lost = g.lost || !written
	g.mu.Unlock()
}

// State returns what the group's writes came to so far.
func (g *Group) State() GroupState {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.lost:
		return NotShared
	case g.unsaved > 0:
		return Pending
	}
	return Shared
}

// Wait waits until every write of the group was attempted once (or ctx
// ends) and returns State.
func (g *Group) Wait(ctx context.Context) GroupState {
	g.mu.Lock()
	ch := g.settled
	g.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
	return g.State()
}

// New returns a Tier for cfg; it connects lazily (a Redis that is down at
// start is not an error: every call fails and is counted until it is up).
// logger may be nil.
func New(cfg Config, logger *slog.Logger) (*Tier, error) {
	cfg = cfg.withDefaults()
	opts, err := parseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if err := CheckKey(cfg.Key); err != nil {
		return nil, err
	}
	opts.DialTimeout = max(opts.DialTimeout, cfg.OpTimeout)
	opts.ReadTimeout, opts.WriteTimeout = cfg.OpTimeout, cfg.OpTimeout
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = 0 // a retry is the next request's business
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Tier{
		cfg: cfg, client: redis.NewUniversalClient(opts), log: logger,
		queue: make(chan *write, cfg.WriteQueue), stop: make(chan struct{}),
		retry: retryQueue{cap: cfg.RetryQueue, kick: make(chan struct{}, 1)},
		seal:  sealer{key: append([]byte(nil), cfg.Key...)},
	}, nil
}

// parseURL turns a redis:// or rediss:// URL into client options; addr query
// parameters or cluster=true select a cluster client.
func parseURL(raw string) (*redis.UniversalOptions, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
		return nil, fmt.Errorf("fleet: Redis URL %q: want redis://[user:password@]host:port or rediss://…", redactURL(raw))
	}
	q := u.Query()
	cluster, _ := strconv.ParseBool(q.Get("cluster"))
	if len(q["addr"]) > 0 || cluster {
		q.Del("cluster")
		u.RawQuery = q.Encode()
		co, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("fleet: Redis cluster URL %q: %w", redactURL(raw), err)
		}
		return &redis.UniversalOptions{
			Addrs: co.Addrs, Username: co.Username, Password: co.Password, TLSConfig: co.TLSConfig,
			IsClusterMode: true,
		}, nil
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("fleet: Redis URL %q: %w", redactURL(raw), err)
	}
	return &redis.UniversalOptions{
		Addrs: []string{o.Addr}, Username: o.Username, Password: o.Password, DB: o.DB, TLSConfig: o.TLSConfig,
	}, nil
}

// redactURL drops the password of a URL for error messages and logs.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Start starts the writers. ctx is not retained.
func (t *Tier) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.started || t.stopped {
		return errors.New("fleet: already started")
	}
	t.started = true
	for range t.cfg.Writers {
		t.wg.Go(t.writer)
	}
	t.wg.Go(t.retrier)
	return nil
}

// Shutdown stops taking writes, lets the writers drain the queue until ctx
// ends (then drops the rest, counted), drops the writes waiting for a retry
// (counted in RetriesDropped), and closes the client. Later calls return
// nil.
func (t *Tier) Shutdown(ctx context.Context) error {
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return nil
	}
	t.stopped = true
	started := t.started
	close(t.stop)
	t.mu.Unlock()
	var err error
	if started {
		done := make(chan struct{})
		go func() { t.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			err = fmt.Errorf("fleet: draining writes: %w", ctx.Err())
			<-done // the writers stop at once once ctx is done
		}
	}
	t.retry.mu.Lock()
	left := t.retry.items
	t.retry.items = nil
	t.retry.mu.Unlock()
	for _, w := range left {
		t.retriesDropped.Add(1)
		w.g.done(false)
	}
	if cerr := t.client.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("fleet: close: %w", cerr)
	}
	return err
}

// writer runs queued writes until Shutdown, then drains what is queued.
func (t *Tier) writer() {
	for {
		select {
		case w := <-t.queue:
			t.run(w)
		case <-t.stop:
			for {
				select {
				case w := <-t.queue:
					t.run(w)
				default:
					return
				}
			}
		}
	}
}

// run makes a queued write's first attempt; a failed one (or any while Redis
// is down) goes to the retry queue.
func (t *Tier) run(w *write) {
	defer t.pending.Add(-1)
	defer w.g.tried()
	if t.retry.down.Load() {
		t.requeue(w) // behind the writes already waiting, in order
		return
	}
	if err := t.attempt(w); err != nil {
		t.retry.down.Store(true)
		t.requeue(w)
		return
	}
	w.g.done(true)
}

// attempt runs one write within the OpTimeout.
func (t *Tier) attempt(w *write) error {
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.OpTimeout)
	defer cancel()
	return w.do(ctx)
}

// requeue puts a failed write on the retry queue, or drops and counts it
// when the queue is full or the tier is stopping.
func (t *Tier) requeue(w *write) {
	t.retry.mu.Lock()
	ok := len(t.retry.items) < t.retry.cap && !t.isStopping()
	if ok {
		t.retry.items = append(t.retry.items, w)
	}
	t.retry.mu.Unlock()
	if !ok {
		t.retriesDropped.Add(1)
		w.g.done(false)
		return
	}
	t.retriesQueued.Add(1)
	select {
	case t.retry.kick <- struct{}{}:
	default:
	}
}

func (t *Tier) isStopping() bool {
	select {
	case <-t.stop:
		return true
	default:
		return false
	}
}

// retrier writes the retry queue's writes again, oldest first, until
// Shutdown: at once while Redis answers, else after a backoff doubling from
// RetryMinBackoff to RetryMaxBackoff (one write probes Redis per wait).
func (t *Tier) retrier() {
	backoff := t.cfg.RetryMinBackoff
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		t.retry.mu.Lock()
		var w *write
		if len(t.retry.items) > 0 {
			w = t.retry.items[0]
		}
		t.retry.mu.Unlock()
		if w == nil {
			select {
			case <-t.retry.kick:
				continue
			case <-t.stop:
				return
			}
		}
		if err := t.attempt(w); err != nil {
			t.retriesFailed.Add(1)
			t.retry.down.Store(true)
			timer.Reset(backoff)
			backoff = min(2*backoff, t.cfg.RetryMaxBackoff)
			select {
			case <-timer.C:
			case <-t.stop:
				return
			}
			continue
		}
		t.retry.mu.Lock()
		if len(t.retry.items) > 0 && t.retry.items[0] == w {
			t.retry.items[0] = nil
			t.retry.items = t.retry.items[1:]
		}
		empty := len(t.retry.items) == 0
		t.retry.mu.Unlock()
		t.retriesOK.Add(1)
		w.g.done(true)
		backoff = t.cfg.RetryMinBackoff
		if empty {
			t.retry.down.Store(false)
		}
	}
}

// Flush waits until every write queued before the call is done, or ctx
// ends.
func (t *Tier) Flush(ctx context.Context) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for t.pending.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// enqueue queues a write of group g (nil: untracked); false (dropped,
// counted, g lost) when the queue is full or the tier is stopping.
func (t *Tier) enqueue(g *Group, do func(context.Context) error) bool {
	g.add()
	t.mu.Lock() // Shutdown cannot stop the writers meanwhile
	defer t.mu.Unlock()
	if !t.stopped {
		t.pending.Add(1)
		select {
		case t.queue <- &write{do: do, g: g}:
			return true
		default:
			t.pending.Add(-1)
		}
	}
	t.dropped.Add(1)
	g.tried()
	g.done(false)
	return false
}

// Stats returns the running totals.
func (t *Tier) Stats() Stats {
	return Stats{
		Hits: t.hits.Load(), Misses: t.misses.Load(), Corrupt: t.corrupt.Load(), ReadErrors: t.readErrs.Load(),
		BytesRead: t.bytesRead.Load(),
		Writes:    t.writes.Load(), WritesDropped: t.dropped.Load(), WriteErrors: t.writeErrs.Load(),
		BytesWritten: t.bytesWritten.Load(),
		Matches:      t.matches.Load(), MatchTimeouts: t.matchTimeouts.Load(), MatchErrors: t.matchErrs.Load(),
		RetriesQueued: t.retriesQueued.Load(), RetriesOK: t.retriesOK.Load(), RetriesFailed: t.retriesFailed.Load(),
		RetriesDropped: t.retriesDropped.Load(), RetryQueued: t.retryLen(),
		RefusedUnauthenticated: t.refusedUnauth.Load(), RefusedOversize: t.refusedOversize.Load(),
		RefusedMalformed: t.refusedMalformed.Load(), RefusedNonFinite: t.refusedNonFinite.Load(),
		WritesRefused: t.writesRefused.Load(),
	}
}

func (t *Tier) retryLen() int {
	t.retry.mu.Lock()
	defer t.retry.mu.Unlock()
	return len(t.retry.items)
}

// Namespace names the keys of one model and KV layout, so that chunks of
// different models or layouts never mix (the rank is part of every chunk
// key already).
func Namespace(model string, l chunkstore.Layout) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d/%d/%d/%v", model, l.NumLayers, l.KVHeads, l.HeadDim, math.Float64bits(l.RoPETheta))
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Ref names a chunk of the fleet tier: rank Rank's chunk of the rank-0
// chunk Base (Base itself for rank 0). The ranks of a tensor-parallel group
// keep their chunks under their rank-0 chunk's key, so that a node that
// never saw them finds every rank's chunk from the rank-0 keys of a match.
type Ref struct {
	Base chunkstore.Key
	Rank int
}

func chunkKey(ns string, r Ref) string {
	if r.Rank == 0 {
		return "cb:" + ns + ":c:" + r.Base.String()
	}
	return "cb:" + ns + ":c:" + r.Base.String() + ":r" + strconv.Itoa(r.Rank)
}
func fpKey(ns string, fp uint64) string { return "cb:" + ns + ":f:" + strconv.FormatUint(fp, 16) }
func seqKey(ns, id string) string       { return "cb:" + ns + ":s:" + id }

// PutChunk writes c, rank c.Rank's chunk of the rank-0 chunk base (c.Key
// for rank 0), under ns, asynchronously, as a write of g (nil: untracked),
// sealed with the fleet key; a failed write is retried from the retry
// queue. A chunk whose K/V is not finite is never written (counted in
// WritesRefused; the write counts as done). False when the write was
// dropped (queue full).
func (t *Tier) PutChunk(ns string, base chunkstore.Key, c *chunkstore.Chunk, g *Group) bool {
	return t.enqueue(g, func(ctx context.Context) error {
		if !finite(c.KV) {
			t.writesRefused.Add(1)
			t.log.Warn("fleet: chunk with non-finite K/V not shared", "key", c.Key.String(), "rank", c.Rank)
			return nil // retrying cannot help
		}
		b, err := chunkstore.EncodeChunk(c)
		if err != nil {
			t.writeErrs.Add(1)
			return nil // retrying cannot help
		}
		key := chunkKey(ns, Ref{base, c.Rank})
		return t.set(ctx, key, t.seal.seal(kindChunk, key, chunkLayout(c.Layout, c.Rank), b))
	})
}

func (t *Tier) set(ctx context.Context, key string, b []byte) error {
	if err := t.observe(t.client.Set(ctx, key, b, 0).Err()); err != nil {
		t.writeErrs.Add(1)
		t.log.Debug("fleet write failed", "key", key, "err", err)
		return t.wrap(err)
	}
	t.writes.Add(1)
	t.bytesWritten.Add(uint64(len(b)))
	return nil
}

// RegisterSequence writes a stored sequence to the directory under ns,
// asynchronously, as a write of g (nil: untracked): its tokens and chunk
// keys, and the fingerprint of every chunk (computed with tab's hash), so
// that a coordinator match on any node finds it. A failed write is retried
// from the retry queue. False when dropped (queue full).
func (t *Tier) RegisterSequence(ns string, tab *fingerprint.Table, seq fingerprint.Sequence, g *Group) bool {
	cs := seq.ChunkSize
	if cs <= 0 {
		cs = chunkstore.DefaultChunkSize
	}
	body := encodeSequence(seq, cs)
	sum := sha256.Sum256(body)
	id := hex.EncodeToString(sum[:16])
	type entry struct {
		fp    uint64
		chunk int
	}
	var fps []entry
	for i := range seq.Keys {
		c := reuseplan.Chunk(i, cs, len(seq.Tokens))
		if fp, ok := tab.ChunkFingerprint(seq.Tokens[c.Start:c.End]); ok {
			fps = append(fps, entry{fp, i})
		}
	}
	sk := seqKey(ns, id)
	sealed := t.seal.seal(kindSequence, sk, nil, body)
	size := strconv.Itoa(len(sealed))
	return t.enqueue(g, func(ctx context.Context) error {
		pipe := t.client.Pipeline()
		pipe.Set(ctx, sk, sealed, 0)
		for _, e := range fps {
			fk := fpKey(ns, e.fp)
			pipe.Set(ctx, fk, t.seal.seal(kindFP, fk, nil, []byte(id+":"+strconv.Itoa(e.chunk)+":"+size)), 0)
		}
		if _, err := t.observeExec(pipe.Exec(ctx)); err != nil {
			t.writeErrs.Add(1)
			t.log.Debug("fleet directory write failed", "err", err)
			return t.wrap(err)
		}
		t.writes.Add(uint64(1 + len(fps)))
		t.bytesWritten.Add(uint64(len(sealed)))
		return nil
	})
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// encodeSequence is chunk size, token count, tokens, key count, keys, CRC32C.
func encodeSequence(seq fingerprint.Sequence, cs int) []byte {
	b := make([]byte, 0, 12+4*len(seq.Tokens)+32*len(seq.Keys)+4)
	b = binary.LittleEndian.AppendUint32(b, uint32(cs))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(seq.Tokens)))
	for _, tok := range seq.Tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(tok))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(seq.Keys)))
	for _, k := range seq.Keys {
		b = append(b, k[:]...)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

// errCorrupt marks a value that does not decode.
var errCorrupt = errors.New("fleet: corrupt value")

// decodeSequence parses and bounds a directory sequence.
func decodeSequence(b []byte) (fingerprint.Sequence, error) {
	var s fingerprint.Sequence
	if len(b) < 16 || crc32.Checksum(b[:len(b)-4], crcTable) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return s, errCorrupt
	}
	b = b[:len(b)-4]
	cs, n := int(binary.LittleEndian.Uint32(b)), int(binary.LittleEndian.Uint32(b[4:]))
	if cs <= 0 || cs > chunkstore.MaxChunkTokens || n <= 0 || n > MaxSequenceTokens || len(b) < 12+4*n {
		return s, errCorrupt
	}
	s.ChunkSize = cs
	s.Tokens = make([]int32, n)
	for i := range s.Tokens {
		s.Tokens[i] = int32(binary.LittleEndian.Uint32(b[8+4*i:]))
	}
	rest := b[8+4*n:]
	nk := int(binary.LittleEndian.Uint32(rest))
	if nk != (n+cs-1)/cs || len(rest) != 4+32*nk {
		return s, errCorrupt
	}
	s.Keys = make([]chunkstore.Key, nk)
	for i := range s.Keys {
		copy(s.Keys[i][:], rest[4+32*i:])
	}
	return s, nil
}

// LoadStats describe one GetChunks call.
type LoadStats struct {
	Keys, Hits, Misses, Corrupt int
	Bytes                       int64
	Duration                    time.Duration
}

// GetChunks reads the chunks of refs under ns in one pipelined batch (one
// round trip per shard). want is the layout the chunks must have and
// maxTokens (chunkstore.DefaultChunkSize when <= 0) the most tokens one
// holds: each value is read only up to the most such a chunk can be
// (MaxChunkValue, with GETRANGE), so a larger one is refused without being
// read whole. A value is then opened (its fleet-key tag checked against its
// key name and want) before it is decoded. A value that is larger, not
// authenticated, does not decode, is of another rank, holds another key
// than a rank-0 ref's Base or another layout than want, or whose K/V is not
// finite is a miss, counted (Corrupt and Stats.Refused*), never returned.
// err is set when the batch failed as a whole (Redis down, timeout, want
// invalid): every ref is then a miss.
func (t *Tier) GetChunks(ctx context.Context, ns string, keys []Ref, want chunkstore.Layout, maxTokens int) (map[Ref]*chunkstore.Chunk, LoadStats, error) {
	st := LoadStats{Keys: len(keys)}
	if len(keys) == 0 {
		return nil, st, nil
	}
	if err := want.Validate(); err != nil {
		t.misses.Add(uint64(len(keys)))
		st.Misses = len(keys)
		return nil, st, fmt.Errorf("fleet: get chunks: %w", err)
	}
	if maxTokens <= 0 {
		maxTokens = chunkstore.DefaultChunkSize
	}
	limit := MaxChunkValue(want, min(maxTokens, chunkstore.MaxChunkTokens))
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, t.cfg.OpTimeout)
	defer cancel()
	pipe := t.client.Pipeline()
	names := make([]string, len(keys))
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		names[i] = chunkKey(ns, k)
		cmds[i] = pipe.GetRange(ctx, names[i], 0, limit) // at most limit+1 bytes
	}
	_, err := t.observeExec(pipe.Exec(ctx))
	st.Duration = time.Since(t0)
	if batchFailed(err) {
		t.readErrs.Add(1)
		t.misses.Add(uint64(len(keys)))
		st.Misses = len(keys)
		return nil, st, t.wrap(err)
	}
	// The checks (mostly the HMAC, ~1 ms per MiB) run on up to GOMAXPROCS
	// goroutines, joined before returning.
	opened := make([]*chunkstore.Chunk, len(keys))
	errs := make([]error, len(keys))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(len(keys), runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(keys); i = int(next.Add(1) - 1) {
				b, err := cmds[i].Bytes() // ours: a copy of the reply
				switch {
				case err != nil && isWrongType(err):
					errs[i] = errCorrupt
				case err != nil || len(b) == 0:
					errs[i] = redis.Nil
				default:
					opened[i], errs[i] = t.openChunk(names[i], keys[i], want, b, limit)
				}
			}
		})
	}
	wg.Wait()
	out := make(map[Ref]*chunkstore.Chunk, len(keys))
	for i, k := range keys {
		switch err := errs[i]; {
		case err == redis.Nil:
			st.Misses++
		case err != nil:
			t.refuse(err)
			t.log.Debug("fleet chunk refused", "key", names[i], "err", err)
			st.Corrupt++
			st.Misses++
		default:
			out[k] = opened[i]
			st.Hits++
			st.Bytes += int64(cmdLen(cmds[i]))
		}
	}
	t.hits.Add(uint64(st.Hits))
	t.misses.Add(uint64(st.Misses))
	t.corrupt.Add(uint64(st.Corrupt))
	t.bytesRead.Add(uint64(st.Bytes))
	return out, st, nil
}

func cmdLen(c *redis.StringCmd) int {
	b, _ := c.Bytes()
	return len(b)
}

// openChunk checks a chunk value b read (at most limit+1 bytes) from key
// name for ref k: size, tag, encoding, identity and layout, finite K/V.
func (t *Tier) openChunk(name string, k Ref, want chunkstore.Layout, b []byte, limit int64) (*chunkstore.Chunk, error) {
	if int64(len(b)) > limit {
		return nil, errOversize
	}
	body, err := t.seal.open(kindChunk, name, chunkLayout(want, k.Rank), b)
	if err != nil {
		return nil, err
	}
	c, err := chunkstore.DecodeOwnedChunk(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errCorrupt, err)
	}
	if c.Rank != k.Rank || (k.Rank == 0 && c.Key != k.Base) || c.Layout != want {
		return nil, fmt.Errorf("%w: rank %d key %s layout %+v", errCorrupt, c.Rank, c.Key, c.Layout)
	}
	if !finite(c.KV) {
		return nil, errNonFinite
	}
	return c, nil
}

// refuse counts a value refused for err.
func (t *Tier) refuse(err error) {
	switch {
	case errors.Is(err, errOversize):
		t.refusedOversize.Add(1)
	case errors.Is(err, errUnauthenticated):
		t.refusedUnauth.Add(1)
	case errors.Is(err, errNonFinite):
		t.refusedNonFinite.Add(1)
	default:
		t.refusedMalformed.Add(1)
	}
}

// isWrongType reports a command's WRONGTYPE reply: a key holding another
// type than a string (planted by someone else): a refused value, not a
// Redis failure.
func isWrongType(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE")
}

// batchFailed reports whether a pipeline's error is a failure of Redis
// (down, timeout, auth) rather than a missing key or a value of another
// type.
func batchFailed(err error) bool {
	return err != nil && !errors.Is(err, redis.Nil) && !isWrongType(err)
}

// observe records the outcome of a Redis call for Health and returns err.
// A missing key or a value of another type is an answer: Redis is up.
func (t *Tier) observe(err error) error {
	now := time.Now()
	t.hmu.Lock()
	if batchFailed(err) {
		t.hstate.lastErrAt, t.hstate.lastErr = now, redactErr(err)
	} else {
		t.hstate.lastOK = now
	}
	t.hmu.Unlock()
	return err
}

func (t *Tier) observeExec(cmds []redis.Cmder, err error) ([]redis.Cmder, error) {
	return cmds, t.observe(err)
}

// redactErr is err's message without a password a URL in it may carry.
func redactErr(err error) string {
	msg := err.Error()
	for _, f := range strings.Fields(msg) {
		if strings.Contains(f, "://") && URLHasPassword(f) {
			msg = strings.ReplaceAll(msg, f, redactURL(f))
		}
	}
	return msg
}

// Health is the fleet tier's state as shown by a node's /health.
type Health struct {
	// Reachable: the last Redis call (or probe) was answered.
	Reachable bool
	// LastError is the last Redis failure (timeout, refused connection,
	// auth), at LastErrorAt; empty when none since start.
	LastError   string
	LastErrorAt time.Time
	// RetryQueued is the writes waiting on the retry queue.
	RetryQueued int
	// Refused is the values read from Redis and refused (every reason).
	Refused uint64
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Health returns the fleet tier's state. When the last Redis outcome is
// older than Config.HealthMaxAge it probes Redis first (one PING within the
// OpTimeout; one probe at a time). Safe for concurrent use.
func (t *Tier) Health(ctx context.Context) Health {
	t.hmu.Lock()
	last := latest(t.hstate.lastOK, t.hstate.lastErrAt)
	t.hmu.Unlock()
	if time.Since(last) > t.cfg.HealthMaxAge {
		t.probeMu.Lock()
		t.hmu.Lock()
		fresh := time.Since(latest(t.hstate.lastOK, t.hstate.lastErrAt)) <= t.cfg.HealthMaxAge
		t.hmu.Unlock()
		if !fresh {
			_ = t.Ping(ctx)
		}
		t.probeMu.Unlock()
	}
	return t.LastHealth()
}

// LastHealth is Health without a probe: the state as of the last Redis
// call (Reachable is false before any). Safe for concurrent use.
func (t *Tier) LastHealth() Health {
	st := t.Stats()
	t.hmu.Lock()
	defer t.hmu.Unlock()
	return Health{
		Reachable: !t.hstate.lastOK.IsZero() && !t.hstate.lastOK.Before(t.hstate.lastErrAt),
		LastError: t.hstate.lastErr, LastErrorAt: t.hstate.lastErrAt, RetryQueued: st.RetryQueued,
		Refused: st.RefusedUnauthenticated + st.RefusedOversize + st.RefusedMalformed + st.RefusedNonFinite,
	}
}

func (t *Tier) wrap(err error) error {
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return fmt.Errorf("fleet: %w", err)
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// MatchStats describe one coordinator match.
type MatchStats struct {
	// Probes is the number of prompt offsets probed; RoundTrips the
	// pipelined batches sent (at most two: fingerprints, then sequences).
	Probes, RoundTrips int
	// DirectoryHits counts probes found in the directory; Sequences the
	// stored sequences fetched to verify them.
	DirectoryHits, Sequences int
	Duration                 time.Duration
}

// Match is the coordinator match: the fingerprints of prompt[from:] at every
// offset (computed with tab's hash) are probed in the directory under ns in
// one pipelined batch, the stored sequences they point at are fetched in a
// second, and the prompt is matched token by token against them (the same
// verification and extension as the local table). It is bounded by the
// CoordinatorTimeout; on timeout it returns an error wrapping ErrTimeout.
func (t *Tier) Match(ctx context.Context, ns string, tab *fingerprint.Table, prompt []int32, from int) (fingerprint.Result, MatchStats, error) {
	var st MatchStats
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, t.cfg.CoordinatorTimeout)
	defer cancel()
	res, err := t.match(ctx, ns, tab, prompt, from, &st)
	st.Duration = time.Since(t0)
	switch {
	case err == nil:
		t.matches.Add(1)
	case errors.Is(err, ErrTimeout):
		t.matchTimeouts.Add(1)
	default:
		t.matchErrs.Add(1)
	}
	return res, st, err
}

func (t *Tier) match(ctx context.Context, ns string, tab *fingerprint.Table, prompt []int32, from int, st *MatchStats) (fingerprint.Result, error) {
	var res fingerprint.Result
	probes := tab.Probes(prompt, from)
	st.Probes = len(probes)
	if len(probes) == 0 {
		return res, nil
	}
	seen := make(map[uint64]bool, len(probes))
	pipe := t.client.Pipeline()
	var cmds []*redis.StringCmd
	var names []string
	for _, fp := range probes {
		if !seen[fp] {
			seen[fp] = true
			names = append(names, fpKey(ns, fp))
			cmds = append(cmds, pipe.GetRange(ctx, names[len(names)-1], 0, int64(maxFPValue)))
		}
	}
	st.RoundTrips++
	if _, err := t.observeMatch(pipe.Exec(ctx)); batchFailed(err) {
		return res, t.wrap(err)
	}
	ids := map[string]int{} // sequence id -> its value's size
	for i, c := range cmds {
		v, err := c.Bytes()
		if err != nil || len(v) == 0 {
			continue
		}
		st.DirectoryHits++
		id, size, err := t.openFP(names[i], v)
		if err != nil {
			t.refuse(err)
			t.corrupt.Add(1)
			continue
		}
		ids[id] = size
	}
	if len(ids) == 0 {
		res.Stats.Probes = st.Probes
		return res, nil
	}
	pipe = t.client.Pipeline()
	type seqRead struct {
		id, name string
		size     int
		cmd      *redis.StringCmd
	}
	reads := make([]seqRead, 0, len(ids))
	for id, size := range ids {
		name := seqKey(ns, id)
		// One byte more than the size its entry declares: a larger value is
		// refused, not read whole.
		reads = append(reads, seqRead{id, name, size, pipe.GetRange(ctx, name, 0, int64(size))})
	}
	st.RoundTrips++
	if _, err := t.observeMatch(pipe.Exec(ctx)); batchFailed(err) {
		return res, t.wrap(err)
	}
	// The sequences found are matched by a table of their own, with the
	// node table's hash and limits.
	local := tab.Sibling()
	for _, r := range reads {
		b, err := r.cmd.Bytes()
		if err != nil || len(b) == 0 {
			continue
		}
		seq, err := t.openSequence(r.name, r.id, r.size, b)
		if err != nil {
			t.refuse(err)
			t.corrupt.Add(1)
			continue
		}
		if _, err := local.Register(seq); err == nil {
			st.Sequences++
		}
	}
	res = local.Match(prompt, from)
	res.Stats.Probes = st.Probes
	return res, nil
}

// observeMatch is observeExec for the coordinator match, whose short
// deadline is a latency budget: a timeout there says nothing of whether
// Redis is reachable.
func (t *Tier) observeMatch(cmds []redis.Cmder, err error) ([]redis.Cmder, error) {
	if err != nil && (errors.Is(err, context.DeadlineExceeded) || isTimeout(err)) {
		return cmds, err
	}
	return t.observeExec(cmds, err)
}

// maxSequenceValue bounds a directory sequence's value (MaxSequenceTokens
// tokens in chunks of one token, the worst case, plus the seal).
const maxSequenceValue = 16 + 36*MaxSequenceTokens + sealOverhead

// openFP checks a fingerprint entry v read from key name and returns the
// sequence id and the size of the sequence's value it declares.
func (t *Tier) openFP(name string, v []byte) (id string, size int, err error) {
	if len(v) > maxFPValue {
		return "", 0, errOversize
	}
	body, err := t.seal.open(kindFP, name, nil, v)
	if err != nil {
		return "", 0, err
	}
	parts := strings.Split(string(body), ":")
	if len(parts) != 3 || len(parts[0]) != 32 {
		return "", 0, errCorrupt
	}
	if _, err := strconv.Atoi(parts[1]); err != nil {
		return "", 0, errCorrupt
	}
	size, err = strconv.Atoi(parts[2])
	if err != nil || size < 16+sealOverhead || size > maxSequenceValue {
		return "", 0, errCorrupt
	}
	return parts[0], size, nil
}

// openSequence checks a sequence value b (at most size+1 bytes) read from
// key name for id: its size, tag, encoding and id (the hash of its body).
func (t *Tier) openSequence(name, id string, size int, b []byte) (fingerprint.Sequence, error) {
	if len(b) > size {
		return fingerprint.Sequence{}, errOversize
	}
	body, err := t.seal.open(kindSequence, name, nil, b)
	if err != nil {
		return fingerprint.Sequence{}, err
	}
	if sum := sha256.Sum256(body); hex.EncodeToString(sum[:16]) != id {
		return fingerprint.Sequence{}, errCorrupt
	}
	return decodeSequence(body)
}

// Ping checks that Redis answers, within the OpTimeout.
func (t *Tier) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.OpTimeout)
	defer cancel()
	if err := t.observe(t.client.Ping(ctx).Err()); err != nil {
		return t.wrap(err)
	}
	return nil
}

// EncodeSequence encodes a stored sequence as the directory does (chunk
// size, tokens, keys, CRC32C); DecodeSequence reads it back. The blend
// server's L2 keeps its registered sequences in this form (blend.Config.L2Dir).
func EncodeSequence(seq fingerprint.Sequence) []byte { return encodeSequence(seq, seq.ChunkSize) }

// DecodeSequence parses and bounds an encoded sequence (MaxSequenceTokens,
// keys consistent with the tokens, CRC32C).
func DecodeSequence(b []byte) (fingerprint.Sequence, error) { return decodeSequence(b) }
