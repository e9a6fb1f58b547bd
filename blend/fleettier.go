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

// fleetSpace is where model mdl's chunks live in the fleet tier: the
// namespace of the model and the layout of a rank-0 KV memory registered
// for it (chunks of other layouts never mix). ok is false without a fleet
// tier or such a registration.
func (s *Server) fleetSpace(mdl string) (ns string, layout chunkstore.Layout, ok bool) {
	if s.fleet == nil {
		return "", chunkstore.Layout{}, false
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	for k, w := range s.workers {
		if k.rank == 0 && (w.model == mdl || w.model == "") {
			layout = chunkstore.LayoutOf(w.layout, w.theta)
			return fleet.Namespace(mdl, layout), layout, true
		}
	}
	return "", chunkstore.Layout{}, false
}

// nonPrefixMatch runs the non-prefix leg from position from: the
// coordinator match against the fleet directory when a fleet tier is
// configured (cb.coordinator_match; on timeout or error, what the local
// table finds, with timed_out), else the local table (cb.fingerprint_match).
func (s *Server) nonPrefixMatch(id, mdl string, toks []int32, from int) fingerprint.Result {
	local := func() fingerprint.Result {
		if t := s.table(mdl, false); t != nil {
			return t.Match(toks, from)
		}
		return fingerprint.Result{}
	}
	ns, _, ok := s.fleetSpace(mdl)
	if !ok {
		s.publish(events.Event{Type: events.FingerprintMatchStart, RequestID: id})
		fm := local()
		s.publish(events.Event{Type: events.FingerprintMatchEnd, RequestID: id, Attrs: []attribute.KeyValue{
			events.AttrNProbes.Int(fm.Stats.Probes), events.AttrTableHits.Int(fm.Stats.TableHits), events.AttrMatches.Int(len(fm.Matches)),
		}})
		return fm
	}
	s.publish(events.Event{Type: events.CoordinatorMatchStart, RequestID: id})
	fm, st, err := s.fleet.Match(context.Background(), ns, s.table(mdl, true), toks, from)
	timedOut := errors.Is(err, fleet.ErrTimeout)
	if err != nil {
		fm = local()
		s.logger.Debug("coordinator match failed; local table used", "request_id", id, "err", err)
	}
	s.publish(events.Event{Type: events.CoordinatorMatchEnd, RequestID: id, Attrs: []attribute.KeyValue{
		events.AttrMatches.Int(len(fm.Matches)), attribute.Bool("timed_out", timedOut),
		events.AttrNProbes.Int(st.Probes), attribute.Int("round_trips", st.RoundTrips),
		attribute.Int("directory_hits", st.DirectoryHits), events.AttrTableHits.Int(fm.Stats.TableHits),
	}})
	return fm
}

// fleetLoad reads the chunks the local tiers miss from the fleet tier
// (cb.l2_load with tier=redis), keeps them in the local store so that the
// retrieve finds them, and adds them to got.
func (s *Server) fleetLoad(id, mdl string, keys []chunkstore.Key, got map[chunkstore.Key]*chunkstore.Chunk) {
	ns, layout, ok := s.fleetSpace(mdl)
	if !ok {
		return
	}
	var missing []chunkstore.Key
	for _, k := range keys {
		if got[k] == nil {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return
	}
	start := time.Now()
	s.publish(events.Event{Type: events.L2LoadTaskStart, RequestID: id, Time: start,
		Attrs: []attribute.KeyValue{attribute.Int("keys", len(missing)), attribute.String("tier", "redis")}})
	chunks, st, err := s.fleet.GetChunks(context.Background(), ns, missing, layout)
	s.metrics.ObserveRemoteLoad(context.Background(), st.Duration)
	for k, c := range chunks {
		if perr := s.store.Put(c); perr != nil {
			s.logger.Debug("fleet chunk not kept locally", "key", k, "err", perr)
		}
		got[k] = c
	}
	end := time.Now()
	s.publish(events.Event{Type: events.L2LoadTaskEnd, RequestID: id, Time: end, Err: err, Attrs: []attribute.KeyValue{
		events.AttrChunks.Int(st.Hits), events.AttrBytes.Int64(st.Bytes),
		events.AttrMs.Float64(float64(end.Sub(start)) / float64(time.Millisecond)),
		attribute.String("tier", "redis"), attribute.Int("misses", st.Misses), attribute.Int("corrupt", st.Corrupt),
	}})
}

// fleetStore writes a stored sequence's rank-0 chunks and its directory
// entry to the fleet tier (asynchronously; drops are counted there). Chunks
// the node held already are written again: Redis may have lost them.
func (s *Server) fleetStore(mdl string, seq fingerprint.Sequence, stored []*chunkstore.Chunk) {
	ns, _, ok := s.fleetSpace(mdl)
	if !ok {
		return
	}
	for _, c := range stored {
		s.fleet.PutChunk(ns, c)
	}
	s.fleet.RegisterSequence(ns, s.table(mdl, true), seq)
}
