package scheduler

import (
	"context"
	"errors"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

// Fallback reasons (the reason label of cb_engine_lookup_fallbacks_total).
// They are lookup outcomes too.
const (
	FallbackError       = "error"
	FallbackTimeout     = "timeout"
	FallbackUnavailable = "unavailable"
	FallbackQueueFull   = "queue_full"
)

// Lookup outcomes other than the fallback reasons: the lookup attribute of
// cb.request (contract/spans.yaml) says how the request's lookup ended.
const (
	// LookupDone is a lookup the blend server answered.
	LookupDone = "done"
	// LookupSkipped is a request served without a lookup: reuse off
	// (Request.NoReuse) or no blend server configured.
	LookupSkipped = "skipped"
	// LookupAbandoned is a request that ended before its lookup did.
	LookupAbandoned = "abandoned"
)

// errLookupTimeout is recorded on cb.lookup.rpc when LookupTimeout passed
// before a Lookup call could even start (every call slot busy).
var errLookupTimeout = errors.New("lookup not started within the lookup timeout")

// lookup is the CacheBlend lookup of one request: one Lookup call (through
// Scheduler.lookups), bounded by the request's deadline. Guarded by
// Scheduler.mu.
type lookup struct {
	deadline time.Time          // Submit + LookupTimeout
	cancel   context.CancelFunc // of the call, once started
	waited   int                // steps the request waited for it (n_polls)
	ctx      context.Context    // holds the cb.lookup.rpc span
	span     *telemetry.Span
	result   *cbv1.LookupResult
	done     bool // result or fallback decided
}

// pending reports whether the request still waits for its lookup.
func (lk *lookup) pending() bool { return lk != nil && !lk.done }

// openLookup decides at Submit whether sq looks its reuse up: if so it
// opens cb.lookup.rpc (the call starts in driveLookups), else it stamps
// lookup=skipped on cb.request.
func (s *Scheduler) openLookup(sq *seq, now time.Time) {
	if s.deps.Blend == nil || sq.req.NoReuse {
		// Set now, not deferred to unlock: Submit's deferred actions run on
		// the caller's goroutine after it unlocks, and the loop may finish
		// the request and end cb.request first (attributes set after End
		// are lost). Setting attributes does no I/O.
		sq.trace.reqSpan.SetAttributes(lookupAttrs(LookupSkipped, nil, sq.kv.nPrompt)...)
		return
	}
	ctx, span := s.deps.Spans.Start(sq.trace.schedCtx, spanname.CBLookupRPC, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("request_id", sq.id)))
	sq.lk = &lookup{deadline: now.Add(s.cfg.LookupTimeout), ctx: ctx, span: span}
}

// driveLookups folds the finished calls into their requests, times out the
// lookups that could not start in time, and starts calls while slots are
// free, in queue order.
func (s *Scheduler) driveLookups(now time.Time) {
	s.lookups.drain(func(o outcome[*cbv1.LookupResult]) {
		if o.err != nil {
			s.endLookup(o.sq, fallbackReason(o.err), nil, o.err, o.at)
		} else {
			s.endLookup(o.sq, LookupDone, o.val, nil, o.at)
		}
	})
	for _, sq := range s.q.waiting {
		lk := sq.lk
		switch {
		case !lk.pending() || lk.cancel != nil: // decided, or its call is in flight
		case !now.Before(lk.deadline):
			s.endLookup(sq, FallbackTimeout, nil, errLookupTimeout, time.Now())
		case s.lookups.free():
			s.startLookup(sq)
		}
	}
}

// startLookup starts sq's Lookup call, with cb.lookup.rpc's context.
func (s *Scheduler) startLookup(sq *seq) {
	lk := sq.lk
	ctx := telemetry.InjectGRPC(trace.ContextWithSpanContext(s.loop.ctx, trace.SpanContextFromContext(lk.ctx)))
	tp, ts := telemetry.InjectStrings(lk.ctx)
	req := &cbv1.LookupRequest{
		RequestId: sq.id, TraceContext: tp, TraceState: ts, Tokens: sq.req.Prompt,
		WorldSize: int32(s.worldSize()), Model: defaults.KVNamespace(s.cfg.Model, s.cfg.ModelIdentity),
		// The worker sends a store from a goroutine after its prefill: this
		// lookup may reach the blend server first (a client's next request
		// right after its answer), so it names the stores in flight.
		PendingStoreIds: s.blocks.storesInFlight(defaults.MaxPendingStores),
	}
	blend, deadline := s.deps.Blend, lk.deadline
	lk.cancel = s.lookups.start(ctx, sq, func(ctx context.Context) (*cbv1.LookupResult, error) {
		ctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		return blend.Lookup(ctx, req)
	})
}

// countLookupWaits adds one step to every lookup still pending.
func (s *Scheduler) countLookupWaits() {
	for _, sq := range s.q.waiting {
		if sq.lk.pending() {
			sq.lk.waited++
		}
	}
}

func fallbackReason(err error) string {
	switch status.Code(err) {
	case codes.Unavailable:
		return FallbackUnavailable
	case codes.DeadlineExceeded:
		return FallbackTimeout
	case codes.ResourceExhausted:
		return FallbackQueueFull
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return FallbackTimeout
	}
	return FallbackError
}

