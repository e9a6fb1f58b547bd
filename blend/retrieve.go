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

// copyJob is one copy of a retrieve: the segments of one match.
type copyJob struct {
	id      uint64
	rid     uint64 // the CopyID of its retrieve's events
	segs    []scatter.Segment
	ranges  []reuseplan.Range // the writable current ranges, missing if the copy fails
	ch      <-chan scatter.Result
	start   time.Time // CB_SCATTER_START: the copy's submission
	endSent atomic.Bool
}

func (s *Server) retrieve(ctx context.Context, r *cbv1.RetrieveRequest) (*cbv1.RetrieveResponse, error) {
	if err := checkRequestID(r.GetRequestId()); err != nil {
		return nil, err
	}
	cs := s.cfg.ChunkSize
	if c := int(r.GetChunkSize()); c != 0 && c != cs {
		return nil, status.Errorf(codes.InvalidArgument, "retrieve: chunk_size %d, the server stores chunks of %d", c, cs)
	}
	from := int(r.GetFromToken())
	if from < 0 || from > MaxTokens {
		return nil, status.Errorf(codes.InvalidArgument, "retrieve: from_token %d outside [0,%d]", from, MaxTokens)
	}
	if n := len(r.GetMatches()); n > MaxMatches {
		return nil, status.Errorf(codes.InvalidArgument, "retrieve: %d matches (at most %d)", n, MaxMatches)
	}
	rank := int(r.GetRank())
	w, err := s.acquire("retrieve", r.GetWorkerId(), rank, r.GetRegistrationToken())
	if err != nil {
		return nil, err
	}
	defer s.release(w)
	l := w.layout
	fromLayer := int(r.GetShiftedFromLayer())
	if fromLayer < 0 || fromLayer > l.NumLayers {
		return nil, status.Errorf(codes.InvalidArgument, "retrieve: shifted_from_layer %d outside [0,%d]", fromLayer, l.NumLayers)
	}
	bt := r.GetBlockTable()
	if err := checkBlockTable("retrieve", bt, l); err != nil {
		return nil, err
	}
	matches, err := rpc.MatchesFromProto(r.GetMatches())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "retrieve: %v", err)
	}
	type segment struct {
		reuseplan.Segment
		match int
	}
	var segs []segment
	matched := 0
	for mi, m := range matches {
		if err := m.Validate(cs, MaxTokens); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "retrieve: match %d: %v", mi, err)
		}
		if matched += m.Cur.Len(); matched > MaxTokens {
			return nil, status.Errorf(codes.InvalidArgument, "retrieve: matches span more than %d tokens", MaxTokens)
		}
		for _, sg := range m.Segments(cs) {
			segs = append(segs, segment{sg, mi})
		}
	}
	capacity := len(bt) * l.BlockSize
	id := r.GetRequestId()
	tp, ts := traceContext(ctx, r.GetTraceContext(), r.GetTraceState())
	// The ranks of a tensor-parallel worker retrieve one request
	// concurrently: each retrieve is its own instance (CopyID).
	rid := s.copyIDs.Add(1)
	s.publish(events.Event{Type: events.RetrieveStart, RequestID: id, CopyID: rid, TraceContext: tp, TraceState: ts,
		Attrs: []attribute.KeyValue{
			attribute.Int("from_token", from), attribute.Int("capacity_tokens", capacity),
			attribute.Int("n_matches", len(r.GetMatches())), attribute.Int("rank", rank),
			attribute.Int("shifted_from_layer", fromLayer),
		}})

	// The segments with positions to write in this pass, and their chunks.
	var resp cbv1.RetrieveResponse
	var missing []reuseplan.Range
	type todo struct {
		seg   segment
		rk    chunkstore.Key
		write reuseplan.Range // the positions written in this pass
	}
	var work []todo
	var need []chunkstore.Key
	writable := 0
	for _, sg := range segs {
		write, dropped := sg.Window(from, capacity)
		resp.Dropped += int32(dropped) // no block yet: a later pass writes them
		if write.Empty() {
			continue
		}
		writable += write.Len()
		rk, ok := s.rankKey(sg.Key, rank)
		if !ok {
			missing = append(missing, write)
			continue
		}
		work = append(work, todo{sg, rk, write})
		need = append(need, rk)
	}
	got, _ := s.store.GetMany(need)
	s.syncStoreCounters()

	// One copy per match, on the copy pool.
	var copies []*copyJob
	byMatch := map[int]*copyJob{}
	for _, t := range work {
		c := got[t.rk]
		sg := t.seg.Trim(t.write)
		ok := c != nil && c.Rank == rank && (w.model == "" || c.Model == w.model) &&
			c.Layout.Compatible(l) && sg.ChunkOff+sg.Cur.Len() <= c.Len() &&
			(!sg.Shift || c.Layout.RoPETheta == w.theta)
		if !ok {
			missing = append(missing, t.write)
			continue
		}
		cj := byMatch[t.seg.match]
		if cj == nil {
			cj = &copyJob{}
			byMatch[t.seg.match] = cj
			copies = append(copies, cj)
		}
		seg := scatter.Segment{Chunk: c, ChunkOff: sg.ChunkOff, Len: sg.Cur.Len(), CurSt: sg.Cur.Start, Shift: sg.Shift}
		if sg.Shift {
			seg.FromLayer = fromLayer
		}
		cj.segs = append(cj.segs, seg)
		cj.ranges = append(cj.ranges, t.write)
	}
	for _, cj := range copies {
		cj.id, cj.rid = s.copyIDs.Add(1), rid
		cj.start = time.Now()
		s.publish(events.Event{Type: events.ScatterStart, RequestID: id, CopyID: cj.id, ParentCopyID: cj.rid, Time: cj.start})
		cj.ch = s.pool.Submit(scatter.Job{
			Dst: w.mem, BlockTable: bt, FromToken: from, RoPE: w.rope, Segments: cj.segs,
			Done: func(res scatter.Result) {
				s.publishScatterEnd(id, cj, res)
			},
		})
	}
	// Wait for every copy, whatever ctx says: they write into the worker's
	// memory, which the worker reuses once this call returns.
	var st scatter.Stats
	var first, last time.Time // the copies' wall time: scatter_ms of cb.retrieve
	for _, cj := range copies {
		res := <-cj.ch
		s.publishScatterEnd(id, cj, res) // when the pool refused the job
		if first.IsZero() || cj.start.Before(first) {
			first = cj.start
		}
		if end := copyEnd(res); end.After(last) {
			last = end
		}
		if res.Err != nil {
			missing = append(missing, cj.ranges...)
			s.logger.Warn("scatter failed", "request_id", id, "err", res.Err)
			if errors.Is(res.Err, scatter.ErrPoolClosed) {
				continue
			}
		}
		st.Add(res.Stats)
	}
	missing = reuseplan.Merge(missing)
	resp.ScatteredTokens += int32(st.ScatteredTokens)
	resp.SlotWrites = int32(st.SlotWrites)
	resp.PartialBlocks = int32(st.PartialBlocks)
	resp.NPrefix = int32(st.NPrefix)
	resp.NShifted = int32(st.NShifted)
	resp.Dropped += int32(st.Dropped)
	resp.Bytes = st.Bytes
	resp.Missing = rpc.RangesToProto(missing)
	missingTokens := 0
	for _, m := range missing {
		missingTokens += m.Len()
	}
	var endErr error
	if writable > 0 && st.ScatteredTokens == 0 && missingTokens > 0 {
		endErr = ErrRetrieveFailed
	}
	scatterMs := 0.0
	if len(copies) > 0 {
		scatterMs = float64(last.Sub(first)) / float64(time.Millisecond)
	}
	s.publish(events.Event{Type: events.RetrieveEnd, RequestID: id, CopyID: rid, Err: endErr, Attrs: []attribute.KeyValue{
		events.AttrScatteredTokens.Int(int(resp.ScatteredTokens)), events.AttrSlotWrites.Int(int(resp.SlotWrites)),
		events.AttrPartialBlocks.Int(int(resp.PartialBlocks)), events.AttrNPrefixTokens.Int(int(resp.NPrefix)),
		events.AttrNShiftedTokens.Int(int(resp.NShifted)), events.AttrDropped.Int(int(resp.Dropped)),
		events.AttrScatterMs.Float64(scatterMs),
		attribute.Int("missing_tokens", missingTokens), events.AttrBytes.Int64(resp.Bytes),
	}})
	return &resp, nil
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
	s.publish(events.Event{Type: events.ScatterEnd, RequestID: id, CopyID: cj.id, Time: copyEnd(res), Err: res.Err,
		Attrs: []attribute.KeyValue{
			events.AttrScatteredTokens.Int(res.Stats.ScatteredTokens),
			events.AttrSlotWrites.Int(res.Stats.SlotWrites),
			events.AttrPartialBlocks.Int(res.Stats.PartialBlocks),
			events.AttrNPrefixTokens.Int(res.Stats.NPrefix),
			events.AttrNShiftedTokens.Int(res.Stats.NShifted),
			events.AttrDropped.Int(res.Stats.Dropped),
		}})
}
