package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/tokenizer"
)

type service struct {
	cbv1.UnimplementedWorkerServiceServer
	w *Worker
}

func (s *service) Info(context.Context, *cbv1.InfoRequest) (*cbv1.InfoResponse, error) {
	w := s.w
	c := w.model.Config()
	r := &cbv1.InfoResponse{
		Model: w.cfg.ModelName, Vocab: int32(c.Vocab), MaxPositions: int32(c.MaxPositions),
		NumBlocks: int32(w.cfg.NumBlocks), BlockSize: int32(w.cfg.BlockSize),
		Bos: tokenizer.BOS, Eos: tokenizer.EOS, NumLayers: int32(c.Layers), WorkerId: w.cfg.WorkerID,
		MaxStepSeqs: MaxStepSeqs, MaxStepTokens: MaxStepTokens, WorldSize: int32(w.group.world),
		StopTokens: []int32{tokenizer.EOS}, CheckLayer: int32(c.CheckLayer),
		BlendGate: w.gate.Outcome, BlendGateKl: w.gate.KL, BlendOff: w.gate.Off,
	}
	if f := w.file; f != nil {
		r.ModelIdentity, r.ModelFileName = f.Identity, f.Name
		r.Bos, r.Eos, r.StopTokens = f.BOS, f.EOS, f.Stop
	}
	return r, nil
}

func (s *service) Execute(ctx context.Context, req *cbv1.ExecuteRequest) (*cbv1.ExecuteResponse, error) {
	if w := s.w; w.group.world > 1 && w.cfg.Rank > 0 {
		// A step run on one rank alone would stall the group's all-reduce:
		// ranks 1..N-1 take their steps from rank 0 (rankgroup.Serve).
		return nil, status.Errorf(codes.FailedPrecondition, "execute: rank %d of a tensor-parallel worker takes its steps from rank 0", w.cfg.Rank)
	}
	return s.w.Execute(ctx, req)
}

func (s *service) PullKV(ctx context.Context, req *cbv1.PullKVRequest) (*cbv1.PullKVResponse, error) {
	return s.w.PullKV(ctx, req)
}

var attrRequestID = attribute.Key("request_id")

// Execute runs one scheduler step: drops finished requests, runs every
// prefill chunk (with CacheBlend reuse when the step carries a plan), then
// one batched decode, and samples a token for every sequence that asks.
// A sequence whose input is bad fails alone (its output carries the error);
// a malformed request as a whole is InvalidArgument.
//
// On rank 0 of a tensor-parallel group (Deps.Peers) the step runs on every
// rank; a failed group (a rank died) is Unavailable.
func (w *Worker) Execute(ctx context.Context, req *cbv1.ExecuteRequest) (*cbv1.ExecuteResponse, error) {
	if err := w.checkStep(req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "execute: %v", err)
	}
	if w.group.peers == nil {
		return w.execute(ctx, req)
	}
	resp, err := w.group.peers.Execute(ctx, req, w.execute)
	if err != nil {
		if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
			return nil, err
		}
		return nil, status.Errorf(codes.Unavailable, "execute: %v", err)
	}
	return resp, nil
}

// execute runs a checked step on this rank.
func (w *Worker) execute(ctx context.Context, req *cbv1.ExecuteRequest) (*cbv1.ExecuteResponse, error) {
	w.execMu.Lock()
	defer w.execMu.Unlock()
	// Hand-overs of finished requests stop first: their blocks may be
	// reused by this step's sequences.
	w.stopHandoffs(req.GetFinishedRequestIds())
	for _, id := range req.GetFinishedRequestIds() {
		delete(w.seqs, id)
	}
	resp := &cbv1.ExecuteResponse{}
	var decodes []*cbv1.SeqStep
	for _, sq := range req.GetSeqs() {
		if err := w.checkSeq(sq); err != nil {
			resp.Outputs = append(resp.Outputs, &cbv1.SeqOutput{RequestId: sq.GetRequestId(), Error: err.Error()})
			continue
		}
		if !sq.GetIsPrefill() {
			decodes = append(decodes, sq)
			continue
		}
		out := w.prefill(ctx, sq)
		resp.Outputs = append(resp.Outputs, out)
	}
	if len(decodes) > 0 {
		resp.Outputs = append(resp.Outputs, w.decode(decodes)...)
	}
	w.metrics.Step()
	w.stores.mu.Lock()
	resp.StoredRequestIds, w.stores.done = w.stores.done, nil
	w.stores.mu.Unlock()
	resp.HandoffReleasedIds = w.takeReleased()
	return resp, nil
}

