package blend

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// maxRequestID bounds the length of a request id.
const maxRequestID = 1024

// lookups is the part of a Server that owns the lookup pool: the bounded
// queue, what each lookup worker runs (for the watchdog, health.go) and the
// counters.
type lookups struct {
	queue                     chan func()    // lookups waiting for a lookup worker
	busy                      []atomic.Int64 // per worker: start (Unix ns) of its running lookup, 0 when idle
	rejected, abandoned, done atomic.Uint64
}

func newLookups(cfg Config) lookups {
	return lookups{queue: make(chan func(), cfg.LookupQueue), busy: make([]atomic.Int64, cfg.LookupWorkers)}
}

// checkRequest bounds the request id of an RPC and, unless it is -1, its
// number of tokens.
func checkRequest(op, id string, tokens int) error {
	switch {
	case id == "":
		return status.Error(codes.InvalidArgument, "missing request_id")
	case len(id) > maxRequestID:
		return status.Errorf(codes.InvalidArgument, "request_id of %d bytes exceeds %d", len(id), maxRequestID)
	case tokens != -1 && (tokens == 0 || tokens > MaxTokens):
		return status.Errorf(codes.InvalidArgument, "%s: %d tokens (want 1..%d)", op, tokens, MaxTokens)
	}
	return nil
}

// checkLookup bounds a lookup request.
func checkLookup(r *cbv1.LookupRequest) error {
	if err := checkRequest("lookup", r.GetRequestId(), len(r.GetTokens())); err != nil {
		return err
	}
	if ws := r.GetWorldSize(); ws < 0 || ws > MaxWorldSize {
		return status.Errorf(codes.InvalidArgument, "lookup: world_size %d outside 0..%d", ws, MaxWorldSize)
	}
	if len(r.GetModel()) > chunkstore.MaxModelLen {
		return status.Errorf(codes.InvalidArgument, "lookup: model name of %d bytes", len(r.GetModel()))
	}
	if ids := r.GetPendingStoreIds(); len(ids) > defaults.MaxPendingStores {
		return status.Errorf(codes.InvalidArgument, "lookup: %d pending store ids exceed %d", len(ids), defaults.MaxPendingStores)
	}
	for i, id := range r.GetPendingStoreIds() {
		if id == "" || len(id) > maxRequestID {
			return status.Errorf(codes.InvalidArgument, "lookup: pending_store_ids[%d] of %d bytes (want 1..%d)", i, len(id), maxRequestID)
		}
	}
	return nil
}

