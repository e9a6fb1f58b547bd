package blend

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/scatter"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// ErrRetrieveFailed is the error of a retrieve's CB_RETRIEVE_END (and so of
// its cb.retrieve span) when nothing could be written.
var ErrRetrieveFailed = errors.New("blend: retrieve failed: no matched chunk could be served")

// copies is the part of a Server that owns the copies into the workers'
// memories: the copy pool, and the ids pairing the events of retrieves,
// their copies and stores.
type copies struct {
	pool *scatter.Pool
	ids  atomic.Uint64
}

// retrievePass is one validated Retrieve: the matches to write into the
// registration's memory through the block table, from position from up to
// the table's capacity.
type retrievePass struct {
	id                        string
	w                         *workerMem
	rank, from, fromLayer, cs int
	bt                        []int32
	capacity                  int // positions the block table holds
	matches                   []reuseplan.Match
}

// copyJob is one copy of a retrieve: the segments of one match.
type copyJob struct {
	id, rid uint64 // its CopyID, and its retrieve's
	copy    scatter.Copy
	dropped int // the match's positions left to a later pass
	ch      <-chan scatter.Result
	start   time.Time // CB_SCATTER_START: the copy's submission
	endSent atomic.Bool
}

// copyPlan is what a retrieve pass copies and what it cannot.
type copyPlan struct {
	copies  []*copyJob
	missing []reuseplan.Range // positions to write that no chunk serves
	dropped int               // positions left to a later pass
}

// checkRetrieve bounds the fields of a Retrieve that need no registration.
func checkRetrieve(r *cbv1.RetrieveRequest, cs int) error {
	if err := checkRequest("retrieve", r.GetRequestId(), -1); err != nil {
		return err
	}
	if c := int(r.GetChunkSize()); c != 0 && c != cs {
		return status.Errorf(codes.InvalidArgument, "retrieve: chunk_size %d, the server stores chunks of %d", c, cs)
	}
	if from := r.GetFromToken(); from < 0 || from > MaxTokens {
		return status.Errorf(codes.InvalidArgument, "retrieve: from_token %d outside [0,%d]", from, MaxTokens)
	}
	if n := len(r.GetMatches()); n > MaxMatches {
		return status.Errorf(codes.InvalidArgument, "retrieve: %d matches (at most %d)", n, MaxMatches)
	}
	return nil
}

// newRetrievePass checks a Retrieve against registration w: the layer to
// re-RoPE from, the block table, and every match.
func newRetrievePass(r *cbv1.RetrieveRequest, w *workerMem, cs int) (*retrievePass, error) {
	l := w.layout
	p := &retrievePass{id: r.GetRequestId(), w: w, rank: w.key.rank, from: int(r.GetFromToken()),
		fromLayer: int(r.GetShiftedFromLayer()), cs: cs, bt: r.GetBlockTable()}
	if p.fromLayer < 0 || p.fromLayer > l.NumLayers {
		return nil, status.Errorf(codes.InvalidArgument, "retrieve: shifted_from_layer %d outside [0,%d]", p.fromLayer, l.NumLayers)
	}
	if err := checkBlockTable("retrieve", p.bt, l); err != nil {
		return nil, err
	}
	p.capacity = len(p.bt) * l.BlockSize
	var err error
	if p.matches, err = rpc.MatchesFromProto(r.GetMatches()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "retrieve: %v", err)
	}
	matched := 0
	for mi, m := range p.matches {
		if err := m.Validate(cs, MaxTokens); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "retrieve: match %d: %v", mi, err)
		}
		if matched += m.Len(); matched > MaxTokens {
			return nil, status.Errorf(codes.InvalidArgument, "retrieve: matches span more than %d tokens", MaxTokens)
		}
	}
	return p, nil
}

