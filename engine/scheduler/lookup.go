package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

// Fallback reasons (the reason label of cb_engine_lookup_fallbacks_total).
const (
	FallbackError       = "error"
	FallbackTimeout     = "timeout"
	FallbackUnavailable = "unavailable"
)

type lkState int

const (
	lkNeedSubmit lkState = iota
	lkSubmitting
	lkWaitPoll
	lkPolling
	lkReady
	lkFailed
)

// lookup is the CacheBlend lookup of one request. Guarded by Scheduler.mu.
type lookup struct {
	state    lkState
	deadline time.Time
	lastPoll time.Time
	nPolls   int
	ctx      context.Context // holds the cb.lookup.rpc span
	span     *telemetry.Span
	result   *cbv1.LookupResult
	reason   string
}

func (lk *lookup) final() bool { return lk.state == lkReady || lk.state == lkFailed }

// errLookupTimeout is recorded on cb.lookup.rpc when LookupTimeout passed.
var errLookupTimeout = errors.New("lookup not ready within the lookup timeout")

// firstSights opens cb.schedule for requests the loop sees for the first
// time and submits their lookups.
func (s *Scheduler) firstSights(now time.Time) {
	for _, sq := range s.waiting {
		if sq.seen {
			continue
		}
		sq.seen = true
		if sq.req.Document {
			continue
		}
		sq.schedCtx, sq.schedSpan = s.spans.Start(sq.reqCtx, "cb.schedule",
			traceAttrs(attribute.String("request_id", sq.id)))
		if s.deps.Blend == nil || sq.req.NoReuse {
			continue
		}
		ctx, span := s.spans.Start(sq.schedCtx, "cb.lookup.rpc", trace.WithSpanKind(trace.SpanKindClient),
			traceAttrs(attribute.String("request_id", sq.id)))
		sq.lk = &lookup{state: lkNeedSubmit, deadline: now.Add(s.cfg.LookupTimeout), ctx: ctx, span: span}
	}
}

// driveLookups times lookups out and launches their submit and poll RPCs,
// at most MaxLookupRPCs at a time, a poll at most every PollInterval.
func (s *Scheduler) driveLookups(now time.Time) {
	for _, sq := range s.waiting {
		lk := sq.lk
		if lk == nil || lk.final() {
			continue
		}
		if !now.Before(lk.deadline) {
			s.lookupFailed(sq, FallbackTimeout, errLookupTimeout)
			continue
		}
		if s.rpcInFlight >= s.cfg.MaxLookupRPCs {
			continue
		}
		switch {
		case lk.state == lkNeedSubmit:
			lk.state = lkSubmitting
			s.launch(sq, lk, true, now)
		case lk.state == lkWaitPoll && !now.Before(lk.lastPoll.Add(s.cfg.PollInterval)):
			lk.state = lkPolling
			lk.nPolls++
			s.launch(sq, lk, false, now)
		}
	}
}

// launch runs one lookup RPC on its own goroutine.
func (s *Scheduler) launch(sq *seq, lk *lookup, submit bool, now time.Time) {
	s.rpcInFlight++
	deadline := now.Add(s.cfg.LookupRPCTimeout)
	if lk.deadline.Before(deadline) {
		deadline = lk.deadline
	}
	ctx, cancel := context.WithDeadline(s.loopCtx, deadline)
	ctx = telemetry.InjectGRPC(trace.ContextWithSpanContext(ctx, trace.SpanContextFromContext(lk.ctx)))
	tc := telemetry.InjectString(lk.ctx)
	id, model, prompt := sq.id, s.cfg.Model, sq.req.Prompt
	blend := s.deps.Blend
	s.rpcs.Add(1)
	go func() {
		defer s.rpcs.Done()
		defer cancel()
		var (
			res *cbv1.LookupResult
			err error
		)
		if submit {
			var r *cbv1.SubmitLookupResponse
			r, err = blend.SubmitLookup(ctx, &cbv1.LookupRequest{
				RequestId: id, TraceContext: tc, Tokens: prompt, WorldSize: WorldSize, Model: model,
			})
			if err == nil && !r.GetAccepted() {
				err = errors.New("blend server refused the lookup: one with this request id is already in flight")
			}
		} else {
			var r *cbv1.PollLookupResponse
			r, err = blend.PollLookup(ctx, &cbv1.PollLookupRequest{RequestId: id, TraceContext: tc})
			if err == nil && r.GetReady() {
				res = r.GetResult()
				if res == nil {
					err = errors.New("blend server reported a ready lookup without a result")
				}
			}
		}
		s.lookupDone(sq, lk, submit, res, err)
	}()
}

// lookupDone folds one RPC's outcome into the lookup's state.
func (s *Scheduler) lookupDone(sq *seq, lk *lookup, submit bool, res *cbv1.LookupResult, err error) {
	s.mu.Lock()
	defer func() {
		s.unlock()
		s.poke()
	}()
	s.rpcInFlight--
	if sq.lk != lk || lk.final() || sq.state == stDone {
		return
	}
	switch {
	case err != nil:
		s.lookupFailed(sq, fallbackReason(err), err)
	case submit:
		lk.state, lk.lastPoll = lkWaitPoll, time.Now()
	case res == nil:
		lk.state, lk.lastPoll = lkWaitPoll, time.Now()
	case res.GetError() != "":
		s.lookupFailed(sq, FallbackError, fmt.Errorf("blend server lookup failed: %s", res.GetError()))
	default:
		s.lookupReady(sq, res)
	}
}