// lookupRPC queues the lookup on the bounded lookup pool and answers when
// it is done, or when the caller's context ends first (the queued lookup is
// then skipped, counted as abandoned, when a worker reaches it).
func (s *Server) lookupRPC(ctx context.Context, r *cbv1.LookupRequest) (*cbv1.LookupResult, error) {
	if err := checkLookup(r); err != nil {
		return nil, err
	}
	submitted := time.Now()
	tc, ts := traceContext(ctx, r.GetTraceContext(), r.GetTraceState())
	// The stores in flight this lookup would match: waited for here, on the
	// RPC's goroutine (not a lookup worker), within the caller's deadline.
	sw := s.awaitStores(ctx, r, submitted)
	done := make(chan *cbv1.LookupResult, 1) // never blocks the pool
	run := func() {
		if ctx.Err() != nil {
			s.lookups.abandoned.Add(1)
			return
		}
		res := s.lookupAfter(r, tc, ts, submitted, sw)
		// Counted before the answer is handed over: a caller that reads
		// Stats after its lookup returned sees it.
		s.lookups.done.Add(1)
		done <- res
	}
	if !enqueue(s, s.lookups.queue, run) {
		s.lookups.rejected.Add(1)
		return nil, status.Errorf(codes.ResourceExhausted, "lookup queue full (%d waiting)", cap(s.lookups.queue))
	}
	select {
	case res := <-done:
		return res, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// runQueue runs the jobs of q until it is closed and drained.
func runQueue(q <-chan func()) {
	for run := range q {
		run()
	}
}

// lookupQuery is one lookup's prompt and where its chunks live.
type lookupQuery struct {
	id   string
	toks []int32
	mdl  string
	ws   int    // the world size of the ranks that will load it (1: a whole model)
	ns   string // keySpace(mdl, ws)
	// pending is the matched chunks of stores still in flight when the
	// lookup stopped waiting for them (cb.classify's pending).
	pending int
}

// classified is what cb.classify found of the matched chunks.
type classified struct {
	usable                  map[chunkstore.Key]bool // present, and on every rank
	found, stale, perRankOK int
	fingerprintKeys         int // keys the non-prefix leg added
}

// lookup is the unified lookup of one prompt, publishing the paired events
// of cb.lookup and its children: the prefix leg (mp.lookup_prefetch), the
// non-prefix leg after its coverage, the sparse prefetch of every matched
// chunk, their classification, and the matches cut to the usable chunks.
// cb.lookup starts at submitted, in the caller's trace context tc, ts.
func (s *Server) lookup(r *cbv1.LookupRequest, tc, ts string, submitted time.Time) *cbv1.LookupResult {
	return s.lookupAfter(r, tc, ts, submitted, storeWait{})
}

// lookupAfter is lookup after the wait sw for the stores in flight it would
// match (awaitStores).
func (s *Server) lookupAfter(r *cbv1.LookupRequest, tc, ts string, submitted time.Time, sw storeWait) *cbv1.LookupResult {
	q := lookupQuery{id: r.GetRequestId(), toks: r.GetTokens(), mdl: r.GetModel(), ws: max(1, int(r.GetWorldSize())), pending: sw.pending}
	q.ns = keySpace(q.mdl, q.ws)
	cs := s.cfg.ChunkSize
	s.bus.Publish(events.Event{Type: events.LookupStart, RequestID: q.id, Time: submitted, TraceContext: tc, TraceState: ts,
		Attrs: []attribute.KeyValue{attribute.Int("world_size", q.ws), attribute.String("model", q.mdl)}})
	s.bus.Publish(events.Event{Type: events.PrefixLookupStart, RequestID: q.id})
	pkeys := chunkstore.ChainKeys(q.ns, 0, q.toks[:reuseplan.WholeChunks(len(q.toks), cs)], cs)
	prefixChunks := s.chunks.store.PrefixChunks(pkeys)
	s.bus.Publish(events.Event{Type: events.PrefixLookupEnd, RequestID: q.id,
		Attrs: []attribute.KeyValue{events.AttrPrefixChunks.Int(prefixChunks)}})
	fm := s.nonPrefixMatch(q, reuseplan.Coverage(prefixChunks, cs))
	if s.chunks.fleet != nil {
		// The fleet directory learns a sequence only when its asynchronous fleet write lands;
		// the local table as soon as it is registered (a request right after another on this
		// node).
		if t := s.chunks.table(q.ns, false); t != nil {
			fm.Matches = mergeMatches(fm.Matches, t.Match(q.toks, reuseplan.Coverage(prefixChunks, cs)).Matches)
		}
	}
	keys, fpKeys := matchedKeys(pkeys[:prefixChunks], fm)
	got, ls := s.sparsePrefetch(q, keys)
	cl := s.classify(q, keys, got)
	cl.fingerprintKeys = fpKeys
	matches := usableMatches(pkeys[:prefixChunks], fm, cs, cl.usable)
	h := reuseplan.HitsOf(len(q.toks), prefixChunks, cs, matches)
	res := lookupResult(h, matches, cl, fm.Stats, ls, cs)
	s.bus.Publish(events.Event{Type: events.LookupEnd, RequestID: q.id, Attrs: []attribute.KeyValue{
		events.AttrRequestedTokens.Int(h.Requested),
		events.AttrPrefixHitTokens.Int(h.Prefix),
		events.AttrNonPrefixHitTokens.Int(h.NonPrefix),
		events.AttrHitTokens.Int(h.Tokens()),
		events.AttrHitRate.Float64(h.Rate()),
		events.AttrPrefixCoverageTokens.Int(h.Coverage),
		events.AttrNNonPrefixTokens.Int(h.Searched()),
		events.AttrFingerprintHits.Int(cl.fingerprintKeys),
		events.AttrStorageHits.Int(cl.found),
		events.AttrStaleChunks.Int(cl.stale),
		events.AttrPrefixChunks.Int(int(res.PrefixChunks)),
		events.AttrLookup.String("done"),
		attribute.Float64("pending_wait_ms", float64(sw.waited)/float64(time.Millisecond)),
		attribute.Int("unarrived_stores", sw.unarrived),
	}})
	return res
}

// matchedKeys lists the prefix keys, then the keys of the non-prefix
// matches not seen yet (counted: the fingerprint hits).
func matchedKeys(prefix []chunkstore.Key, fm fingerprint.Result) (keys []chunkstore.Key, fpKeys int) {
	keys = append(make([]chunkstore.Key, 0, len(prefix)+2*len(fm.Matches)), prefix...)
	seen := make(map[chunkstore.Key]bool, cap(keys))
	for _, k := range keys {
		seen[k] = true
	}
	for _, m := range fm.Matches {
		for _, k := range m.Keys {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
				fpKeys++
			}
		}
	}
	return keys, fpKeys
}

// sparsePrefetch (cb.sparse_prefetch ⊃ cb.l2_load) reads every matched
// chunk from the local tiers, then what they miss from the fleet tier, for
// every rank of the query's world.
func (s *Server) sparsePrefetch(q lookupQuery, keys []chunkstore.Key) (map[chunkstore.Key]*chunkstore.Chunk, chunkstore.LoadStats) {
	s.bus.Publish(events.Event{Type: events.SparsePrefetchStart, RequestID: q.id})
	got, ls := s.chunks.store.GetMany(keys)
	end := time.Now()
	if got == nil {
		got = make(map[chunkstore.Key]*chunkstore.Chunk, len(keys))
	}
	if ls.L2Misses > 0 {
		// cb.l2_load: the L2 batch's own start and end, read around its reads.
		s.bus.Publish(events.Event{Type: events.L2LoadTaskStart, RequestID: q.id, Time: ls.Start,
			Attrs: []attribute.KeyValue{attribute.Int("keys", ls.L2Misses)}})
		s.bus.Publish(events.Event{Type: events.L2LoadTaskEnd, RequestID: q.id, Time: ls.Start.Add(ls.Duration), Attrs: []attribute.KeyValue{
			events.AttrChunks.Int(ls.Chunks), events.AttrBytes.Int64(ls.Bytes),
			events.AttrMs.Float64(float64(ls.Duration) / float64(time.Millisecond)),
		}})
	}
	if s.chunks.fleet != nil {
		s.fleetLoad(q, keys, got)
		end = time.Now()
	}
	s.bus.Publish(events.Event{Type: events.SparsePrefetchEnd, RequestID: q.id, Time: end, Attrs: []attribute.KeyValue{
		events.AttrNKeys.Int(ls.Keys), events.AttrL1Hits.Int(ls.L1Hits), events.AttrL2Misses.Int(ls.L2Misses),
	}})
	s.chunks.syncCounters()
	return got, ls
}

// classify (cb.classify) sorts the matched chunks: found, stale (indexed
// but gone; a stale strike when no tier holds it), available on every rank
// (usable); pending counts the chunks the lookup matched in stores still in
// flight when it stopped waiting for them (not usable by this lookup).
func (s *Server) classify(q lookupQuery, keys []chunkstore.Key, got map[chunkstore.Key]*chunkstore.Chunk) classified {
	s.bus.Publish(events.Event{Type: events.ClassifyStart, RequestID: q.id})
	cl := classified{usable: make(map[chunkstore.Key]bool, len(keys))}
	for _, k := range keys {
		if got[k] == nil {
			cl.stale++
			if s.chunks.store.Contains(k) == chunkstore.TierNone {
				s.chunks.markStale(k)
			}
			continue
		}
		cl.found++
		if s.chunks.onAllRanks(k, q.ws) {
			cl.perRankOK++
			cl.usable[k] = true
		}
	}
	s.bus.Publish(events.Event{Type: events.ClassifyEnd, RequestID: q.id, Attrs: []attribute.KeyValue{
		events.AttrFound.Int(cl.found), events.AttrStale.Int(cl.stale), events.AttrPerRankOK.Int(cl.perRankOK),
		attribute.Int("pending", q.pending),
	}})
	return cl
}

// usableMatches is the lookup's answer: the usable part of the stored
// prefix (pkeys: the prompt's leading chunks the store holds), and the
// non-prefix matches (of the server's chunk size) cut to their usable
// chunks.
func usableMatches(pkeys []chunkstore.Key, fm fingerprint.Result, cs int, usable map[chunkstore.Key]bool) []reuseplan.Match {
	isUsable := func(k chunkstore.Key) bool { return usable[k] }
	var matches []reuseplan.Match
	if m, ok := reuseplan.PrefixMatch(pkeys, cs, isUsable); ok {
		matches = append(matches, m)
	}
	for _, m := range fm.Matches {
		if m.ChunkSize == cs {
			matches = append(matches, m.Runs(cs, isUsable)...)
		}
	}
	return matches
}

// lookupResult is the answer of a lookup.
func lookupResult(h reuseplan.Hits, matches []reuseplan.Match, cl classified, fs fingerprint.MatchStats, ls chunkstore.LoadStats, cs int) *cbv1.LookupResult {
	pc := 0
	if len(matches) > 0 && matches[0].Prefix {
		pc = len(matches[0].Keys)
	}
	return &cbv1.LookupResult{
		RequestedTokens:      int32(h.Requested),
		PrefixHitTokens:      int32(h.Prefix),
		NonPrefixHitTokens:   int32(h.NonPrefix),
		HitRate:              h.Rate(),
		Matches:              rpc.MatchesToProto(matches),
		PrefixChunks:         int32(pc),
		FingerprintHits:      int32(cl.fingerprintKeys),
		StorageHits:          int32(cl.found),
		StaleChunks:          int32(cl.stale),
		NProbes:              int32(fs.Probes),
		TableHits:            int32(fs.TableHits),
		L1Hits:               int32(ls.L1Hits),
		L2Misses:             int32(ls.L2Misses),
		Found:                int32(cl.found),
		PerRankOk:            cl.perRankOK == cl.found,
		ChunkSize:            int32(cs),
		PrefixCoverageTokens: int32(h.Coverage),
	}
}

// Bounds of a lookup's wait for the stores in flight it would match.
const (
	// maxStoreWait caps the wait whatever the caller's deadline.
	maxStoreWait = 1500 * time.Millisecond
	// storeWaitReserve is kept of the caller's remaining time for the
	// lookup itself and the answer: a quarter, at least this.
	storeWaitReserve = 100 * time.Millisecond
)

// storeWait is what a lookup waited for before it ran: the time, the
// stores the caller named that had not arrived when it stopped
// (LookupRequest.pending_store_ids), and the matched chunks of stores still
// in flight when it stopped.
type storeWait struct {
	waited    time.Duration
	unarrived int
	pending   int
}

// awaitStores waits first for the stores the caller named in flight
// (pending_store_ids) to arrive, then for the stores in flight (not
// registered yet) whose chunks r's prompt would match where no registered
// chunk covers it yet: a request right after another over the same
// documents at other offsets finds them, even when its lookup overtook the
// other's store. Both waits end at most maxStoreWait after start and never
// past the caller's deadline less a reserve (a quarter of the time left, at
// least storeWaitReserve); the named stores not arrived then are counted
// unarrived, the matched chunks of those still in flight pending. Nothing
// named and no store in flight in the prompt's key space: no cost beyond a
// map lookup.
func (s *Server) awaitStores(ctx context.Context, r *cbv1.LookupRequest, start time.Time) (sw storeWait) {
	var timer *time.Timer
	expired := false // the timer fired (or ctx ended) while waiting for arrivals
	startTimer := func() <-chan time.Time {
		if timer == nil {
			until := start.Add(maxStoreWait)
			if dl, ok := ctx.Deadline(); ok {
				until = minTime(until, dl.Add(-max(storeWaitReserve, dl.Sub(start)/4)))
			}
			timer = time.NewTimer(time.Until(until)) // a deadline already past fires at once
		}
		return timer.C
	}
	defer func() {
		if timer != nil {
			timer.Stop()
			sw.waited = time.Since(start)
		}
	}()
	if ids := r.GetPendingStoreIds(); len(ids) > 0 {
		if sw.unarrived = s.chunks.arrivals.wait(ctx, ids, startTimer()); sw.unarrived > 0 {
			expired = true
		}
	}
	ns := keySpace(r.GetModel(), max(1, int(r.GetWorldSize())))
	snap := s.chunks.inflight.snapshot(ns)
	if snap == nil {
		return sw
	}
	toks, cs := r.GetTokens(), s.cfg.ChunkSize
	pm := snap.table.Match(toks, 0)
	if len(pm.Matches) == 0 {
		return sw
	}
	covered := s.registeredCoverage(ns, toks, cs)
	minLen := snap.table.MinMatch()
	awaited := map[*pendingStore]int{} // store -> its matched chunks that add reuse
	for _, m := range pm.Matches {
		if p := snap.owner(m); p != nil && m.Cur.Len()-covered(m.Cur) >= minLen {
			awaited[p] += len(m.Keys)
		}
	}
	if len(awaited) == 0 {
		return sw
	}
	if !expired {
		dones := make([]chan struct{}, 0, len(awaited))
		for p := range awaited {
			dones = append(dones, p.done)
		}
		waitClosed(ctx, startTimer(), dones)
	}
	for p, n := range awaited {
		if !isClosed(p.done) {
			sw.pending += n
		}
	}
	return sw
}

// registeredCoverage returns a function that counts the tokens of a range
// of toks that the registered chunks already cover: the stored prefix and
// the fingerprint table's matches.
func (s *Server) registeredCoverage(ns string, toks []int32, cs int) func(reuseplan.Range) int {
	pkeys := chunkstore.ChainKeys(ns, 0, toks[:reuseplan.WholeChunks(len(toks), cs)], cs)
	cover := []reuseplan.Range{{Start: 0, End: reuseplan.Coverage(s.chunks.store.PrefixChunks(pkeys), cs)}}
	if t := s.chunks.table(ns, false); t != nil {
		for _, m := range t.Match(toks, cover[0].End).Matches {
			cover = append(cover, m.Cur)
		}
	}
	return func(r reuseplan.Range) int {
		n := 0
		for _, c := range cover {
			if lo, hi := max(r.Start, c.Start), min(r.End, c.End); hi > lo {
				n += hi - lo
			}
		}
		return n
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// mergeMatches returns the non-overlapping union of two match lists (each
// non-overlapping): the longest first, then each that overlaps none kept, in
// increasing Cur.Start order.
func mergeMatches(a, b []fingerprint.Match) []fingerprint.Match {
	if len(b) == 0 {
		return a
	}
	all := append(append(make([]fingerprint.Match, 0, len(a)+len(b)), a...), b...)
	slices.SortStableFunc(all, func(x, y fingerprint.Match) int { return y.Cur.Len() - x.Cur.Len() })
	var out []fingerprint.Match
	for _, m := range all {
		if !slices.ContainsFunc(out, func(o fingerprint.Match) bool { return m.Cur.Start < o.Cur.End && o.Cur.Start < m.Cur.End }) {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(x, y fingerprint.Match) int { return x.Cur.Start - y.Cur.Start })
	return out
}