func (w *Worker) state(sq *cbv1.SeqStep) (*seqState, error) {
	st := w.seqs[sq.GetRequestId()]
	if st == nil {
		if len(sq.GetPromptTokens()) == 0 {
			return nil, fmt.Errorf("first step of %s carries no prompt_tokens", sq.GetRequestId())
		}
		p := sq.GetSampling()
		st = &seqState{
			prompt: slices.Clone(sq.GetPromptTokens()),
			rng:    rand.New(rand.NewPCG(p.GetSeed(), p.GetSeed()^0x9e3779b97f4a7c15)),
		}
		// A request handed over from another worker continues its sampler
		// (checkSeq bounds the draws); model.Sample draws once per token.
		for range sq.GetRngDraws() {
			st.rng.Float64()
		}
		if sq.GetCbPlan() != nil {
			plan, err := rpc.PlanFromProto(sq.GetCbPlan())
			if err != nil {
				return nil, fmt.Errorf("step of %s: bad CacheBlend plan: %w", sq.GetRequestId(), err)
			}
			st.plan = &plan
			st.rule, err = blendRule(sq.GetCbPlan())
			if err != nil {
				return nil, fmt.Errorf("step of %s: bad CacheBlend plan: %w", sq.GetRequestId(), err)
			}
		}
		st.qualityCheck = sq.GetQualityCheck()
		w.seqs[sq.GetRequestId()] = st
	}
	return st, nil
}

// blendRule returns the recompute ratio and selection rule of plan, as
// BlendInput fields: the plan's ratio must lie in [0, 1] (the engine
// always sets it; 0 reuses without recompute).
func blendRule(plan *cbv1.CBPlan) (model.BlendInput, error) {
	r := plan.GetRecompRatio()
	if math.IsNaN(r) || r < 0 || r > 1 {
		return model.BlendInput{}, fmt.Errorf("recompute ratio %v outside [0, 1]", r)
	}
	in := model.BlendInput{RecompRatio: r, SelectSeed: plan.GetSelectionSeed()}
	switch plan.GetSelection() {
	case cbv1.Selection_SELECTION_DEVIATION:
		in.Select = model.SelectDeviation
	case cbv1.Selection_SELECTION_RANDOM:
		in.Select = model.SelectRandom
	default:
		return model.BlendInput{}, fmt.Errorf("unknown selection rule %v", plan.GetSelection())
	}
	return in, nil
}

func sampling(p *cbv1.SamplingParams) model.SamplingParams {
	return model.SamplingParams{Temperature: p.GetTemperature(), TopP: p.GetTopP()}
}