// endLookup decides sq's pending lookup (it does nothing otherwise):
// outcome is LookupDone with the result res, a fallback reason (the request
// is computed in full, the fallback is counted) or LookupAbandoned (the
// request ended first, with err). The call is canceled, cb.lookup.rpc ends
// at end (with the reason as its error unless done), and cb.request gets
// the outcome and the statistics.
func (s *Scheduler) endLookup(sq *seq, outcome string, res *cbv1.LookupResult, err error, end time.Time) {
	lk := sq.lk
	if !lk.pending() {
		return
	}
	lk.done, lk.result = true, res
	if lk.cancel != nil {
		lk.cancel()
	}
	span, reqSpan, waited := lk.span, sq.trace.reqSpan, lk.waited
	attrs := lookupAttrs(outcome, res, sq.kv.nPrompt)
	if off := s.worker.info.GetBlendOff(); off != "" {
		attrs = append(attrs, attribute.String("blend_off", off))
	}
	s.defer_(func() {
		span.SetAttributes(attribute.Int("n_polls", waited))
		switch outcome {
		case LookupDone:
			span.SetAttributes(
				attribute.Int("prefix_hit_tokens", int(res.GetPrefixHitTokens())),
				attribute.Int("non_prefix_hit_tokens", int(res.GetNonPrefixHitTokens())),
				attribute.Int("n_matches", len(res.GetMatches())),
			)
			sq.h.update(func(r *Result) { r.Lookup = res })
		case LookupAbandoned:
			span.SetError(ErrorType(err), err)
		default:
			span.SetError(outcome, err)
			sq.h.update(func(r *Result) { r.Fallback = outcome })
			if s.deps.OnFallback != nil {
				s.deps.OnFallback(outcome)
			}
		}
		span.End(trace.WithTimestamp(end))
		reqSpan.SetAttributes(attrs...)
	})
}

// lookupAttrs are the cb.request attributes of a lookup outcome (see
// contract/spans.yaml): the statistics the blend server reported for a done
// lookup; otherwise zero hit statistics, the whole prompt requested and,
// with no prefix coverage, all of it the non-prefix complement.
func lookupAttrs(outcome string, res *cbv1.LookupResult, nPrompt int) []attribute.KeyValue {
	if outcome != LookupDone || res == nil {
		res = &cbv1.LookupResult{RequestedTokens: int32(nPrompt)}
	}
	prefix, nonPrefix := int(res.GetPrefixHitTokens()), int(res.GetNonPrefixHitTokens())
	coverage := int(res.GetPrefixCoverageTokens())
	// The non-prefix leg searches the prompt past the prefix coverage.
	complement := reuseplan.Range{Start: coverage, End: int(res.GetRequestedTokens())}
	return []attribute.KeyValue{
		attribute.String("lookup", outcome),
		attribute.Float64("hit_rate", res.GetHitRate()),
		attribute.Int("hit_tokens", prefix+nonPrefix),
		attribute.Int("requested_tokens", int(res.GetRequestedTokens())),
		attribute.Int("prefix_hit_tokens", prefix),
		attribute.Int("non_prefix_hit_tokens", nonPrefix),
		attribute.Int("prefix_coverage_tokens", coverage),
		attribute.Int("n_non_prefix_tokens", complement.Len()),
		attribute.Int("fingerprint_hits", int(res.GetFingerprintHits())),
		attribute.Int("storage_hits", int(res.GetStorageHits())),
		attribute.Int("stale_chunks", int(res.GetStaleChunks())),
		attribute.Int("prefix_chunks", int(res.GetPrefixChunks())),
	}
}

// planOf builds the request's reuse plan from its lookup result, given the
// tokens already covered by the engine's own prefix cache (local); with
// prefixOnly (the worker's blend gate turned blending off) only the prefix
// leg's matches are kept. ok is false when nothing is reused.
func planOf(res *cbv1.LookupResult, local, total int, recompRatio float64, prefixOnly bool) (reuseplan.Plan, bool) {
	matches, err := rpc.MatchesFromProto(res.GetMatches())
	if err != nil {
		return reuseplan.Plan{}, false
	}
	if prefixOnly {
		matches = slices.DeleteFunc(matches, func(m reuseplan.Match) bool { return !m.Prefix })
	}
	p, err := reuseplan.New(matches, int(res.GetChunkSize()), local, total, recompRatio)
	return p, err == nil
}

// planReuse sets sq.reuse from its lookup result at its first admission,
// given the tokens its own prefix cache covers (local), and returns the
// first position to compute, the tokens the plan loads and, of them, those
// of its prefix leg (not computed). Without a plan: local, 0, 0.
func (s *Scheduler) planReuse(sq *seq, local int) (start, reused, prefixLeg int) {
	r := &sq.reuse
	r.reset()
	if sq.lk == nil || sq.lk.result == nil || sq.resumed {
		return local, 0, 0
	}
	total := len(sq.kv.tokens)
	ratio := s.cfg.RecompRatio
	if q := sq.req.Blend.RecompRatio; q != nil {
		ratio = *q
	}
	p, ok := planOf(sq.lk.result, local, total, ratio, s.worker.info.GetBlendOff() != "")
	if !ok {
		return local, 0, 0
	}
	for _, pc := range p.Pieces(local, total) {
		switch pc.Kind {
		case reuseplan.Prefix:
			prefixLeg += pc.Len()
		case reuseplan.Reused:
			r.ranges = append(r.ranges, pc.Range)
		}
	}
	info := s.worker.info
	r.plan = rpc.PlanToProto(p)
	r.plan.Selection, r.plan.SelectionSeed = sq.req.Blend.Selection, sq.req.Sampling.GetSeed()
	r.cost = blendTokenCost(int(info.GetNumLayers()), int(info.GetCheckLayer()), p.RecompRatio)
	return p.Start, p.ReusedTokens(), prefixLeg
}