func (s *Server) retrieve(ctx context.Context, r *cbv1.RetrieveRequest) (*cbv1.RetrieveResponse, error) {
	if err := checkRetrieve(r, s.cfg.ChunkSize); err != nil {
		return nil, err
	}
	w, err := s.regs.acquire("retrieve", r.GetWorkerId(), int(r.GetRank()), r.GetRegistrationToken())
	if err != nil {
		return nil, err
	}
	defer s.regs.release(w)
	p, err := newRetrievePass(r, w, s.cfg.ChunkSize)
	if err != nil {
		return nil, err
	}
	tp, ts := traceContext(ctx, r.GetTraceContext(), r.GetTraceState())
	// The ranks of a tensor-parallel worker retrieve one request
	// concurrently: each retrieve is its own instance (CopyID).
	rid := s.copies.ids.Add(1)
	s.bus.Publish(events.Event{Type: events.RetrieveStart, RequestID: p.id, CopyID: rid, TraceContext: tp, TraceState: ts,
		Attrs: []attribute.KeyValue{
			attribute.Int("from_token", p.from), attribute.Int("capacity_tokens", p.capacity),
			attribute.Int("n_matches", len(p.matches)), attribute.Int("rank", p.rank),
			attribute.Int("shifted_from_layer", p.fromLayer),
		}})
	plan := s.planCopies(p)
	st, scatterMs := s.runCopies(p.id, rid, &plan)
	resp := &cbv1.RetrieveResponse{
		ScatteredTokens: int32(st.ScatteredTokens), SlotWrites: int32(st.SlotWrites), PartialBlocks: int32(st.PartialBlocks),
		NPrefix: int32(st.NPrefix), NShifted: int32(st.NShifted), Dropped: int32(plan.dropped), Bytes: st.Bytes,
		Missing: rpc.RangesToProto(plan.missing),
	}
	missingTokens := reuseplan.Tokens(plan.missing)
	var endErr error
	if st.ScatteredTokens == 0 && missingTokens > 0 { // missing positions are writable ones
		endErr = ErrRetrieveFailed
	}
	s.bus.Publish(events.Event{Type: events.RetrieveEnd, RequestID: p.id, CopyID: rid, Err: endErr, Attrs: []attribute.KeyValue{
		events.AttrScatteredTokens.Int(int(resp.ScatteredTokens)), events.AttrSlotWrites.Int(int(resp.SlotWrites)),
		events.AttrPartialBlocks.Int(int(resp.PartialBlocks)), events.AttrNPrefixTokens.Int(int(resp.NPrefix)),
		events.AttrNShiftedTokens.Int(int(resp.NShifted)), events.AttrDropped.Int(int(resp.Dropped)),
		events.AttrScatterMs.Float64(scatterMs),
		attribute.Int("missing_tokens", missingTokens), events.AttrBytes.Int64(resp.Bytes),
	}})
	return resp, nil
}

// planCopies cuts the pass's matches into their segments, windowed to what
// the pass writes (reuseplan.Window), and makes one copy per match of the
// segments whose chunk the server holds for the rank and can serve; the
// others are missing.
func (s *Server) planCopies(p *retrievePass) copyPlan {
	var plan copyPlan
	jobs := make([]*copyJob, len(p.matches))
	var need []chunkstore.Key
	for mi, m := range p.matches {
		write, dropped := reuseplan.Window(m.Segments(p.cs), p.from, p.capacity)
		plan.dropped += dropped
		cj := &copyJob{dropped: dropped, copy: scatter.Copy{Dst: p.w.mem, BlockTable: p.bt, RoPE: p.w.rope, FromLayer: p.fromLayer,
			Chunks: make(map[reuseplan.Key]*chunkstore.Chunk, len(write))}}
		for _, sg := range write {
			rk, ok := s.chunks.rankKey(sg.Key, p.rank)
			if !ok {
				plan.missing = append(plan.missing, sg.Cur)
				continue
			}
			sg.Key = rk
			cj.copy.Segments = append(cj.copy.Segments, sg)
			need = append(need, rk)
		}
		jobs[mi] = cj
	}
	got, _ := s.chunks.store.GetMany(need)
	s.chunks.syncCounters()
	for _, cj := range jobs {
		segs := cj.copy.Segments
		cj.copy.Segments = nil
		for _, sg := range segs {
			if c := got[sg.Key]; p.serves(c, sg) {
				cj.copy.Chunks[sg.Key] = c
				cj.copy.Segments = append(cj.copy.Segments, sg)
				continue
			}
			plan.missing = append(plan.missing, sg.Cur)
		}
		if len(cj.copy.Segments) > 0 {
			plan.copies = append(plan.copies, cj)
		}
	}
	return plan
}