// prefill computes one prompt chunk of a sequence.
func (w *Worker) prefill(ctx context.Context, sq *cbv1.SeqStep) *cbv1.SeqOutput {
	id := sq.GetRequestId()
	out := &cbv1.SeqOutput{RequestId: id}
	st, err := w.state(sq)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	start := int(sq.GetStartPos())
	end := start + len(sq.GetTokens())
	if end > len(st.prompt) || start < 0 || len(sq.GetTokens()) == 0 {
		out.Error = fmt.Sprintf("prefill chunk [%d,%d) outside the %d-token prompt", start, end, len(st.prompt))
		return out
	}
	pctx, exec := w.spans.Start(stepContext(ctx, sq), spanname.CBExecute, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrRequestID.String(id), attribute.Int("start_pos", start), attribute.Int("n_tokens", end-start)),
		trace.WithAttributes(w.rankAttrs()...))
	defer exec.End()

	bt := sq.GetBlockTable()
	loaded, await, wait := w.startLoad(pctx, id, st, start, end, bt)
	defer wait()

	fctx, fwd := w.spans.Start(pctx, spanname.CBModelForward, trace.WithAttributes(attrRequestID.String(id)), trace.WithAttributes(w.rankAttrs()...))
	t0 := time.Now()
	var logits []float32
	var stats model.BlendStats
	// The ranks of a group may have loaded different parts of the plan (a
	// chunk gone on one rank): they all run the blended forward, which
	// reuses only what every rank loaded, so they make the same calls.
	blended := st.plan != nil && (w.group.world > 1 || len(loaded.Reused) > 0 || loaded.Prefix > start)
	if blended {
		in := model.BlendInput{
			Tokens:      st.prompt[:end],
			BlockTable:  bt,
			CheckLayer:  model.UseConfig,
			RecompRatio: st.rule.RecompRatio,
			Select:      st.rule.Select,
			SelectSeed:  st.rule.SelectSeed,
			Await:       await,
		}
		in.PrefixReused, in.Reused = loaded.Forward(start, end)
		logits, stats, err = w.model.BlendForward(w.kv, in)
		if err == nil {
			w.phaseSpans(fctx, id, stats)
			out.ImpCount = int32(stats.ImpCount)
			out.ReusedTokens = int32(stats.ReusedTokens + stats.PrefixTokens)
			fwd.SetAttributes(attribute.Int("imp_count", stats.ImpCount), attribute.Int("reused_tokens", stats.ReusedTokens),
				attribute.Int("prefix_tokens", stats.PrefixTokens), attribute.Int("new_tokens", stats.NewTokens))
		}
	} else {
		// Into a reused buffer: the logits are sampled below, before it
		// goes back.
		buf := w.logitBufs.Get(w.model.Config().Vocab)
		defer w.logitBufs.Put(buf)
		logits, err = w.model.Prefill(w.kv, model.PrefillInput{Tokens: sq.GetTokens(), Start: start, BlockTable: bt, Into: buf})
		if err == nil {
			w.metrics.ObserveForward(fctx, metrics.PhasePrefill, time.Since(t0))
		}
	}
	if err != nil {
		fwd.SetError("forward_failed", err)
		fwd.End()
		exec.SetError("forward_failed", err)
		out.Error = err.Error()
		return out
	}
	fwd.End()
	if stats.Blended && end == len(st.prompt) {
		out.QualitySampled = w.sampleQuality(id, st.prompt, bt, logits, stats, fwd, st.qualityCheck)
	}
	if sq.GetSample() {
		out.HasToken = true
		out.Token = model.Sample(logits, sampling(sq.GetSampling()), st.rng)
		if secret := sq.GetHandoffSecret(); len(secret) > 0 {
			// Handed over to a decode engine: keep the prompt's KV for its
			// read; this worker computes nothing more for the request.
			if err := w.keepKV(id, secret, bt, st.prompt); err != nil {
				return &cbv1.SeqOutput{RequestId: id, Error: "hand-over: " + err.Error()}
			}
			delete(w.seqs, id)
		}
	}
	if sq.GetStore() && end == len(st.prompt) && w.blend != nil {
		w.storeAsync(pctx, id, st.prompt, slices.Clone(bt), sq.GetDocument())
	} else if sq.GetStore() && end == len(st.prompt) {
		w.markStored(id) // nothing to store into: release the blocks at once
	}
	return out
}

