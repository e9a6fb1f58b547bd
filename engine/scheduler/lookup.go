package scheduler

import (
	"context"
	"errors"
	"github.com/cacheblend/cacheblend/defaults"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/contract/spanname"
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

// lookup is the CacheBlend lookup of one request: one Lookup call, bounded
// by the request's deadline. Guarded by Scheduler.mu.
type lookup struct {
	deadline time.Time          // first sight + LookupTimeout
	cancel   context.CancelFunc // of the call, once launched
	waited   int                // steps the request waited for it (n_polls)
	ctx      context.Context    // holds the cb.lookup.rpc span
	span     *telemetry.Span
	result   *cbv1.LookupResult
	done     bool // result or fallback decided
}

// lookupOutcome is a finished Lookup call, handed back to the step loop.
type lookupOutcome struct {
	sq  *seq
	lk  *lookup
	res *cbv1.LookupResult
	err error
	at  time.Time // when the call returned: the end of cb.lookup.rpc
}

// lookupDriver runs the Lookup calls: at most max in flight, each on a
// goroutine of its own whose outcome comes back on a channel the step loop
// drains. Its fields other than the channel are guarded by Scheduler.mu.
type lookupDriver struct {
	blend    cbv1.BlendServiceClient
	max      int
	inFlight int
	outcomes chan lookupOutcome // capacity max: a call never blocks on it
	calls    sync.WaitGroup
}

func newLookupDriver(blend cbv1.BlendServiceClient, max int) *lookupDriver {
	return &lookupDriver{blend: blend, max: max, outcomes: make(chan lookupOutcome, max)}
}

// firstSights opens cb.schedule for requests the loop sees for the first
// time, and cb.lookup.rpc for those that look up their reuse.
func (s *Scheduler) firstSights(now time.Time) {
	for _, sq := range s.waiting {
		if sq.seen {
			continue
		}
		sq.seen = true
		if sq.req.Document || sq.req.Prefilled != nil { // no lookup, no cb.schedule
			continue
		}
		sq.schedCtx, sq.schedSpan = s.spans.Start(sq.reqCtx, spanname.CBSchedule,
			trace.WithAttributes(attribute.String("request_id", sq.id)))
		if !s.looksUp(sq) {
			s.stampLookup(sq, LookupSkipped, nil)
			continue
		}
		ctx, span := s.spans.Start(sq.schedCtx, spanname.CBLookupRPC, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("request_id", sq.id)))
		sq.lk = &lookup{deadline: now.Add(s.cfg.LookupTimeout), ctx: ctx, span: span}
	}
}

// looksUp reports whether the request asks the blend server for reuse.
func (s *Scheduler) looksUp(sq *seq) bool {
	return s.lookups.blend != nil && !sq.req.NoReuse && !sq.req.Document
}

// stampLookup records the lookup outcome of a request and stamps it on
// cb.request with the statistics of contract/spans.yaml: those of res for a
// done lookup, zero hit statistics otherwise. Called with Scheduler.mu held;
// the span is written after the lock.
func (s *Scheduler) stampLookup(sq *seq, outcome string, res *cbv1.LookupResult) {
	sq.lookupOut = outcome
	attrs := lookupAttrs(outcome, res, len(sq.req.Prompt))
	span := sq.reqSpan
	s.defer_(func() { span.SetAttributes(attrs...) })
}

// lookupAttrs are the cb.request attributes of a lookup outcome (see
// contract/spans.yaml for the definitions). Without a result every hit
// statistic is zero, the whole prompt is requested and, with no prefix
// coverage, all of it is the non-prefix complement.
func lookupAttrs(outcome string, res *cbv1.LookupResult, nPrompt int) []attribute.KeyValue {
	requested, prefix, nonPrefix, coverage := nPrompt, 0, 0, 0
	hitRate := 0.0
	var fpHits, storageHits, stale, prefixChunks int
	if outcome == LookupDone && res != nil {
		requested = int(res.GetRequestedTokens())
		prefix, nonPrefix = int(res.GetPrefixHitTokens()), int(res.GetNonPrefixHitTokens())
		hitRate = res.GetHitRate()
		// A server that does not report the coverage covers at least its
		// usable prefix.
		coverage = max(int(res.GetPrefixCoverageTokens()), prefix)
		fpHits, storageHits, stale = int(res.GetFingerprintHits()), int(res.GetStorageHits()), int(res.GetStaleChunks())
		prefixChunks = int(res.GetPrefixChunks())
	}
	return []attribute.KeyValue{
		attribute.String("lookup", outcome),
		attribute.Float64("hit_rate", hitRate),
		attribute.Int("hit_tokens", prefix+nonPrefix),
		attribute.Int("requested_tokens", requested),
		attribute.Int("prefix_hit_tokens", prefix),
		attribute.Int("non_prefix_hit_tokens", nonPrefix),
		attribute.Int("prefix_coverage_tokens", coverage),
		attribute.Int("n_non_prefix_tokens", requested-coverage),
		attribute.Int("fingerprint_hits", fpHits),
		attribute.Int("storage_hits", storageHits),
		attribute.Int("stale_chunks", stale),
		attribute.Int("prefix_chunks", prefixChunks),
	}
}

