package blend

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/blend/fleet"
)

// fleetNamespace is the fleet namespace of the chunks of registration w: its
// key space and layout. Rank r's chunk of a rank-0 chunk k lives there under
// fleet.Ref{k, r}, so another node finds every rank's chunk from the rank-0
// keys of a match.
func fleetNamespace(mdl string, w *workerMem) (string, chunkstore.Layout) {
	layout := chunkstore.LayoutOf(w.layout, w.theta)
	return fleet.Namespace(keySpace(mdl, w.world), layout), layout
}

// fleetSpace is the fleet namespace of model mdl served by groups of ws
// ranks: that of a rank-0 registration for them; ok is false without a
// fleet tier or such a registration.
func (s *Server) fleetSpace(mdl string, ws int) (ns string, layout chunkstore.Layout, ok bool) {
	if s.chunks.fleet == nil {
		return "", chunkstore.Layout{}, false
	}
	s.regs.mu.Lock()
	defer s.regs.mu.Unlock()
	for k, w := range s.regs.workers {
		if k.rank == 0 && w.world == ws && (w.model == mdl || w.model == "") {
			ns, layout = fleetNamespace(mdl, w)
			return ns, layout, true
		}
	}
	return "", chunkstore.Layout{}, false
}

// nonPrefixMatch runs the non-prefix leg from position from: the
// coordinator match against the fleet directory (cb.coordinator_match; on
// error, the local table's) with a fleet tier, else the local table
// (cb.fingerprint_match).
func (s *Server) nonPrefixMatch(q lookupQuery, from int) fingerprint.Result {
	local := func() fingerprint.Result {
		if t := s.chunks.table(q.ns, false); t != nil {
			return t.Match(q.toks, from)
		}
		return fingerprint.Result{}
	}
	ns, _, ok := s.fleetSpace(q.mdl, q.ws)
	if !ok {
		s.bus.Publish(events.Event{Type: events.FingerprintMatchStart, RequestID: q.id})
		fm := local()
		s.bus.Publish(events.Event{Type: events.FingerprintMatchEnd, RequestID: q.id, Attrs: []attribute.KeyValue{
			events.AttrNProbes.Int(fm.Stats.Probes), events.AttrTableHits.Int(fm.Stats.TableHits), events.AttrMatches.Int(len(fm.Matches)),
		}})
		return fm
	}
	s.bus.Publish(events.Event{Type: events.CoordinatorMatchStart, RequestID: q.id})
	fm, st, err := s.chunks.fleet.Match(context.Background(), ns, s.chunks.table(q.ns, true), q.toks, from)
	timedOut := errors.Is(err, fleet.ErrTimeout)
	if err != nil {
		fm = local()
		s.logger.Debug("coordinator match failed; local table used", "request_id", q.id, "err", err)
	}
	s.bus.Publish(events.Event{Type: events.CoordinatorMatchEnd, RequestID: q.id, Attrs: []attribute.KeyValue{
		events.AttrMatches.Int(len(fm.Matches)), attribute.Bool("timed_out", timedOut),
		events.AttrNProbes.Int(st.Probes), attribute.Int("round_trips", st.RoundTrips),
		attribute.Int("directory_hits", st.DirectoryHits), events.AttrTableHits.Int(fm.Stats.TableHits),
	}})
	return fm
}

// fleetLoad reads the chunks of keys the local tiers miss, of every rank of
// the query's world, from the fleet tier (cb.l2_load with tier=redis), keeps
// them in the local store (another rank's under its alias) for the
// classification and the retrieve, and adds the rank-0 ones to got.
func (s *Server) fleetLoad(q lookupQuery, keys []chunkstore.Key, got map[chunkstore.Key]*chunkstore.Chunk) {
	ns, layout, ok := s.fleetSpace(q.mdl, q.ws)
	if !ok {
		return
	}
	var missing []fleet.Ref
	for _, k := range keys {
		if got[k] == nil {
			missing = append(missing, fleet.Ref{Base: k})
		}
		for rank := 1; rank < q.ws; rank++ {
			if !s.chunks.onRank(k, rank) {
				missing = append(missing, fleet.Ref{Base: k, Rank: rank})
			}
		}
	}
	if len(missing) == 0 {
		return
	}
	start := time.Now()
	s.bus.Publish(events.Event{Type: events.L2LoadTaskStart, RequestID: q.id, Time: start,
		Attrs: []attribute.KeyValue{attribute.Int("keys", len(missing)), attribute.String("tier", "redis")}})
	loaded, st, err := s.chunks.fleet.GetChunks(context.Background(), ns, missing, layout, s.cfg.ChunkSize)
	s.metrics.ObserveRemoteLoad(context.Background(), st.Duration)
	for ref, c := range loaded {
		if perr := s.chunks.store.Put(c); perr != nil {
			s.logger.Debug("fleet chunk not kept locally", "key", c.Key, "rank", ref.Rank, "err", perr)
		}
		if ref.Rank == 0 {
			got[ref.Base] = c
		} else {
			s.chunks.setAlias(ref.Base, c.Key, ref.Rank)
		}
	}
	end := time.Now()
	s.bus.Publish(events.Event{Type: events.L2LoadTaskEnd, RequestID: q.id, Time: end, Err: err, Attrs: []attribute.KeyValue{
		events.AttrChunks.Int(st.Hits), events.AttrBytes.Int64(st.Bytes),
		events.AttrMs.Float64(float64(end.Sub(start)) / float64(time.Millisecond)),
		attribute.String("tier", "redis"), attribute.Int("misses", st.Misses), attribute.Int("corrupt", st.Corrupt),
	}})
}

// fleetStore writes the chunks a rank holds to the fleet tier under their
// rank-0 keys base, and for rank 0 the sequence's directory entry
// (asynchronously, retried while Redis fails; drops are counted there), as
// writes of g (a document's; nil for a prompt).
func (s *Server) fleetStore(mdl string, w *workerMem, base []chunkstore.Key, stored []*chunkstore.Chunk, seq fingerprint.Sequence, g *fleet.Group) {
	ns, _ := fleetNamespace(mdl, w)
	for i, c := range stored {
		if c != nil {
			s.chunks.fleet.PutChunk(ns, base[i], c, g)
		}
	}
	if w.key.rank == 0 {
		s.chunks.fleet.RegisterSequence(ns, s.chunks.table(keySpace(mdl, w.world), true), seq, g)
	}
}