// startLoad loads the plan's KV for the chunk [start, end) of a prefill
// into the blocks bt: concurrently with the forward when overlapLayer
// allows it (await then waits for the load and returns what it wrote, and
// wait must run before the step returns: the copy writes into blocks the
// engine reuses after), else before it. loaded is what the forward takes as
// loaded.
func (w *Worker) startLoad(ctx context.Context, id string, st *seqState, start, end int, bt []int32) (loaded reuseplan.Loaded, await func() ([]reuseplan.Range, error), wait func()) {
	wait = func() {}
	if st.plan == nil || st.reuseFailed {
		return st.loaded, nil, wait
	}
	capTokens := min(kvcache.Capacity(bt, w.cfg.BlockSize), len(st.prompt))
	if !st.loaded.Pending(*st.plan, capTokens) {
		return st.loaded, nil, wait
	}
	cl := w.overlapLayer(st, start, end, capTokens)
	if cl == 0 {
		w.loadKV(ctx, id, st, bt, capTokens, 0)
		return st.loaded, nil, wait
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.loadKV(ctx, id, st, bt, capTokens, cl)
	}()
	loaded.Add(*st.plan, end, nil) // the plan, assumed loaded
	await = func() ([]reuseplan.Range, error) {
		<-done
		_, got := st.loaded.Forward(start, end) // empty when the load failed
		return got, nil
	}
	return loaded, await, func() { <-done }
}

// rankAttrs is the rank attribute of a tensor-parallel rank's spans
// (nothing on a whole-model worker).
func (w *Worker) rankAttrs() []attribute.KeyValue {
	if w.group.world <= 1 {
		return nil
	}
	return []attribute.KeyValue{attribute.Int("rank", w.cfg.Rank), attribute.Int("world_size", w.group.world)}
}

