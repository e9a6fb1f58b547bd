package blend

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// maxRequestID bounds the length of a request id.
const maxRequestID = 1024

type lookupJob struct {
	req       *cbv1.LookupRequest
	tc        string    // trace context of the caller
	submitted time.Time // wall clock of SubmitLookup (the cb.lookup start)
}

// lookupEntry is a submitted lookup until PollLookup delivers it. Guarded
// by Server.lmu.
type lookupEntry struct {
	job     *lookupJob
	ready   bool
	result  *cbv1.LookupResult
	readyAt time.Time
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

func (s *Server) submitLookup(ctx context.Context, r *cbv1.LookupRequest) (*cbv1.SubmitLookupResponse, error) {
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
	id := r.GetRequestId()
	job := &lookupJob{req: r, tc: traceContext(ctx, r.GetTraceContext()), submitted: time.Now()}
	now := s.now()
	s.lmu.Lock()
	if e, ok := s.lookups[id]; ok {
		if !e.ready || now.Sub(e.readyAt) < s.cfg.LookupTTL {
			s.lmu.Unlock()
			return &cbv1.SubmitLookupResponse{Accepted: false}, nil
		}
		delete(s.lookups, id)
		s.lookupsExpired.Add(1)
	}
	s.lookups[id] = &lookupEntry{job: job}
	s.lmu.Unlock()

	if !enqueue(s, s.lookupQ, job) {
		s.lmu.Lock()
		if e := s.lookups[id]; e != nil && e.job == job {
			delete(s.lookups, id)
		}
		s.lmu.Unlock()
		s.lookupsRejected.Add(1)
		return nil, status.Errorf(codes.ResourceExhausted, "lookup queue full (%d waiting)", cap(s.lookupQ))
	}
	return &cbv1.SubmitLookupResponse{Accepted: true}, nil
}

func (s *Server) pollLookup(_ context.Context, r *cbv1.PollLookupRequest) (*cbv1.PollLookupResponse, error) {
	if err := checkRequestID(r.GetRequestId()); err != nil {
		return nil, err
	}
	id := r.GetRequestId()
	now := s.now()
	s.lmu.Lock()
	defer s.lmu.Unlock()
	e := s.lookups[id]
	switch {
	case e == nil:
		return nil, status.Errorf(codes.NotFound, "no lookup for request %q (never submitted, already delivered or expired)", id)
	case !e.ready:
		return &cbv1.PollLookupResponse{Ready: false}, nil
	case now.Sub(e.readyAt) >= s.cfg.LookupTTL:
		delete(s.lookups, id)
		s.lookupsExpired.Add(1)
		return nil, status.Errorf(codes.NotFound, "lookup result for request %q expired unpolled", id)
	}
	delete(s.lookups, id)
	return &cbv1.PollLookupResponse{Ready: true, Result: e.result}, nil
}

// lookupWorker runs queued lookups until the queue is closed and drained.
func (s *Server) lookupWorker() {
	for job := range s.lookupQ {
		if s.testHookLookup != nil {
			s.testHookLookup()
		}
		res := s.lookup(job)
		s.lookupsDone.Add(1)
		now := s.now()
		s.lmu.Lock()
		if e := s.lookups[job.req.GetRequestId()]; e != nil && e.job == job {
			e.ready, e.result, e.readyAt = true, res, now
		}
		s.lmu.Unlock()
	}
}

// lookup is the unified lookup of one prompt, publishing the paired events
// of cb.lookup and its children.
func (s *Server) lookup(job *lookupJob) *cbv1.LookupResult {
	r := job.req
	id, toks, mdl := r.GetRequestId(), r.GetTokens(), r.GetModel()
	ws := max(1, int(r.GetWorldSize()))
	cs := s.cfg.ChunkSize
	s.publish(events.Event{Type: events.LookupStart, RequestID: id, Time: job.submitted, TraceContext: job.tc,
		Attrs: []attribute.KeyValue{attribute.Int("world_size", ws), attribute.String("model", mdl)}})

	// Prefix leg (mp.lookup_prefetch): the chain keys of the full chunks.
	s.publish(events.Event{Type: events.PrefixLookupStart, RequestID: id})
	full := len(toks) / cs
	pkeys := chunkstore.ChainKeys(mdl, 0, toks[:full*cs], cs)
	prefixChunks := s.store.PrefixChunks(pkeys)
	s.publish(events.Event{Type: events.PrefixLookupEnd, RequestID: id,
		Attrs: []attribute.KeyValue{events.AttrPrefixChunks.Int(prefixChunks)}})

	// Non-prefix leg (cb.fingerprint_match), after the prefix coverage.
	s.publish(events.Event{Type: events.FingerprintMatchStart, RequestID: id})
	var fm fingerprint.Result
	if t := s.table(mdl, false); t != nil {
		fm = t.Match(toks, prefixChunks*cs)
	}
	s.publish(events.Event{Type: events.FingerprintMatchEnd, RequestID: id, Attrs: []attribute.KeyValue{
		events.AttrNProbes.Int(fm.Stats.Probes), events.AttrTableHits.Int(fm.Stats.TableHits), events.AttrMatches.Int(len(fm.Matches)),
	}})

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
	if ls.L2Misses > 0 {
		s.publish(events.Event{Type: events.L2LoadTaskStart, RequestID: id, Time: end.Add(-ls.Duration),
			Attrs: []attribute.KeyValue{attribute.Int("keys", ls.L2Misses)}})
		s.publish(events.Event{Type: events.L2LoadTaskEnd, RequestID: id, Time: end, Attrs: []attribute.KeyValue{
			events.AttrChunks.Int(ls.Chunks), events.AttrBytes.Int64(ls.Bytes),
			events.AttrMs.Float64(float64(ls.Duration) / float64(time.Millisecond)),
		}})
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
	var matches []*cbv1.Match
	if pc > 0 {
		matches = append(matches, &cbv1.Match{
			StoredSt: 0, StoredEd: int32(pc * cs), CurSt: 0, CurEd: int32(pc * cs),
			Prefix: true, ChunkKeys: keyBytes(pkeys[:pc]), FirstChunkStart: 0,
		})
	}
	nonPrefix := 0
	for _, m := range fm.Matches {
		for _, p := range usablePieces(m, usable) {
			matches = append(matches, p)
			nonPrefix += int(p.CurEd - p.CurSt)
		}
	}
	prefixHit := pc * cs
	res := &cbv1.LookupResult{
		RequestedTokens:    int32(len(toks)),
		PrefixHitTokens:    int32(prefixHit),
		NonPrefixHitTokens: int32(nonPrefix),
		HitRate:            float64(prefixHit+nonPrefix) / float64(len(toks)),
		Matches:            matches,
		PrefixChunks:       int32(pc),
		FingerprintHits:    int32(fpKeys),
		StorageHits:        int32(found),
		StaleChunks:        int32(stale),
		NProbes:            int32(fm.Stats.Probes),
		TableHits:          int32(fm.Stats.TableHits),
		L1Hits:             int32(ls.L1Hits),
		L2Misses:           int32(ls.L2Misses),
		Found:              int32(found),
		PerRankOk:          perRankOK == found,
		ChunkSize:          int32(cs),
	}
	s.publish(events.Event{Type: events.LookupEnd, RequestID: id, Attrs: []attribute.KeyValue{
		events.AttrRequestedTokens.Int(len(toks)),
		events.AttrPrefixHitTokens.Int(prefixHit),
		events.AttrNonPrefixHitTokens.Int(nonPrefix),
		events.AttrHitTokens.Int(prefixHit + nonPrefix),
		events.AttrHitRate.Float64(res.HitRate),
		events.AttrFingerprintHits.Int(fpKeys),
		events.AttrStorageHits.Int(found),
		events.AttrStaleChunks.Int(stale),
		events.AttrPrefixChunks.Int(pc),
	}})
	return res
}

// onAllRanks reports whether the chunk of rank-0 key k is held for every
// rank 1..ws-1 too.
func (s *Server) onAllRanks(k chunkstore.Key, ws int) bool {
	for rank := 1; rank < ws; rank++ {
		rk, ok := s.rankKey(k, rank)
		if !ok || s.store.Contains(rk) == chunkstore.TierNone {
			return false
		}
	}
	return true
}

// usablePieces cuts a fingerprint match into the maximal runs of its chunks
// that are usable, as cbv1 matches.
func usablePieces(m fingerprint.Match, usable map[chunkstore.Key]bool) []*cbv1.Match {
	cs := m.ChunkSize
	var out []*cbv1.Match
	run := -1 // first chunk index of the current run
	flush := func(last int) {
		if run < 0 {
			return
		}
		st := max(m.StoredSt, m.FirstChunkStart+run*cs)
		ed := min(m.StoredEd, m.FirstChunkStart+(last+1)*cs)
		if ed > st {
			cur := m.CurSt + (st - m.StoredSt)
			out = append(out, &cbv1.Match{
				StoredSt: int32(st), StoredEd: int32(ed), CurSt: int32(cur), CurEd: int32(cur + ed - st),
				ChunkKeys: keyBytes(m.Keys[run : last+1]), FirstChunkStart: int32(m.FirstChunkStart + run*cs),
			})
		}
		run = -1
	}
	for j, k := range m.Keys {
		if usable[k] {
			if run < 0 {
				run = j
			}
			continue
		}
		flush(j - 1)
	}
	flush(len(m.Keys) - 1)
	return out
}

func keyBytes(keys []chunkstore.Key) [][]byte {
	out := make([][]byte, len(keys))
	for i := range keys {
		out[i] = append([]byte(nil), keys[i][:]...)
	}
	return out
}