// driveLookups folds finished calls into their requests, times out the
// lookups that could not start in time, and launches calls while slots are
// free, in queue order.
func (s *Scheduler) driveLookups(now time.Time) {
	d := s.lookups
	for {
		select {
		case o := <-d.outcomes:
			d.inFlight--
			s.lookupDone(o)
			continue
		default:
		}
		break
	}
	for _, sq := range s.waiting {
		lk := sq.lk
		if lk == nil || lk.done || lk.cancel != nil {
			continue
		}
		if !now.Before(lk.deadline) {
			s.lookupFailed(sq, FallbackTimeout, errLookupTimeout, time.Now())
			continue
		}
		if d.inFlight < d.max {
			s.launch(sq, lk)
		}
	}
}

// countLookupWaits adds one step to every lookup still pending.
func (s *Scheduler) countLookupWaits() {
	for _, sq := range s.waiting {
		if sq.lk != nil && !sq.lk.done {
			sq.lk.waited++
		}
	}
}

// launch runs the request's Lookup call on its own goroutine.
func (s *Scheduler) launch(sq *seq, lk *lookup) {
	d := s.lookups
	d.inFlight++
	ctx, cancel := context.WithDeadline(s.loopCtx, lk.deadline)
	lk.cancel = cancel
	ctx = telemetry.InjectGRPC(trace.ContextWithSpanContext(ctx, trace.SpanContextFromContext(lk.ctx)))
	tp, ts := telemetry.InjectStrings(lk.ctx)
	req := &cbv1.LookupRequest{
		RequestId: sq.id, TraceContext: tp, TraceState: ts,
		Tokens: sq.req.Prompt, WorldSize: int32(s.worldSize()), Model: defaults.KVNamespace(s.cfg.Model, s.cfg.ModelIdentity),
	}
	d.calls.Go(func() {
		defer cancel()
		res, err := d.blend.Lookup(ctx, req)
		d.outcomes <- lookupOutcome{sq: sq, lk: lk, res: res, err: err, at: time.Now()}
		s.poke()
	})
}

// lookupDone folds one call's outcome into its request.
func (s *Scheduler) lookupDone(o lookupOutcome) {
	sq, lk := o.sq, o.lk
	if sq.lk != lk || lk.done || sq.state == stDone {
		return // abandoned with its request
	}
	if o.err != nil {
		s.lookupFailed(sq, fallbackReason(o.err), o.err, o.at)
		return
	}
	s.lookupReady(sq, o.res, o.at)
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

// lookupFailed falls back to a full prefill: cb.lookup.rpc ends at end with
// the reason as its error, and cb.request says lookup=reason with zero hit
// statistics.
func (s *Scheduler) lookupFailed(sq *seq, reason string, err error, end time.Time) {
	lk := sq.lk
	lk.done = true
	if lk.cancel != nil {
		lk.cancel()
	}
	waited := lk.waited
	span := lk.span
	s.defer_(func() {
		span.SetAttributes(attribute.Int("n_polls", waited))
		span.SetError(reason, err)
		span.End(trace.WithTimestamp(end))
	})
	s.stampLookup(sq, reason, nil)
	s.defer_(func() {
		sq.h.update(func(r *Result) { r.Fallback = reason })
		if s.deps.OnFallback != nil {
			s.deps.OnFallback(reason)
		}
	})
}

// lookupReady keeps the result for the admission and stamps its statistics
// on cb.request; cb.lookup.rpc ends at end.
func (s *Scheduler) lookupReady(sq *seq, res *cbv1.LookupResult, end time.Time) {
	lk := sq.lk
	lk.done, lk.result = true, res
	waited := lk.waited
	span := lk.span
	s.defer_(func() {
		span.SetAttributes(
			attribute.Int("n_polls", waited),
			attribute.Int("prefix_hit_tokens", int(res.GetPrefixHitTokens())),
			attribute.Int("non_prefix_hit_tokens", int(res.GetNonPrefixHitTokens())),
			attribute.Int("n_matches", len(res.GetMatches())),
		)
		span.End(trace.WithTimestamp(end))
		sq.h.update(func(r *Result) { r.Lookup = res })
	})
	s.stampLookup(sq, LookupDone, res)
}

// abandonLookup ends the lookup of a request that finished before it: the
// call is canceled and cb.lookup.rpc ends with the request's error.
func (s *Scheduler) abandonLookup(sq *seq, err error) {
	lk := sq.lk
	if lk == nil || lk.done {
		return
	}
	lk.done = true
	if lk.cancel != nil {
		lk.cancel()
	}
	span, waited, end := lk.span, lk.waited, time.Now()
	s.defer_(func() {
		span.SetAttributes(attribute.Int("n_polls", waited))
		span.SetError(errorType(err), err)
		span.End(trace.WithTimestamp(end))
	})
	s.stampLookup(sq, LookupAbandoned, nil)
}

// planOf builds the request's reuse plan from its lookup result, given the
// tokens already covered by the engine's own prefix cache (local). ok is
// false when nothing is reused.
func planOf(res *cbv1.LookupResult, local, total int, recompRatio float64) (reuseplan.Plan, bool) {
	matches, err := rpc.MatchesFromProto(res.GetMatches())
	if err != nil {
		return reuseplan.Plan{}, false
	}
	p, err := reuseplan.New(matches, int(res.GetChunkSize()), local, total, recompRatio)
	return p, err == nil
}
