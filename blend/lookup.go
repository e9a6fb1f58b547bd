package blend

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// maxRequestID bounds the length of a request id.
const maxRequestID = 1024

type lookupJob struct {
	req       *cbv1.LookupRequest
	tc, ts    string    // trace context (traceparent, tracestate) of the caller
	submitted time.Time // wall clock of the Lookup call (the cb.lookup start)
}

func checkRequestID(id string) error {
	if id == "" {
		return status.Error(codes.InvalidArgument, "missing request_id")
	}
	if len(id) > maxRequestID {
		return status.Errorf(codes.InvalidArgument, "request_id of %d bytes exceeds %d", len(id), maxRequestID)
	}
	return nil
}

// lookupRPC queues the lookup on the bounded lookup pool and answers when
// it is done, or when the caller's context ends first (the queued lookup is
// then skipped, counted as abandoned, when a worker reaches it).
func (s *Server) lookupRPC(ctx context.Context, r *cbv1.LookupRequest) (*cbv1.LookupResult, error) {
	if err := checkRequestID(r.GetRequestId()); err != nil {
		return nil, err
	}
	switch n := len(r.GetTokens()); {
	case n == 0:
		return nil, status.Error(codes.InvalidArgument, "lookup: no tokens")
	case n > MaxTokens:
		return nil, status.Errorf(codes.InvalidArgument, "lookup: %d tokens exceed %d", n, MaxTokens)
	}
	if ws := r.GetWorldSize(); ws < 0 || ws > MaxWorldSize {
		return nil, status.Errorf(codes.InvalidArgument, "lookup: world_size %d outside 0..%d", ws, MaxWorldSize)
	}
	if len(r.GetModel()) > chunkstore.MaxModelLen {
		return nil, status.Errorf(codes.InvalidArgument, "lookup: model name of %d bytes", len(r.GetModel()))
	}
	job := &lookupJob{req: r, submitted: time.Now()}
	job.tc, job.ts = traceContext(ctx, r.GetTraceContext(), r.GetTraceState())
	done := make(chan *cbv1.LookupResult, 1) // never blocks the pool
	run := func() {
		if ctx.Err() != nil {
			s.lookupsAbandoned.Add(1)
			return
		}
		done <- s.lookup(job)
		s.lookupsDone.Add(1)
	}
	if !enqueue(s, s.lookupQ, run) {
		s.lookupsRejected.Add(1)
		return nil, status.Errorf(codes.ResourceExhausted, "lookup queue full (%d waiting)", cap(s.lookupQ))
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

// lookup is the unified lookup of one prompt, publishing the paired events
// of cb.lookup and its children.
func (s *Server) lookup(job *lookupJob) *cbv1.LookupResult {
	r := job.req
	id, toks, mdl := r.GetRequestId(), r.GetTokens(), r.GetModel()
	ws := max(1, int(r.GetWorldSize()))
	cs := s.cfg.ChunkSize
	s.publish(events.Event{Type: events.LookupStart, RequestID: id, Time: job.submitted, TraceContext: job.tc, TraceState: job.ts,
		Attrs: []attribute.KeyValue{attribute.Int("world_size", ws), attribute.String("model", mdl)}})

	// Prefix leg (mp.lookup_prefetch): the chain keys of the full chunks.
	s.publish(events.Event{Type: events.PrefixLookupStart, RequestID: id})
	full := len(toks) / cs
	ns := keySpace(mdl, ws)
	pkeys := chunkstore.ChainKeys(ns, 0, toks[:full*cs], cs)
	prefixChunks := s.store.PrefixChunks(pkeys)
	s.publish(events.Event{Type: events.PrefixLookupEnd, RequestID: id,
		Attrs: []attribute.KeyValue{events.AttrPrefixChunks.Int(prefixChunks)}})

	// Non-prefix leg (cb.fingerprint_match, or cb.coordinator_match with a
	// fleet tier), after the prefix coverage.
	fm := s.nonPrefixMatch(id, ns, toks, prefixChunks*cs)

	// Sparse prefetch (cb.sparse_prefetch ⊃ cb.l2_load) of every matched chunk.
	keys := make([]chunkstore.Key, 0, prefixChunks+2*len(fm.Matches))
	seen := make(map[chunkstore.Key]bool, cap(keys))
	keys = append(keys, pkeys[:prefixChunks]...)
	for _, k := range keys {
		seen[k] = true
	}
	fpKeys := 0
	for _, m := range fm.Matches {
		for _, k := range m.Keys {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
				fpKeys++
			}
		}
	}
	s.publish(events.Event{Type: events.SparsePrefetchStart, RequestID: id})
	got, ls := s.store.GetMany(keys)
	end := time.Now()
	if got == nil {
		got = make(map[chunkstore.Key]*chunkstore.Chunk, len(keys))
	}
	if ls.L2Misses > 0 {
		s.publish(events.Event{Type: events.L2LoadTaskStart, RequestID: id, Time: end.Add(-ls.Duration),
			Attrs: []attribute.KeyValue{attribute.Int("keys", ls.L2Misses)}})
		s.publish(events.Event{Type: events.L2LoadTaskEnd, RequestID: id, Time: end, Attrs: []attribute.KeyValue{
			events.AttrChunks.Int(ls.Chunks), events.AttrBytes.Int64(ls.Bytes),
			events.AttrMs.Float64(float64(ls.Duration) / float64(time.Millisecond)),
		}})
	}
	if s.fleet != nil && ws == 1 {
		s.fleetLoad(id, mdl, keys, got)
		end = time.Now()
	}
	s.publish(events.Event{Type: events.SparsePrefetchEnd, RequestID: id, Time: end, Attrs: []attribute.KeyValue{
		events.AttrNKeys.Int(ls.Keys), events.AttrL1Hits.Int(ls.L1Hits), events.AttrL2Misses.Int(ls.L2Misses),
	}})
	s.syncStoreCounters()

	// Classify (cb.classify): found, stale, available on every rank.
	s.publish(events.Event{Type: events.ClassifyStart, RequestID: id})
	usable := make(map[chunkstore.Key]bool, len(keys))
	found, stale, perRankOK := 0, 0, 0
	for _, k := range keys {
		if got[k] == nil {
			stale++
			if s.store.Contains(k) == chunkstore.TierNone {
				s.markStale(k)
			}
			continue
		}
		found++
		if s.onAllRanks(k, ws) {
			perRankOK++
			usable[k] = true
		}
	}
	s.publish(events.Event{Type: events.ClassifyEnd, RequestID: id, Attrs: []attribute.KeyValue{
		events.AttrFound.Int(found), events.AttrStale.Int(stale), events.AttrPerRankOK.Int(perRankOK),
	}})

	// The result: the usable prefix, and the non-prefix matches cut to their
	// usable chunks.
	pc := 0
	for pc < prefixChunks && usable[pkeys[pc]] {
		pc++
	}
	var matches []reuseplan.Match
	if pc > 0 {
		matches = append(matches, reuseplan.Match{
			Cur: reuseplan.Range{End: pc * cs}, Prefix: true, Keys: pkeys[:pc],
		})
	}
	nonPrefix := 0
	isUsable := func(k chunkstore.Key) bool { return usable[k] }
	for _, m := range fm.Matches {
		for _, p := range m.Plan().Runs(m.ChunkSize, isUsable) {
			matches = append(matches, p)
			nonPrefix += p.Cur.Len()
		}
	}
	prefixHit := pc * cs
	// The prefix leg covers the stored leading chunks; the non-prefix leg
	// searched the complement (cur_st >= coverage), so the two hit counts
	// are disjoint and add up.
	coverage := prefixChunks * cs
	res := &cbv1.LookupResult{
		RequestedTokens:      int32(len(toks)),
		PrefixHitTokens:      int32(prefixHit),
		NonPrefixHitTokens:   int32(nonPrefix),
		HitRate:              float64(prefixHit+nonPrefix) / float64(len(toks)),
		Matches:              rpc.MatchesToProto(matches),
		PrefixChunks:         int32(pc),
		FingerprintHits:      int32(fpKeys),
		StorageHits:          int32(found),
		StaleChunks:          int32(stale),
		NProbes:              int32(fm.Stats.Probes),
		TableHits:            int32(fm.Stats.TableHits),
		L1Hits:               int32(ls.L1Hits),
		L2Misses:             int32(ls.L2Misses),
		Found:                int32(found),
		PerRankOk:            perRankOK == found,
		ChunkSize:            int32(cs),
		PrefixCoverageTokens: int32(coverage),
	}
	s.publish(events.Event{Type: events.LookupEnd, RequestID: id, Attrs: []attribute.KeyValue{
		events.AttrRequestedTokens.Int(len(toks)),
		events.AttrPrefixHitTokens.Int(prefixHit),
		events.AttrNonPrefixHitTokens.Int(nonPrefix),
		events.AttrHitTokens.Int(prefixHit + nonPrefix),
		events.AttrHitRate.Float64(res.HitRate),
		events.AttrPrefixCoverageTokens.Int(coverage),
		events.AttrNNonPrefixTokens.Int(len(toks) - coverage),
		events.AttrFingerprintHits.Int(fpKeys),
		events.AttrStorageHits.Int(found),
		events.AttrStaleChunks.Int(stale),
		events.AttrPrefixChunks.Int(pc),
		events.AttrLookup.String("done"),
	}})
	return res
}

// onAllRanks reports whether the chunk of rank-0 key k is held for every
// rank 1..ws-1 too.
func (s *Server) onAllRanks(k chunkstore.Key, ws int) bool {
	for rank := 1; rank < ws; rank++ {
		rk, ok := s.rankKey(k, rank)
		if !ok || !s.store.Present(rk) {
			return false
		}
	}
	return true
}
