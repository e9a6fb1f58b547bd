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
	"github.com/cacheblend/cacheblend/blend/scatter"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

func (s *Server) storeKV(ctx context.Context, r *cbv1.StoreRequest) (*cbv1.StoreResponse, error) {
	if err := checkRequestID(r.GetRequestId()); err != nil {
		return nil, err
	}
	toks := r.GetTokens()
	if len(toks) == 0 || len(toks) > MaxTokens {
		return nil, status.Errorf(codes.InvalidArgument, "store: %d tokens (want 1..%d)", len(toks), MaxTokens)
	}
	rank := int(r.GetRank())
	w, err := s.acquire("store", r.GetWorkerId(), rank, r.GetRegistrationToken())
	if err != nil {
		return nil, err
	}
	defer s.release(w)
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
	l := w.layout
	bt := r.GetBlockTable()
	if err := checkBlockTable("store", bt, l); err != nil {
		return nil, err
	}
	if capTok := len(bt) * l.BlockSize; capTok < len(toks) {
		return nil, status.Errorf(codes.InvalidArgument, "store: block table of %d blocks holds %d tokens, want %d", len(bt), capTok, len(toks))
	}
	bt = bt[:(len(toks)+l.BlockSize-1)/l.BlockSize] // only the tokens' blocks are read
	id := r.GetRequestId()
	cs := s.cfg.ChunkSize
	tp, ts := traceContext(ctx, r.GetTraceContext(), r.GetTraceState())
	sid := s.copyIDs.Add(1) // the ranks of a tensor-parallel worker store one request concurrently
	s.publish(events.Event{Type: events.StoreStart, RequestID: id, CopyID: sid, TraceContext: tp, TraceState: ts,
		Attrs: []attribute.KeyValue{events.AttrTokens.Int(len(toks)), attribute.Bool("document", r.GetDocument()), attribute.Int("rank", rank)}})

	// Copy the KV out now: the engine frees the blocks once the worker
	// reports the store done.
	ns := keySpace(mdl, w.world)
	keys := chunkstore.ChainKeys(ns, rank, toks, cs)
	layout := chunkstore.LayoutOf(l, w.theta)
	var resp cbv1.StoreResponse
	var errs []error
	var base []chunkstore.Key
	if rank != 0 {
		base = chunkstore.ChainKeys(ns, 0, toks, cs)
	}
	var aliasBase, aliasKeys []chunkstore.Key
	var stored []*chunkstore.Chunk // rank-0 chunks for the fleet tier
	for i, k := range keys {
		lo, hi := i*cs, min((i+1)*cs, len(toks))
		present := s.store.Contains(k) != chunkstore.TierNone
		if present {
			resp.SkippedChunks++
			if rank == 0 && s.fleet != nil && w.world == 1 { // the fleet tier may have lost it (a Redis restart, eviction)
				if c, _, err := s.store.Get(k); err == nil {
					stored = append(stored, c)
				}
			}
		} else if c, err := s.storeChunk(k, mdl, rank, layout, toks[lo:hi], lo, w, bt); err != nil {
			errs = append(errs, fmt.Errorf("chunk %d: %w", i, err))
			if s.store.Contains(k) == chunkstore.TierNone {
				continue
			}
		} else {
			resp.StoredChunks++
			resp.Bytes += int64(hi-lo) * l.TokenBytes()
			if rank == 0 && s.fleet != nil && w.world == 1 {
				stored = append(stored, c)
			}
		}
		if rank != 0 {
			aliasBase, aliasKeys = append(aliasBase, base[i]), append(aliasKeys, k)
		}
	}
	s.syncStoreCounters()
	if rank != 0 {
		s.setAliases(aliasBase, aliasKeys, rank)
	} else {
		s.enqueueRegistration(ns, keys, toks)
		if s.fleet != nil && w.world == 1 {
			s.fleetStore(mdl, fingerprint.Sequence{Keys: keys, Tokens: slices.Clone(toks), ChunkSize: cs}, stored)
		}
	}
	var endErr error
	if len(errs) > 0 {
		endErr = errors.Join(errs...)
		s.logger.Warn("store: chunks not stored", "request_id", id, "failed", len(errs), "err", endErr)
	}
	s.publish(events.Event{Type: events.StoreEnd, RequestID: id, CopyID: sid, Err: endErr, Attrs: []attribute.KeyValue{
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
	return &resp, nil
}

// keySpace is the namespace of the chunk keys and fingerprint tables of a
// model served by groups of world ranks: the model name for a whole-model
// worker, "model@tpN" for N ranks (whose chunks hold 1/N of the KV heads,
// so groups of different sizes never share them). The fleet tier serves
// whole-model workers only.
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
	return c, s.store.Put(c)
}

// enqueueRegistration queues the fingerprint registration of a rank-0
// stored sequence, unless every chunk is registered already; a full queue
// drops it (counted).
func (s *Server) enqueueRegistration(mdl string, keys []chunkstore.Key, toks []int32) {
	if t := s.table(mdl, false); t != nil {
		all := true
		for _, k := range keys {
			if !t.Contains(k) {
				all = false
				break
			}
		}
		if all {
			return
		}
	}
	seq := fingerprint.Sequence{Keys: keys, Tokens: slices.Clone(toks), ChunkSize: s.cfg.ChunkSize}
	if !enqueue(s, s.regQ, func() { s.register(mdl, seq) }) {
		s.regDropped.Add(1)
	}
}

// register registers a stored sequence in its model's fingerprint table.
func (s *Server) register(mdl string, seq fingerprint.Sequence) {
	if _, err := s.table(mdl, true).Register(seq); err != nil {
		s.logger.Warn("fingerprint registration failed", "model", mdl, "err", err)
		return
	}
	s.persistSequence(mdl, seq)
	s.regDone.Add(1)
}
