package scheduler

import (
	"math"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// schedule builds the next batch: running sequences first, then waiting
// ones, within the token budget. The batch lives in a buffer reused by the
// next call.
func (s *Scheduler) schedule(now time.Time) []item {
	buf := s.buf.batch[:cap(s.buf.batch)]
	clear(buf) // the last batch's sequences are not kept alive
	batch := s.fillBatch(buf[:0], now)
	s.buf.batch = batch
	return batch
}

// fillBatch appends the next batch to batch.
func (s *Scheduler) fillBatch(batch []item, now time.Time) []item {
	budget, maxRunning := s.stepLimits()
	preempted := false
	for i := 0; i < len(s.q.running) && budget.open(); i++ {
		sq := s.q.running[i]
		n, cost := budget.chunk(sq, sq.kv.computed, s.lone(len(batch) == 0 && len(s.q.running) == 1))
		if n <= 0 {
			continue
		}
		for s.blocks.grow(&sq.kv, sq.kv.computed+n) != nil {
			victim := s.q.running[len(s.q.running)-1]
			s.preempt(victim)
			preempted = true
			if victim == sq {
				sq = nil
				break
			}
		}
		if sq == nil {
			break
		}
		batch = append(batch, s.stepItem(sq, n))
		budget.charge(n, cost)
	}
	if preempted {
		return batch
	}
	for i := 0; i < len(s.q.waiting) && budget.open() && len(s.q.running) < maxRunning; {
		sq := s.q.waiting[i]
		if sq.lk.pending() {
			i++ // deferred until its lookup is ready
			continue
		}
		if sq.req.Prefilled != nil && !sq.resumed {
			if !s.pulls.free() || !s.startPull(sq, now) {
				break // first come, first served
			}
			s.q.waiting = slices.Delete(s.q.waiting, i, i+1)
			continue
		}
		n, cost, ok := s.admit(sq, budget, s.lone(len(batch) == 0 && len(s.q.running) == 0), now)
		if !ok {
			break // first come, first served: no skipping ahead for blocks
		}
		s.q.waiting = slices.Delete(s.q.waiting, i, i+1)
		sq.state = stRunning
		s.q.running = append(s.q.running, sq)
		batch = append(batch, s.stepItem(sq, n))
		budget.charge(n, cost)
	}
	return batch
}

// stepBudget is what is left of a step: compute, in tokens of a full
// forward (StepTokenBudget), and raw tokens, within what the worker
// accepts in one Execute. A token of a CacheBlend prefill that the plan
// reuses is charged only its share of the forward (seqReuse.cost): the
// forward computes it in the first layers and, for the recomputed few,
// in the rest. So a reused prompt is prefilled in as few steps as its
// compute allows, not cut into StepTokenBudget-token chunks each paying
// a retrieve and a forward of its own.
type stepBudget struct{ compute, raw int }

func (b stepBudget) open() bool { return b.compute > 0 && b.raw > 0 }

func (b *stepBudget) charge(n, cost int) { b.compute, b.raw = b.compute-cost, b.raw-n }

// lone is the tokens a CacheBlend prefill may take regardless of the
// compute budget when alone is set (it runs alone in its step:
// Config.LoneBlendTokens), else 0.
func (s *Scheduler) lone(alone bool) int {
	if !alone {
		return 0
	}
	return max(s.cfg.LoneBlendTokens, 0)
}

// chunk returns how many of sq's tokens from position from the step can
// take, and their compute cost. A CacheBlend prefill takes at least
// min(lone, its rest) tokens (within the raw limit) whatever their cost:
// see Config.LoneBlendTokens.
func (b stepBudget) chunk(sq *seq, from int, lone int) (n, cost int) {
	limit := min(len(sq.kv.tokens)-from, b.raw)
	if limit <= 0 || b.compute <= 0 {
		return 0, 0
	}
	r := sq.reuse
	if len(r.ranges) == 0 || r.cost >= 1 || from >= sq.kv.prefillEnd {
		n = min(limit, b.compute)
		return n, n
	}
	if n = min(limit, lone); n > 0 {
		if m, c := blendChunk(r.ranges, from, limit, b.compute, r.cost); m > n {
			return m, c // the budget goes further
		}
		_, cost = blendChunk(r.ranges, from, n, n, r.cost) // a reused token costs at most 1
		return n, cost
	}
	return blendChunk(r.ranges, from, limit, b.compute, r.cost)
}

// blendChunk returns how many tokens from position from (at most limit) a
// compute budget covers when a token inside reused (sorted, disjoint
// ranges) costs w and any other 1, and the compute they use (rounded up;
// at most budget). The first token always fits a positive budget.
func blendChunk(reused []reuseplan.Range, from, limit, budget int, w float64) (n, cost int) {
	left := float64(budget)
	pos, end := from, from+limit
	for pos < end {
		segEnd, per := end, 1.0
		for _, r := range reused {
			if r.End <= pos {
				continue
			}
			if r.Start <= pos {
				segEnd, per = min(end, r.End), w
			} else {
				segEnd = min(end, r.Start)
			}
			break
		}
		k := min(segEnd-pos, int(left/per))
		if k <= 0 {
			break
		}
		pos += k
		left -= float64(k) * per
	}
	return pos - from, budget - int(left)
}

// blendTokenCost is the compute share of a reused token in the CacheBlend
// forward of a layers-deep model whose worker reports check layer cl
// (InfoResponse.check_layer): every layer up to the check layer, then the
// recompute ratio of the rest, (cl+1 + (L-cl-1)·r)/L. It is 1 (a reused
// token is charged like a computed one) when the worker reports no check
// layer (0), or the model is too shallow (or unknown) for the difference.
func blendTokenCost(layers, cl int, ratio float64) float64 {
	if cl <= 0 || layers <= cl+1 || ratio <= 0 || ratio >= 1 {
		return 1
	}
	return (float64(cl+1) + float64(layers-cl-1)*ratio) / float64(layers)
}

// stepLimits are the step's budget and the running-sequence bound: the
// configured ones, within what the worker accepts in one Execute (no raw
// token limit when the worker states none).
func (s *Scheduler) stepLimits() (stepBudget, int) {
	b := stepBudget{compute: s.cfg.StepTokenBudget, raw: math.MaxInt}
	seqs := s.cfg.MaxRunning
	if n := int(s.worker.info.GetMaxStepTokens()); n > 0 {
		b.compute, b.raw = min(b.compute, n), n
	}
	if n := int(s.worker.info.GetMaxStepSeqs()); n > 0 {
		seqs = min(seqs, n)
	}
	return b, seqs
}

func (s *Scheduler) stepItem(sq *seq, n int) item {
	return item{sq: sq, n: n, sample: !sq.req.Document && sq.kv.computed+n == len(sq.kv.tokens)}
}

// admit allocates blocks for a waiting sequence's first chunk, reusing the
// prefix cache and the CacheBlend plan, and reports the tokens to compute
// and their cost in the budget.
func (s *Scheduler) admit(sq *seq, budget stepBudget, lone int, now time.Time) (int, int, bool) {
	planStart := time.Now()
	kv := &sq.kv
	acquired, local := s.blocks.acquire(kv, len(kv.tokens)-1) // the last token is always computed
	start, reused, prefixLeg := s.planReuse(sq, local)
	kv.prefillEnd = len(kv.tokens)
	n, cost := budget.chunk(sq, start, lone)
	if !s.blocks.take(kv, acquired, start+n) {
		sq.reuse.reset()
		return 0, 0, false
	}
	kv.computed = start
	s.blocks.admitted(local+reused, len(kv.tokens)) // the prefix leg is among the reused tokens
	if sq.admitted {
		return n, cost, true
	}
	sq.admitted = true
	s.defer_(func() {
		sq.h.update(func(r *Result) {
			r.Admitted, r.CachedTokens, r.ReusedTokens, r.PrefixReusedTokens = now, local, reused, prefixLeg
		})
	})
	if sq.trace.schedSpan != nil {
		// cb.build_meta ends once buildExecute has built the request's step
		// metadata (metaDone); cb.schedule with it.
		sq.trace.meta = &buildMeta{start: planStart, attrs: []attribute.KeyValue{
			attribute.String("request_id", sq.id),
			attribute.Int("local_prefix_hit_tokens", local),
			attribute.Int("start_pos", start),
			attribute.Int("n_matches", len(sq.reuse.plan.GetMatches())),
			attribute.Int("reused_tokens", reused),
			attribute.Int("n_blocks", len(kv.blocks)),
		}}
	}
	return n, cost, true
}

// buildExecute turns the batch into the step request; nil when there is
// nothing to send (no batch, no finished ids, no store report due).
func (s *Scheduler) buildExecute(batch []item, now time.Time) *cbv1.ExecuteRequest {
	storePoll := s.blocks.polling() && !now.Before(s.nextStorePoll)
	if len(batch) == 0 && len(s.buf.finished) == 0 && !storePoll {
		return nil
	}
	if s.blocks.polling() {
		s.nextStorePoll = now.Add(s.cfg.StorePollInterval)
	}
	s.stepID++
	// The request, its SeqSteps and the finished ids are reused step after
	// step, and its slices alias the sequences' own (blocks and tokens are
	// only appended to, by this goroutine, after the call): the step loop
	// sends one Execute at a time and gRPC marshals it before returning.
	req := &s.buf.req
	seqs := req.Seqs[:cap(req.Seqs)]
	clear(seqs)
	req.Reset()
	req.StepId, req.FinishedRequestIds, req.Seqs = s.stepID, s.buf.finished, seqs[:0]
	s.buf.finished, s.buf.spare = s.buf.spare[:0], s.buf.finished
	for _, it := range batch {
		req.Seqs = append(req.Seqs, s.seqStep(it, now))
		if it.sq.trace.meta != nil {
			s.metaDone(it.sq, time.Now())
		}
	}
	return req
}

// seqStep fills the step entry of one batch item.
func (s *Scheduler) seqStep(it item, now time.Time) *cbv1.SeqStep {
	sq, kv := it.sq, &it.sq.kv
	st := sq.step
	if st == nil {
		st = new(cbv1.SeqStep)
		sq.step = st
	} else {
		st.Reset()
	}
	st.RequestId, st.TraceContext, st.TraceState = sq.id, sq.trace.parent, sq.trace.state
	st.BlockTable = kv.blocks
	st.Tokens = kv.tokens[kv.computed : kv.computed+it.n : kv.computed+it.n]
	st.StartPos = int32(kv.computed)
	st.IsPrefill = kv.computed < kv.prefillEnd
	st.Sample, st.Sampling, st.Document = it.sample, sq.req.Sampling, sq.req.Document
	if !sq.started {
		st.PromptTokens = kv.tokens[:kv.prefillEnd:kv.prefillEnd]
		sq.started = true
		if p := sq.req.Prefilled; p != nil && !sq.resumed {
			st.RngDraws = p.RNGDraws
		}
	}
	if it.sample && len(sq.req.HandoffSecret) > 0 {
		st.HandoffSecret = sq.req.HandoffSecret
	}
	if st.IsPrefill && sq.reuse.plan != nil {
		st.CbPlan = sq.reuse.plan
	}
	st.QualityCheck = st.IsPrefill && sq.req.Blend.QualityCheck
	wantStore := sq.req.Document || (s.deps.Blend != nil && !s.cfg.DisableStore && !sq.req.NoReuse)
	if wantStore && !sq.storeSent && kv.computed+it.n == kv.prefillEnd {
		st.Store = true
		sq.storeSent = true
		s.blocks.hold(sq.id, now.Add(s.cfg.StoreTimeout))
		s.nextStorePoll = now.Add(s.cfg.StorePollInterval)
	}
	return st
}

// metaDone records cb.build_meta, ending at end, and ends cb.schedule.
func (s *Scheduler) metaDone(sq *seq, end time.Time) {
	m, tr := sq.trace.meta, sq.trace
	sq.trace.meta = nil
	s.defer_(func() {
		_, bm := s.deps.Spans.Start(tr.schedCtx, spanname.CBBuildMeta, trace.WithTimestamp(m.start), trace.WithAttributes(m.attrs...))
		bm.End(trace.WithTimestamp(end))
		tr.schedSpan.End(trace.WithTimestamp(end))
	})
}

// applyStep folds the worker's answer into the sequences.
func (s *Scheduler) applyStep(batch []item, resp *cbv1.ExecuteResponse, err error, now time.Time) {
	if err != nil && s.loop.ctx.Err() != nil { // shutting down: not the worker's fault
		s.finishAll(ErrShutdown, now)
		return
	}
	if err != nil {
		s.workerFailed(err, now)
		return
	}
	outputs := resp.GetOutputs()
	tokens := 0
	for i, it := range batch {
		tokens += it.n
		sq := it.sq
		if sq.state != stRunning {
			continue // aborted during the step
		}
		out := outputOf(outputs, i, sq.id)
		if msg := out.GetError(); msg != "" {
			s.finish(sq, "", &WorkerError{RequestID: sq.id, Msg: msg}, now)
			continue
		}
		sq.kv.computed += it.n
		s.blocks.commit(&sq.kv)
		if sq.req.Document && sq.kv.computed >= sq.kv.prefillEnd {
			s.docPrefilled(sq)
			continue
		}
		if !it.sample {
			continue
		}
		if !out.GetHasToken() {
			s.finish(sq, "", &WorkerError{RequestID: sq.id, Msg: "no token sampled for a step that asked for one"}, now)
			continue
		}
		s.reuseLoaded(sq, it, out)
		if out.GetQualitySampled() {
			sq.h.update(func(r *Result) { r.QualitySampled = true })
		}
		s.appendToken(sq, out.GetToken(), now)
	}
	s.batchTokens = tokens
	for _, id := range resp.GetStoredRequestIds() {
		if hold := s.blocks.storeDone(id); hold != nil && hold.doc != nil {
			s.finish(hold.doc, FinishStored, nil, now)
		}
	}
	for _, id := range resp.GetHandoffReleasedIds() {
		s.blocks.handoffDone(id)
	}
}

// reuseLoaded corrects the reuse counts of a request whose whole prompt was
// prefilled in one step with its CacheBlend plan (it: the step's item, the
// first token sampled), with what the worker's forward took as loaded:
// SeqOutput.reused_tokens, the positions it skipped as an exact prefix (the
// engine's cached blocks included) plus the reused positions with loaded KV.
// A plan range the blend server could not serve, or a failed load, was
// computed instead: it is then not counted as reused (the counts are only
// ever lowered). A prompt prefilled in several steps keeps the plan's
// counts.
func (s *Scheduler) reuseLoaded(sq *seq, it item, out *cbv1.SeqOutput) {
	plan := sq.reuse.plan
	if plan == nil || sq.resumed || len(sq.kv.tokens) != sq.kv.nPrompt || sq.kv.computed-it.n != int(plan.GetPrefixHitTokens()) {
		return
	}
	loaded := int(out.GetReusedTokens())
	sq.h.update(func(r *Result) {
		if loaded >= r.CachedTokens+r.ReusedTokens {
			return
		}
		fromBlend := max(loaded-r.CachedTokens, 0)
		r.ReusedTokens = fromBlend
		r.PrefixReusedTokens = min(r.PrefixReusedTokens, fromBlend)
	})
}

// outputOf returns the output of request id: the i-th one when the worker
// answered in the order of the step (it does), else found by a scan; nil
// when there is none.
func outputOf(outputs []*cbv1.SeqOutput, i int, id string) *cbv1.SeqOutput {
	if i < len(outputs) && outputs[i].GetRequestId() == id {
		return outputs[i]
	}
	for _, o := range outputs {
		if o.GetRequestId() == id {
			return o
		}
	}
	return nil
}

func (s *Scheduler) appendToken(sq *seq, tok int32, now time.Time) {
	sq.kv.tokens = append(sq.kv.tokens, tok)
	nOut := len(sq.kv.tokens) - sq.kv.nPrompt
	sq.h.update(func(r *Result) {
		r.Tokens = append(r.Tokens, tok)
		r.TokenTimes = append(r.TokenTimes, now)
	})
	if len(sq.req.HandoffSecret) > 0 {
		s.handedOff(sq, now)
		return
	}
	info := s.worker.info
	eos := !sq.req.IgnoreEOS && info != nil && (tok == info.GetEos() || slices.Contains(info.GetStopTokens(), tok))
	last := nOut >= sq.req.MaxTokens
	switch {
	case eos:
		s.finish(sq, FinishStop, nil, now)
	case sq.req.OnToken != nil:
		// OnToken runs once the lock is released, before the loop
		// schedules again (the loop runs the deferred actions itself).
		s.defer_(func() { s.afterToken(sq, tok, last, now) })
	case last:
		s.finish(sq, FinishLength, nil, now)
	}
}

// afterToken hands a token to the request's OnToken, without the lock, and
// finishes the request when it asks to stop or reached its limit.
func (s *Scheduler) afterToken(sq *seq, tok int32, last bool, now time.Time) {
	stop := sq.req.OnToken(tok)
	if !stop && !last {
		return
	}
	reason := FinishLength
	if stop {
		reason = FinishStop
	}
	s.mu.Lock()
	s.finish(sq, reason, nil, now)
	s.unlock()
}

// docPrefilled parks a document whose prefill is done until its store is
// reported.
func (s *Scheduler) docPrefilled(sq *seq) {
	s.q.running = without(s.q.running, sq)
	sq.state = stStoring
	s.blocks.parkDoc(sq, time.Now().Add(s.cfg.StoreTimeout)) // held since the store was sent
	s.forget(sq)
}

// preempt returns a running sequence to the front of the waiting queue,
// releasing its blocks; it is recomputed (prompt plus generated tokens) when
// readmitted.
func (s *Scheduler) preempt(sq *seq) {
	s.q.running = without(s.q.running, sq)
	s.blocks.release(sq.id, &sq.kv)
	s.forget(sq)
	computed := sq.kv.computed
	sq.kv.computed, sq.kv.committed = 0, 0
	sq.resumed = true
	sq.reuse.reset()
	sq.state = stWaiting
	s.q.waiting = slices.Insert(s.q.waiting, 0, sq)
	s.preemptions++
	nOut := len(sq.kv.tokens) - sq.kv.nPrompt
	span := sq.trace.reqSpan
	s.defer_(func() {
		sq.h.update(func(r *Result) { r.Preemptions++ })
		span.AddEvent("preempted", trace.WithAttributes(
			attribute.Int("computed_tokens", computed), attribute.Int("output_tokens", nOut)))
	})
}
