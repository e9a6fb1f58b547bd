package blend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/scatter"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// ErrRetrieveFailed is the error of a retrieve's CB_RETRIEVE_END (and so of
// its cb.retrieve span) when nothing could be written.
var ErrRetrieveFailed = errors.New("blend: retrieve failed: no matched chunk could be served")

// segment is the part of one match that lies in one stored chunk.
type segment struct {
	match    int
	key      chunkstore.Key // the rank-0 key from the lookup
	chunkOff int            // first token in the chunk
	n        int
	curSt    int
	shift    bool
}

// checkMatch validates a match of a Retrieve and cuts it into per-chunk
// segments.
func checkMatch(mi int, m *cbv1.Match, cs int) ([]segment, error) {
	ss, se := int(m.GetStoredSt()), int(m.GetStoredEd())
	cst, ced := int(m.GetCurSt()), int(m.GetCurEd())
	fcs := int(m.GetFirstChunkStart())
	switch {
	case cst < 0 || ced <= cst || ced > MaxTokens:
		return nil, fmt.Errorf("match %d: current range [%d,%d)", mi, cst, ced)
	case ss < 0 || se-ss != ced-cst:
		return nil, fmt.Errorf("match %d: stored range [%d,%d) does not match current range [%d,%d)", mi, ss, se, cst, ced)
	case fcs < 0 || fcs > ss:
		return nil, fmt.Errorf("match %d: first_chunk_start %d after stored_st %d", mi, fcs, ss)
	case m.GetPrefix() && ss != cst:
		return nil, fmt.Errorf("match %d: prefix match with stored_st %d != cur_st %d", mi, ss, cst)
	}
	first, last := (ss-fcs)/cs, (se-1-fcs)/cs
	if last >= len(m.GetChunkKeys()) {
		return nil, fmt.Errorf("match %d: %d chunk keys for stored range [%d,%d) from %d", mi, len(m.GetChunkKeys()), ss, se, fcs)
	}
	segs := make([]segment, 0, last-first+1)
	for j := first; j <= last; j++ {
		k, err := chunkstore.KeyFromBytes(m.GetChunkKeys()[j])
		if err != nil {
			return nil, fmt.Errorf("match %d: %w", mi, err)
		}
		c0 := fcs + j*cs
		a, b := max(ss, c0), min(se, c0+cs)
		segs = append(segs, segment{match: mi, key: k, chunkOff: a - c0, n: b - a, curSt: cst + (a - ss), shift: !m.GetPrefix()})
	}
	return segs, nil
}

// copyJob is one copy of a retrieve: the segments of one match.
type copyJob struct {
	id      uint64
	segs    []scatter.Segment
	ranges  []rng // the writable current ranges, missing if the copy fails
	ch      <-chan scatter.Result
	endSent atomic.Bool
}

type rng struct{ st, ed int }