// serves reports whether chunk c can fill segment sg of the pass: the
// rank's, of the registration's model and layout, long enough, and for a
// re-RoPE'd segment stored with the registration's RoPE base.
func (p *retrievePass) serves(c *chunkstore.Chunk, sg reuseplan.Segment) bool {
	w := p.w
	return c != nil && c.Rank == p.rank && (w.model == "" || c.Model == w.model) &&
		c.Layout.Compatible(w.layout) && sg.ChunkOff+sg.Cur.Len() <= c.Len() &&
		(!sg.Shift || c.Layout.RoPETheta == w.theta)
}

// runCopies submits the plan's copies to the copy pool and waits for every
// one, whatever the caller's context says (the worker reuses its memory once
// the retrieve returns); a failed copy's ranges are missing. It returns the
// copies' totals and their wall time in milliseconds.
func (s *Server) runCopies(id string, rid uint64, plan *copyPlan) (scatter.Stats, float64) {
	for _, cj := range plan.copies {
		cj.id, cj.rid = s.copies.ids.Add(1), rid
		cj.start = time.Now()
		s.bus.Publish(events.Event{Type: events.ScatterStart, RequestID: id, CopyID: cj.id, ParentCopyID: cj.rid, Time: cj.start})
		cj.ch = s.copies.pool.Submit(scatter.Job{Copy: cj.copy, Done: func(res scatter.Result) { s.publishScatterEnd(id, cj, res) }})
	}
	var st scatter.Stats
	var first, last time.Time
	for _, cj := range plan.copies {
		res := <-cj.ch
		s.publishScatterEnd(id, cj, res) // when the pool refused the job
		if first.IsZero() || cj.start.Before(first) {
			first = cj.start
		}
		if end := copyEnd(res); end.After(last) {
			last = end
		}
		if res.Err != nil {
			plan.missing = append(plan.missing, reuseplan.Ranges(cj.copy.Segments)...)
			s.logger.Warn("scatter failed", "request_id", id, "err", res.Err)
			if errors.Is(res.Err, scatter.ErrPoolClosed) {
				continue
			}
		}
		st.Add(res.Stats)
	}
	plan.missing = reuseplan.Merge(plan.missing)
	if len(plan.copies) == 0 {
		return st, 0
	}
	return st, float64(last.Sub(first)) / float64(time.Millisecond)
}

// copyEnd is when a copy finished: its End, or now for a copy the pool
// refused (it never ran, and this is when the retrieve learnt so).
func copyEnd(res scatter.Result) time.Time {
	if res.End.IsZero() {
		return time.Now()
	}
	return res.End
}

// publishScatterEnd publishes a copy's CB_SCATTER_END once, at the time the
// copy finished.
func (s *Server) publishScatterEnd(id string, cj *copyJob, res scatter.Result) {
	if cj.endSent.Swap(true) {
		return
	}
	s.bus.Publish(events.Event{Type: events.ScatterEnd, RequestID: id, CopyID: cj.id, Time: copyEnd(res), Err: res.Err,
		Attrs: []attribute.KeyValue{
			events.AttrScatteredTokens.Int(res.Stats.ScatteredTokens),
			events.AttrSlotWrites.Int(res.Stats.SlotWrites),
			events.AttrPartialBlocks.Int(res.Stats.PartialBlocks),
			events.AttrNPrefixTokens.Int(res.Stats.NPrefix),
			events.AttrNShiftedTokens.Int(res.Stats.NShifted),
			events.AttrDropped.Int(cj.dropped),
		}})
}