// stepContext is the parent context of a step's cb.execute: the engine's
// cb.request when the step carries a valid trace_context (option A, with the
// caller's tracestate from trace_state). Without one (the engine does not
// trace) cb.execute is a root whose trace id is derived from the request id
// (option B, telemetry.TraceIDFromRequestID), so the worker's spans land in
// the trace the blend server opens for the same request; the tracer provider
// honours it (telemetry/provider's id generator).
func stepContext(ctx context.Context, sq *cbv1.SeqStep) context.Context {
	if sc, ok := telemetry.SpanContextFromStrings(sq.GetTraceContext(), sq.GetTraceState()); ok {
		return trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	// No context from the engine: not the gRPC metadata's either (an
	// Execute carries many requests), so a root of the request's own trace.
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	return telemetry.ContextWithTraceID(ctx, telemetry.TraceIDFromRequestID(sq.GetRequestId()))
}

// phaseSpans records cb.full_recomp / cb.check / cb.partial with the
// forward's own timestamps, and the phase histograms.
func (w *Worker) phaseSpans(ctx context.Context, id string, s model.BlendStats) {
	if !s.Blended {
		if !s.FullRecompStart.IsZero() {
			w.metrics.ObserveForward(ctx, metrics.PhasePrefill, s.FullRecompEnd.Sub(s.FullRecompStart))
		}
		return
	}
	rid := attrRequestID.String(id)
	if !s.FullRecompStart.IsZero() {
		_, sp := w.spans.Start(ctx, spanname.CBFullRecomp, trace.WithTimestamp(s.FullRecompStart),
			trace.WithAttributes(rid, attribute.Int("layers", s.CheckLayer)))
		sp.End(trace.WithTimestamp(s.FullRecompEnd))
		w.metrics.ObserveForward(ctx, metrics.PhaseFullRecomp, s.FullRecompEnd.Sub(s.FullRecompStart))
	}
	if !s.CheckStart.IsZero() {
		_, sp := w.spans.Start(ctx, spanname.CBCheck, trace.WithTimestamp(s.CheckStart),
			trace.WithAttributes(rid, attribute.Int("imp_count", s.ImpCount), attribute.Float64("recomp_ratio", s.RecompRatio),
				attribute.Int("check_layer", s.CheckLayer), attribute.Int("selected", s.Selected)))
		sp.End(trace.WithTimestamp(s.CheckEnd))
		w.metrics.ObserveForward(ctx, metrics.PhaseCheck, s.CheckEnd.Sub(s.CheckStart))
	}
	if !s.PartialStart.IsZero() {
		_, sp := w.spans.Start(ctx, spanname.CBPartial, trace.WithTimestamp(s.PartialStart),
			trace.WithAttributes(rid, attribute.String("dispatch", s.Dispatch), attribute.Bool("imp_empty", s.ImpEmpty)))
		sp.End(trace.WithTimestamp(s.PartialEnd))
		w.metrics.ObserveForward(ctx, metrics.PhasePartial, s.PartialEnd.Sub(s.PartialStart))
	}
	if s.ReusedTokens > 0 {
		w.metrics.ObserveRecomputeRatio(s.Selected, s.ReusedTokens)
	}
}

// overlapLayer is the check layer when this prefill's load (pending, up to
// capTokens) may run concurrently with the forward's first layers
// (model.BlendInput.Await), else 0: a whole-model worker, a first load pass
// that covers the chunk [start, end), no exact prefix to load (the first
// layer reads it) and a check layer above 0.
func (w *Worker) overlapLayer(st *seqState, start, end, capTokens int) int {
	cl := w.model.Config().CheckLayer
	if w.group.world > 1 || cl <= 0 || st.loaded.To != 0 || capTokens < end {
		return 0
	}
	for _, m := range st.plan.Matches {
		if m.Prefix && m.Cur.End > start {
			return 0
		}
	}
	return cl
}

// loadKV asks the blend server to scatter the plan's matches into the
// blocks allocated so far, which hold capTokens of the prompt
// (cb.start_load_kv → cb.retrieve). It runs again when more blocks arrive.
// On failure the request is computed in full. shiftedFromLayer > 0 leaves
// the layers below it of the non-prefix matches unwritten (the forward
// running concurrently recomputes them).
func (w *Worker) loadKV(ctx context.Context, id string, st *seqState, bt []int32, capTokens, shiftedFromLayer int) {
	lctx, sp := w.spans.Start(ctx, spanname.CBStartLoadKV, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrRequestID.String(id), attribute.Int("from_token", st.loaded.To), attribute.Int("capacity_tokens", capTokens)),
		trace.WithAttributes(w.rankAttrs()...))
	if shiftedFromLayer > 0 {
		sp.SetAttributes(attribute.Int("shifted_from_layer", shiftedFromLayer))
	}
	defer sp.End()
	token := w.token()
	if token == nil {
		err := errors.New("blend server unavailable (KV memory not registered)")
		w.reuseFailed(st, sp, err)
		return
	}
	rctx, cancel := context.WithTimeout(lctx, w.cfg.RPCTimeout)
	defer cancel()
	tp, ts := telemetry.InjectStrings(lctx)
	resp, err := w.blend.Retrieve(rctx, &cbv1.RetrieveRequest{
		RequestId: id, TraceContext: tp, TraceState: ts, WorkerId: w.cfg.WorkerID, Rank: int32(w.cfg.Rank),
		BlockTable: bt, Matches: rpc.MatchesToProto(st.plan.Matches), FromToken: int32(st.loaded.To), ChunkSize: int32(st.plan.ChunkSize),
		RegistrationToken: token, ShiftedFromLayer: int32(shiftedFromLayer),
	})
	if err != nil {
		w.reuseFailed(st, sp, fmt.Errorf("retrieve: %w", err))
		return
	}
	st.loaded.Add(*st.plan, capTokens, rpc.RangesFromProto(resp.GetMissing()))
	w.metrics.AddKVTransfer(metrics.KVLoad, resp.GetBytes(), int64(resp.GetScatteredTokens()))
	sp.SetAttributes(attribute.Int("scattered_tokens", int(resp.GetScatteredTokens())), attribute.Int("dropped", int(resp.GetDropped())),
		attribute.Int("missing_ranges", len(resp.GetMissing())))
}

// reuseFailed records a failed load: the request is computed in full (the
// KV written so far is ignored and overwritten).
func (w *Worker) reuseFailed(st *seqState, sp *telemetry.Span, err error) {
	st.reuseFailed = true
	st.loaded = reuseplan.Loaded{}
	sp.SetError("retrieve_failed", err)
	w.metrics.BlendFailure(metrics.BlendOpRetrieve)
	w.logger.Warn("KV load failed; computing in full", "err", err)
}