func (s *Server) retrieve(ctx context.Context, r *cbv1.RetrieveRequest) (*cbv1.RetrieveResponse, error) {
	if err := checkRequestID(r.GetRequestId()); err != nil {
		return nil, err
	}
	if r.GetWorkerId() == "" || r.GetRank() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "retrieve: bad worker_id %q / rank %d", r.GetWorkerId(), r.GetRank())
	}
	cs := s.cfg.ChunkSize
	if c := int(r.GetChunkSize()); c != 0 && c != cs {
		return nil, status.Errorf(codes.InvalidArgument, "retrieve: chunk_size %d, the server stores chunks of %d", c, cs)
	}
	from := int(r.GetFromToken())
	if from < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "retrieve: negative from_token %d", from)
	}
	rank := int(r.GetRank())
	w := s.acquire(r.GetWorkerId(), rank)
	if w == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "retrieve: worker %q rank %d has no KV memory registered (RegisterKV first)", r.GetWorkerId(), rank)
	}
	defer s.release(w)
	l := w.layout
	bt := r.GetBlockTable()
	for i, b := range bt {
		if b < 0 || int(b) >= l.NumBlocks {
			return nil, status.Errorf(codes.InvalidArgument, "retrieve: block_table[%d] = %d outside the %d blocks", i, b, l.NumBlocks)
		}
	}
	var segs []segment
	for mi, m := range r.GetMatches() {
		ms, err := checkMatch(mi, m, cs)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "retrieve: %v", err)
		}
		segs = append(segs, ms...)
	}
	capacity := len(bt) * l.BlockSize
	id := r.GetRequestId()
	s.publish(events.Event{Type: events.RetrieveStart, RequestID: id, TraceContext: traceContext(ctx, r.GetTraceContext()),
		Attrs: []attribute.KeyValue{
			attribute.Int("from_token", from), attribute.Int("capacity_tokens", capacity),
			attribute.Int("n_matches", len(r.GetMatches())), attribute.Int("rank", rank),
		}})

	// The segments with positions to write in this pass, and their chunks.
	var resp cbv1.RetrieveResponse
	var missing []rng
	type todo struct {
		seg    segment
		rk     chunkstore.Key
		lo, hi int // writable current positions [lo, hi)
	}
	var work []todo
	var need []chunkstore.Key
	writable := 0
	for _, sg := range segs {
		lo, hi := max(sg.curSt, from), sg.curSt+sg.n
		if hi <= lo {
			continue // written by an earlier pass
		}
		if lo >= capacity {
			resp.Dropped += int32(hi - lo) // no block yet: a later pass writes it
			continue
		}
		writable += min(hi, capacity) - lo
		rk, ok := s.rankKey(sg.key, rank)
		if !ok {
			missing = append(missing, rng{lo, min(hi, capacity)})
			continue
		}
		work = append(work, todo{sg, rk, lo, hi})
		need = append(need, rk)
	}
	got, _ := s.store.GetMany(need)
	s.syncStoreCounters()

	// One copy per match, on the copy pool.
	var copies []*copyJob
	byMatch := map[int]*copyJob{}
	for _, t := range work {
		c := got[t.rk]
		sg := t.seg
		ok := c != nil && c.Rank == rank && (w.model == "" || c.Model == w.model) &&
			c.Layout.Compatible(l) && sg.chunkOff+sg.n <= c.Len() &&
			(!sg.shift || c.Layout.RoPETheta == w.theta)
		if !ok {
			missing = append(missing, rng{t.lo, min(t.hi, capacity)})
			continue
		}
		cj := byMatch[sg.match]
		if cj == nil {
			cj = &copyJob{}
			byMatch[sg.match] = cj
			copies = append(copies, cj)
		}
		cj.segs = append(cj.segs, scatter.Segment{Chunk: c, ChunkOff: sg.chunkOff, Len: sg.n, CurSt: sg.curSt, Shift: sg.shift})
		cj.ranges = append(cj.ranges, rng{t.lo, min(t.hi, capacity)})
	}
	for _, cj := range copies {
		cj.id = s.copyIDs.Add(1)
		s.publish(events.Event{Type: events.ScatterStart, RequestID: id, CopyID: cj.id})
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
	for _, cj := range copies {
		res := <-cj.ch
		s.publishScatterEnd(id, cj, res) // when the pool refused the job
		if res.Err != nil {
			missing = append(missing, cj.ranges...)
			s.logger.Warn("scatter failed", "request_id", id, "err", res.Err)
			if errors.Is(res.Err, scatter.ErrPoolClosed) {
				continue
			}
		}
		st.Add(res.Stats)
	}
	missing = mergeRanges(missing)
	resp.ScatteredTokens += int32(st.ScatteredTokens)
	resp.SlotWrites = int32(st.SlotWrites)
	resp.PartialBlocks = int32(st.PartialBlocks)
	resp.NPrefix = int32(st.NPrefix)
	resp.NShifted = int32(st.NShifted)
	resp.Dropped += int32(st.Dropped)
	resp.Bytes = st.Bytes
	missingTokens := 0
	for _, m := range missing {
		resp.Missing = append(resp.Missing, &cbv1.Range{Start: int32(m.st), End: int32(m.ed)})
		missingTokens += m.ed - m.st
	}
	var endErr error
	if writable > 0 && st.ScatteredTokens == 0 && missingTokens > 0 {
		endErr = ErrRetrieveFailed
	}
	s.publish(events.Event{Type: events.RetrieveEnd, RequestID: id, Err: endErr, Attrs: []attribute.KeyValue{
		events.AttrScatteredTokens.Int(int(resp.ScatteredTokens)), events.AttrDropped.Int(int(resp.Dropped)),
		attribute.Int("missing_tokens", missingTokens), events.AttrBytes.Int64(resp.Bytes),
	}})
	return &resp, nil
}

// publishScatterEnd publishes a copy's CB_SCATTER_END once, at the time the
// copy finished.
func (s *Server) publishScatterEnd(id string, cj *copyJob, res scatter.Result) {
	if cj.endSent.Swap(true) {
		return
	}
	s.publish(events.Event{Type: events.ScatterEnd, RequestID: id, CopyID: cj.id, Time: res.End, Err: res.Err,
		Attrs: []attribute.KeyValue{
			events.AttrScatteredTokens.Int(res.Stats.ScatteredTokens),
			events.AttrSlotWrites.Int(res.Stats.SlotWrites),
			events.AttrPartialBlocks.Int(res.Stats.PartialBlocks),
			events.AttrNPrefix.Int(res.Stats.NPrefix),
			events.AttrNShifted.Int(res.Stats.NShifted),
			events.AttrDropped.Int(res.Stats.Dropped),
		}})
}

// mergeRanges sorts ranges and merges those that overlap or touch,
// dropping empty ones.
func mergeRanges(rs []rng) []rng {
	rs = slices.DeleteFunc(rs, func(r rng) bool { return r.ed <= r.st })
	slices.SortFunc(rs, func(a, b rng) int { return a.st - b.st })
	var out []rng
	for _, r := range rs {
		if n := len(out); n > 0 && r.st <= out[n-1].ed {
			out[n-1].ed = max(out[n-1].ed, r.ed)
			continue
		}
		out = append(out, r)
	}
	return out
}