func fallbackReason(err error) string {
	switch status.Code(err) {
	case codes.Unavailable:
		return FallbackUnavailable
	case codes.DeadlineExceeded:
		return FallbackTimeout
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return FallbackTimeout
	}
	return FallbackError
}

// lookupFailed falls back to a full prefill.
func (s *Scheduler) lookupFailed(sq *seq, reason string, err error) {
	lk := sq.lk
	lk.state, lk.reason = lkFailed, reason
	n := len(sq.tokens)
	nPolls := lk.nPolls
	span := lk.span
	s.defer_(func() {
		span.SetAttributes(attribute.Int("n_polls", nPolls))
		span.SetError(reason, err)
		span.End()
		sq.reqSpan.SetAttributes(
			attribute.String("cb.fallback", reason),
			attribute.Float64("hit_rate", 0),
			attribute.Int("prefix_hit_tokens", 0),
			attribute.Int("non_prefix_hit_tokens", 0),
			attribute.Int("requested_tokens", n),
		)
		sq.h.update(func(r *Result) { r.Fallback = reason })
		if s.deps.OnFallback != nil {
			s.deps.OnFallback(reason)
		}
	})
}

func (s *Scheduler) lookupReady(sq *seq, res *cbv1.LookupResult) {
	lk := sq.lk
	lk.state, lk.result = lkReady, res
	nPolls := lk.nPolls
	span := lk.span
	s.defer_(func() {
		span.SetAttributes(
			attribute.Int("n_polls", nPolls),
			attribute.Int("prefix_hit_tokens", int(res.GetPrefixHitTokens())),
			attribute.Int("non_prefix_hit_tokens", int(res.GetNonPrefixHitTokens())),
			attribute.Int("n_matches", len(res.GetMatches())),
		)
		span.End()
		sq.reqSpan.SetAttributes(
			attribute.Float64("hit_rate", res.GetHitRate()),
			attribute.Int("prefix_hit_tokens", int(res.GetPrefixHitTokens())),
			attribute.Int("non_prefix_hit_tokens", int(res.GetNonPrefixHitTokens())),
			attribute.Int("requested_tokens", int(res.GetRequestedTokens())),
			attribute.Int("prefix_chunks", int(res.GetPrefixChunks())),
			attribute.Int("stale_chunks", int(res.GetStaleChunks())),
		)
		sq.h.update(func(r *Result) { r.Lookup = res })
	})
}

// buildPlan turns a lookup result into the request's CB plan, given the
// tokens already covered by the engine's own prefix cache (local) and the
// prompt length (total). Matches are clipped to start at local: blocks from
// the prefix cache may be shared and are never written. The prefix leg
// (contiguous prefix matches from local on) is not computed: start is where
// computation begins (at most total-1, so a token is always sampled).
// Invalid matches are dropped. It returns a nil plan when nothing is reused.
func buildPlan(res *cbv1.LookupResult, local, total int, recompRatio float64) (plan *cbv1.CBPlan, start, reused int) {
	chunk := int(res.GetChunkSize())
	var matches []*cbv1.Match
	for _, m := range res.GetMatches() {
		cs, ce := int(m.GetCurSt()), int(m.GetCurEd())
		ss, se := int(m.GetStoredSt()), int(m.GetStoredEd())
		if cs < 0 || ce <= cs || ce > total || ss < 0 || se-ss != ce-cs {
			continue // not a usable match
		}
		if ce <= local {
			continue // covered by the engine's own cache
		}
		c := proto.Clone(m).(*cbv1.Match)
		if cs < local {
			shift := local - cs
			c.CurSt = int32(local)
			c.StoredSt = int32(ss + shift)
			if chunk > 0 && len(c.ChunkKeys) > 0 {
				k := min((int(c.StoredSt)-int(c.FirstChunkStart))/chunk, len(c.ChunkKeys))
				if k > 0 {
					c.ChunkKeys = c.ChunkKeys[k:]
					c.FirstChunkStart += int32(k * chunk)
				}
			}
		}
		matches = append(matches, c)
	}
	slices.SortFunc(matches, func(a, b *cbv1.Match) int { return int(a.CurSt) - int(b.CurSt) })
	// Drop overlaps (a server bug): keep the earlier range.
	end := 0
	kept := matches[:0]
	for _, m := range matches {
		if int(m.CurSt) < end {
			continue
		}
		kept = append(kept, m)
		end = int(m.CurEd)
	}
	matches = kept

	start = local
	for _, m := range matches {
		if m.GetPrefix() && int(m.CurSt) <= start && int(m.CurEd) > start {
			start = int(m.CurEd)
		}
		reused += int(m.CurEd - m.CurSt)
	}
	start = min(start, total-1)
	if len(matches) == 0 {
		return nil, local, 0
	}
	return &cbv1.CBPlan{
		PrefixHitTokens: int32(start),
		Matches:         matches,
		ChunkSize:       res.GetChunkSize(),
		RecompRatio:     recompRatio,
	}, start, reused
}