// decode runs one batched decode step.
func (w *Worker) decode(seqs []*cbv1.SeqStep) []*cbv1.SeqOutput {
	outs := make([]*cbv1.SeqOutput, len(seqs))
	in := make([]model.DecodeInput, 0, len(seqs))
	idx := make([]int, 0, len(seqs))
	for i, sq := range seqs {
		outs[i] = &cbv1.SeqOutput{RequestId: sq.GetRequestId()}
		if w.seqs[sq.GetRequestId()] == nil {
			if len(sq.GetPromptTokens()) == 0 {
				outs[i].Error = "decode for an unknown request (no prefill seen)"
				continue
			}
			// A request handed over by a prefill engine: its prompt's KV
			// was pulled into the block table; its first step is a decode.
			if _, err := w.state(sq); err != nil {
				outs[i].Error = err.Error()
				continue
			}
		}
		if len(sq.GetTokens()) != 1 {
			outs[i].Error = fmt.Sprintf("decode step carries %d tokens, want 1", len(sq.GetTokens()))
			continue
		}
		in = append(in, model.DecodeInput{Token: sq.GetTokens()[0], Pos: int(sq.GetStartPos()), BlockTable: sq.GetBlockTable()})
		idx = append(idx, i)
	}
	if len(in) == 0 {
		return outs
	}
	t0 := time.Now()
	vocab := w.model.Config().Vocab
	logits := w.logitBufs.Get(len(in) * vocab)
	defer w.logitBufs.Put(logits)
	err := w.model.DecodeInto(w.kv, in, logits)
	if err != nil {
		for _, i := range idx {
			outs[i].Error = err.Error()
		}
		return outs
	}
	w.metrics.ObserveForward(context.Background(), metrics.PhaseDecode, time.Since(t0))
	for j, i := range idx {
		sq := seqs[i]
		st := w.seqs[sq.GetRequestId()]
		outs[i].HasToken = true
		outs[i].Token = model.Sample(logits[j*vocab:(j+1)*vocab], sampling(sq.GetSampling()), st.rng)
	}
	return outs
}

// storeAsync copies the prompt's KV into the blend server in the
// background; the engine keeps the blocks until the id is reported back.
func (w *Worker) storeAsync(ctx context.Context, id string, tokens []int32, bt []int32, document bool) {
	select {
	case w.stores.sem <- struct{}{}:
	default:
		w.metrics.BlendFailure(metrics.BlendOpStore)
		w.logger.Warn("too many stores in flight; skipping", "request_id", id)
		w.markStored(id)
		return
	}
	tc, ts := telemetry.InjectStrings(ctx)
	go func() {
		defer func() { <-w.stores.sem }()
		defer w.markStored(id)
		token := w.token()
		if token == nil {
			w.metrics.BlendFailure(metrics.BlendOpStore)
			w.logger.Warn("store skipped: KV memory not registered with the blend server", "request_id", id)
			return
		}
		sctx, cancel := context.WithTimeout(context.Background(), w.cfg.RPCTimeout)
		defer cancel()
		resp, err := w.blend.Store(sctx, &cbv1.StoreRequest{
			RequestId: id, TraceContext: tc, TraceState: ts, WorkerId: w.cfg.WorkerID, Rank: int32(w.cfg.Rank),
			Tokens: tokens, BlockTable: bt, Document: document, Model: w.kvModel,
			RegistrationToken: token,
		})
		if err != nil {
			w.metrics.BlendFailure(metrics.BlendOpStore)
			w.logger.Warn("store failed", "request_id", id, "err", err)
			return
		}
		w.metrics.AddKVTransfer(metrics.KVStore, resp.GetBytes(), int64(len(tokens)))
	}()
}

func (w *Worker) markStored(id string) {
	w.stores.mu.Lock()
	w.stores.done = append(w.stores.done, id)
	w.stores.mu.Unlock()
}
