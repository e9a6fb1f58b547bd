package blend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/blend/scatter"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// storeKV checks a store against the caller's registration (the model is
// the registration's, or the request's for a registration without one; only
// the blocks the tokens occupy are read), then stores its chunks.
func (s *Server) storeKV(ctx context.Context, r *cbv1.StoreRequest) (*cbv1.StoreResponse, error) {
	id, n := r.GetRequestId(), len(r.GetTokens())
	if err := checkRequest("store", id, n); err != nil {
		return nil, err
	}
	rank := int(r.GetRank())
	if rank == 0 {
		// The lookups naming this store wait until it arrived: once it is
		// in flight (storeChunks), or now if it is refused.
		defer s.chunks.arrivals.arrived(id)
	}
	w, err := s.regs.acquire("store", r.GetWorkerId(), rank, r.GetRegistrationToken())
	if err != nil {
		return nil, err
	}
	defer s.regs.release(w)
	mdl := w.model
	switch {
	case mdl == "":
		mdl = r.GetModel()
	case r.GetModel() != "" && r.GetModel() != mdl:
		return nil, status.Errorf(codes.InvalidArgument, "store: model %q, the worker registered %q", r.GetModel(), mdl)
	}
	if len(mdl) > chunkstore.MaxModelLen {
		return nil, status.Errorf(codes.InvalidArgument, "store: model name of %d bytes", len(mdl))
	}
	bt, l := r.GetBlockTable(), w.layout
	if err := checkBlockTable("store", bt, l); err != nil {
		return nil, err
	}
	if capTok := len(bt) * l.BlockSize; capTok < n {
		return nil, status.Errorf(codes.InvalidArgument, "store: block table of %d blocks holds %d tokens, want %d", len(bt), capTok, n)
	}
	bt = bt[:(n+l.BlockSize-1)/l.BlockSize]
	tp, ts := traceContext(ctx, r.GetTraceContext(), r.GetTraceState())
	sid := s.copies.ids.Add(1) // the ranks of a tensor-parallel worker store one request concurrently
	s.bus.Publish(events.Event{Type: events.StoreStart, RequestID: id, CopyID: sid, TraceContext: tp, TraceState: ts,
		Attrs: []attribute.KeyValue{events.AttrTokens.Int(n), attribute.Bool("document", r.GetDocument()), attribute.Int("rank", rank)}})
	var g *fleet.Group // a document's fleet writes, followed for the ingest's answer
	if r.GetDocument() && s.chunks.fleet != nil {
		g = s.fleetDocs.group(id)
	}
	resp, endErr := s.storeChunks(id, mdl, w, r.GetTokens(), bt, g)
	if endErr != nil {
		s.logger.Warn("store: chunks not stored", "request_id", id, "err", endErr)
	}
	s.bus.Publish(events.Event{Type: events.StoreEnd, RequestID: id, CopyID: sid, Err: endErr, Attrs: []attribute.KeyValue{
		events.AttrStoredChunks.Int(int(resp.StoredChunks)), attribute.Int("skipped_chunks", int(resp.SkippedChunks)),
		events.AttrBytes.Int64(resp.Bytes),
	}})
	if endErr != nil && resp.StoredChunks == 0 && resp.SkippedChunks == 0 {
		code := codes.Internal
		if errors.Is(endErr, chunkstore.ErrTooLarge) {
			code = codes.ResourceExhausted
		}
		return nil, status.Errorf(code, "store: %v", endErr)
	}
	return resp, nil
}

// storeChunks copies the KV of toks, the store of request id, out of w's
// memory now (the engine frees the blocks once the worker reports the store
// done): chunk by chunk, those the store does not hold; then indexes them: a
// rank's chunks under their rank-0 keys (aliases), rank 0's sequence in the
// fingerprint table, and both in the fleet tier.
func (s *Server) storeChunks(id, mdl string, w *workerMem, toks []int32, bt []int32, g *fleet.Group) (*cbv1.StoreResponse, error) {
	cs, rank := s.cfg.ChunkSize, w.key.rank
	ns := keySpace(mdl, w.world)
	keys := chunkstore.ChainKeys(ns, rank, toks, cs)
	base := keys // the rank-0 keys
	if rank != 0 {
		base = chunkstore.ChainKeys(ns, 0, toks, cs)
	}
	layout := chunkstore.LayoutOf(w.layout, w.theta)
	seq := fingerprint.Sequence{Keys: keys, Tokens: slices.Clone(toks), ChunkSize: cs}
	var pending *pendingStore // a lookup arriving before the registration waits for it
	if rank == 0 {
		pending = s.chunks.inflight.begin(ns, seq)
		s.chunks.arrivals.arrived(id) // in flight: its lookups match it from now on
		defer func() {
			if pending != nil { // not handed to the registration
				s.chunks.inflight.end(pending)
			}
		}()
	}
	var resp cbv1.StoreResponse
	var errs []error
	held := make([]*chunkstore.Chunk, len(keys)) // for the fleet tier: the chunks held now
	for i, k := range keys {
		part := reuseplan.Chunk(i, cs, len(toks))
		if s.chunks.store.Contains(k) != chunkstore.TierNone {
			resp.SkippedChunks++
			if s.chunks.fleet != nil { // the fleet tier may have lost it (a Redis restart, eviction)
				held[i], _, _ = s.chunks.store.Get(k)
			}
		} else if c, err := s.storeChunk(k, mdl, rank, layout, toks[part.Start:part.End], part.Start, w, bt); err != nil {
			errs = append(errs, fmt.Errorf("chunk %d: %w", i, err))
			if s.chunks.store.Contains(k) == chunkstore.TierNone {
				continue
			}
		} else {
			resp.StoredChunks++
			resp.Bytes += int64(part.Len()) * w.layout.TokenBytes()
			held[i] = c
		}
		if rank != 0 {
			s.chunks.setAlias(base[i], k, rank)
		}
	}
	s.chunks.syncCounters()
	if rank == 0 {
		s.enqueueRegistration(ns, seq, pending)
		pending = nil
	}
	if s.chunks.fleet != nil {
		s.fleetStore(mdl, w, base, held, seq, g)
	}
	return &resp, errors.Join(errs...)
}

// keySpace is the namespace of the chunk keys and fingerprint tables of a
// model served by groups of world ranks: the model name, or "model@tpN" for
// N ranks (whose chunks hold 1/N of the KV heads).
func keySpace(mdl string, world int) string {
	if world <= 1 {
		return mdl
	}
	return mdl + "@tp" + strconv.Itoa(world)
}

// checkBlockTable bounds a block table by the registered layout: at most
// NumBlocks entries, each a block of the memory, none twice (a sequence's
// blocks are distinct).
func checkBlockTable(op string, bt []int32, l kvcache.Layout) error {
	if len(bt) > l.NumBlocks {
		return status.Errorf(codes.InvalidArgument, "%s: block table of %d blocks, the memory has %d", op, len(bt), l.NumBlocks)
	}
	seen := make([]uint64, (l.NumBlocks+63)/64)
	for i, b := range bt {
		if b < 0 || int(b) >= l.NumBlocks {
			return status.Errorf(codes.InvalidArgument, "%s: block_table[%d] = %d outside the %d blocks", op, i, b, l.NumBlocks)
		}
		if seen[b/64]&(1<<(b%64)) != 0 {
			return status.Errorf(codes.InvalidArgument, "%s: block %d appears twice in the block table", op, b)
		}
		seen[b/64] |= 1 << (b % 64)
	}
	return nil
}

// storeChunk gathers one chunk's KV from the worker's memory and puts it in
// the store. Its positions are its offsets in the stored sequence.
func (s *Server) storeChunk(k chunkstore.Key, mdl string, rank int, layout chunkstore.Layout, toks []int32, start int, w *workerMem, bt []int32) (*chunkstore.Chunk, error) {
	c, err := chunkstore.NewChunk(k, mdl, rank, layout, toks, start)
	if err != nil {
		return nil, err
	}
	if err := scatter.Gather(c, w.mem, bt); err != nil {
		return nil, err
	}
	return c, s.chunks.store.Put(c)
}

// enqueueRegistration queues the fingerprint registration of a rank-0
// stored sequence in the table of key space ns, unless every chunk is
// registered already; a full queue drops it (counted). The store in flight
// p (nil: none) ends once the registration is decided: done, dropped or
// failed.
func (s *Server) enqueueRegistration(ns string, seq fingerprint.Sequence, p *pendingStore) {
	if t := s.chunks.table(ns, false); t != nil && !slices.ContainsFunc(seq.Keys, func(k chunkstore.Key) bool { return !t.Contains(k) }) {
		s.chunks.inflight.end(p)
		return
	}
	if !enqueue(s, s.chunks.regQ, func() { s.register(ns, seq, p) }) {
		s.chunks.regDropped.Add(1)
		s.chunks.inflight.end(p)
	}
}

// register registers a stored sequence in its model's fingerprint table,
// then ends its store in flight p (nil: none): lookups see it from then on.
func (s *Server) register(mdl string, seq fingerprint.Sequence, p *pendingStore) {
	_, err := s.chunks.table(mdl, true).Register(seq)
	s.chunks.inflight.end(p)
	if err != nil {
		s.logger.Warn("fingerprint registration failed", "model", mdl, "err", err)
		return
	}
	s.persistSequence(mdl, seq)
	s.chunks.regDone.Add(1)
}
