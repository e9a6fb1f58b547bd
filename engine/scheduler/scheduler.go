package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

// WorldSize is the number of worker ranks a request runs on when the
// worker does not report one (InfoResponse.world_size, cb worker --tp).
const WorldSize = 1

// worldSize is the worker's reported world size (WorldSize before it
// answered). s.mu must be held.
func (s *Scheduler) worldSize() int {
	if s.info == nil {
		return WorldSize
	}
	return max(WorldSize, int(s.info.GetWorldSize()))
}

// idleWake bounds how long the loop sleeps when nothing is due.
const idleWake = time.Minute

type seqState int

const (
	stWaiting seqState = iota
	stRunning
	stStoring // a document whose prefill is done, waiting for its store report
	stPulling // a Prefilled request whose KV is being pulled
	stDone
)

// seq is the scheduler's state of one request. It is guarded by Scheduler.mu.
type seq struct {
	req *Request
	id  string
	h   *Handle

	tokens     []int32 // prompt, then generated tokens
	nPrompt    int
	prefillEnd int // tokens to prefill in the current pass (grows after a preemption)
	computed   int // leading tokens whose KV is in blocks
	blocks     []int32
	hashes     []kvcache.BlockHash // chain hashes of the full blocks of tokens
	committed  int                 // leading blocks registered in the prefix cache
	started    bool                // the worker holds the request's state
	admitted   bool                // taken into a batch at least once
	resumed    bool                // re-admitted after a preemption
	storeSent  bool
	seen       bool
	cancelled  bool
	state      seqState
	stopWatch  func() bool

	reqCtx    context.Context // holds cb.request (the request's ctx for documents)
	reqSpan   *telemetry.Span
	schedCtx  context.Context
	schedSpan *telemetry.Span
	traceCtx  string // traceparent for SeqStep.trace_context
	traceSt   string // tracestate for SeqStep.trace_state
	lookupOut string // the lookup outcome stamped on cb.request ("" until stamped)

	lk         *lookup
	pullCancel context.CancelFunc // of a Prefilled request's pull in flight
	plan       *cbv1.CBPlan
	meta       *buildMeta    // cb.build_meta until the first step metadata is built
	step       *cbv1.SeqStep // its entry of the step request, reused step after step
	// reused are the positions the CacheBlend plan loads, from plan's Start
	// on (sorted, disjoint), and blendCost the compute share of one of them
	// in the forward (see blendTokenCost); nil and 0 without a plan.
	reused    []reuseplan.Range
	blendCost float64
}

// maxLen is the most tokens sq can hold: its prompt and every token it may
// generate.
func (sq *seq) maxLen() int {
	if sq.req.Document {
		return sq.nPrompt
	}
	return sq.nPrompt + sq.req.MaxTokens
}

// item is one sequence's share of a step.
type item struct {
	sq     *seq
	n      int
	sample bool
	doc    bool
}

// Stats is a snapshot of the scheduler, for the engine gauges. KVFree +
// KVUsed + KVCached == KVTotal (all zero before the worker answered Info).
type Stats struct {
	Waiting, Running                  int
	KVFree, KVUsed, KVCached, KVTotal int
	// Evictions and Preemptions are running totals.
	Evictions, Preemptions uint64
	// BatchTokens is the number of tokens computed in the last step.
	BatchTokens int
	// PrefixHitRatio is the lifetime fraction of admitted prompt tokens
	// served from cached KV (the engine's prefix cache or CacheBlend reuse).
	PrefixHitRatio float64
	// Steps counts Execute calls.
	Steps uint64
	// WorkerReady reports whether the worker answered Info and its last step
	// succeeded.
	WorkerReady bool
	// StoresPending counts requests whose store report is awaited.
	StoresPending int
	// Transferring counts Prefilled requests whose KV is being pulled.
	Transferring int
	// HandoffsHeld counts handed-over requests whose blocks are held until
	// the worker reports the keep's end.
	HandoffsHeld int
}

// Scheduler is the step loop. Create it with [New], then Start; Submit
// requests; Shutdown. All methods are safe for concurrent use.
type Scheduler struct {
	cfg   Config
	deps  Deps
	spans *telemetry.Spans
	log   *slog.Logger

	mu              sync.Mutex
	waiting         []*seq
	running         []*seq
	byID            map[string]*seq
	pendingFinished []string
	// The step request and the batch are reused step after step (the loop
	// sends one Execute at a time and the request is marshalled before the
	// call returns); spareFinished is the other buffer of pendingFinished.
	execReq       cbv1.ExecuteRequest
	batchBuf      []item
	spareFinished []string
	blocks        *blockManager
	info          *cbv1.InfoResponse
	ready         bool
	probeFailures uint64 // Info probes failed in a row
	everReady     bool
	closing       bool
	nextProbe     time.Time
	nextStorePoll time.Time
	stepID        uint64
	preemptions   uint64
	batchTokens   int
	after         []func() // run after mu is released
	lookups       *lookupDriver
	pulling       []*seq           // Prefilled requests whose pull is in flight
	pullOutcomes  chan pullOutcome // finished pulls, drained by the loop
	pullCalls     sync.WaitGroup

	wake       chan struct{}
	drained    chan struct{} // poked when the last request in flight finished
	loopCtx    context.Context
	cancelLoop context.CancelFunc
	loopDone   chan struct{}
	started    bool
	stopped    bool
}

// New returns a scheduler; it does nothing until Start.
func New(cfg Config, deps Deps) (*Scheduler, error) {
	if deps.Worker == nil {
		return nil, errors.New("scheduler: a worker client is required")
	}
	cfg = cfg.withDefaults()
	s := &Scheduler{
		cfg:      cfg,
		deps:     deps,
		spans:    deps.Spans,
		log:      deps.Logger,
		byID:     make(map[string]*seq),
		blocks:   newBlockManager(),
		wake:     make(chan struct{}, 1),
		drained:  make(chan struct{}, 1),
		loopDone: make(chan struct{}),
		lookups:  newLookupDriver(deps.Blend, cfg.MaxLookupRPCs),
	}
	s.pullOutcomes = make(chan pullOutcome, cfg.MaxTransfers)
	if s.spans == nil {
		s.spans = telemetry.NewSpans(nil, "github.com/cacheblend/cacheblend/engine/scheduler", nil)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.loopCtx, s.cancelLoop = context.WithCancel(context.Background())
	return s, nil
}

// Start starts the step loop. The loop first asks the worker for its Info
// (retrying every WorkerRetryInterval); Submit refuses requests with
// ErrWorkerUnavailable until it answered. ctx is not retained.
func (s *Scheduler) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("scheduler: already started")
	}
	if s.stopped {
		return ErrShutdown
	}
	s.started = true
	go s.run()
	return nil
}

// Shutdown stops accepting requests, waits for those in flight to finish
// (documents included) until ctx ends, then fails the rest with ErrShutdown
// and stops the loop and its RPC goroutines. It returns ctx's error when it
// had to fail requests. Later calls return nil at once.
func (s *Scheduler) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	s.closing = true
	started := s.started
	s.mu.Unlock()
	s.poke()

	var err error
	for started && s.active() > 0 && err == nil {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-s.drained: // the last one finished (or an earlier poke: checked again)
		}
	}
	if err != nil {
		s.Abort(ErrShutdown)
	}
	s.cancelLoop()
	if started {
		<-s.loopDone
	}
	s.lookups.calls.Wait()
	s.pullCalls.Wait()
	return err
}

// active counts the requests not yet finished.
func (s *Scheduler) active() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// Abort fails every request in flight with err (ErrShutdown when nil); the
// loop keeps running.
func (s *Scheduler) Abort(err error) {
	if err == nil {
		err = ErrShutdown
	}
	s.mu.Lock()
	now := time.Now()
	for _, sq := range s.liveSeqs() {
		s.finish(sq, "", err, now)
	}
	s.unlock()
}

// liveSeqs lists every unfinished request in a deterministic order.
func (s *Scheduler) liveSeqs() []*seq {
	out := slices.Concat(s.running, s.waiting, s.pulling)
	for _, sq := range s.byID {
		if sq.state == stStoring {
			out = append(out, sq)
		}
	}
	return out
}

// WorkerInfo returns the worker's Info once it answered, and whether it is
// ready.
func (s *Scheduler) WorkerInfo() (*cbv1.InfoResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info, s.ready
}

// Stats returns a snapshot of the queues, the KV pool and the counters.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Waiting:      len(s.waiting),
		Running:      len(s.running),
		Preemptions:  s.preemptions,
		BatchTokens:  s.batchTokens,
		Steps:        s.stepID,
		WorkerReady:  s.ready,
		Transferring: len(s.pulling),
	}
	s.blocks.stats(&st)
	return st
}

// Submit queues a request and returns its handle. It fails fast with
// ErrShutdown, ErrWorkerUnavailable, ErrQueueFull, ErrTooLong or
// ErrBadRequest (all wrapped with detail).
func (s *Scheduler) Submit(r *Request) (*Handle, error) {
	if r == nil || r.ID == "" || len(r.Prompt) == 0 {
		return nil, fmt.Errorf("%w: a request needs an id and a non-empty prompt", ErrBadRequest)
	}
	if !r.Document && r.MaxTokens < 1 {
		return nil, fmt.Errorf("%w: max tokens %d < 1", ErrBadRequest, r.MaxTokens)
	}
	if n := len(r.HandoffSecret); n != 0 && (n != SecretBytes || r.Document || r.Prefilled != nil) {
		return nil, fmt.Errorf("%w: a hand-over secret of %d bytes (want %d, on a generation that is not Prefilled)", ErrBadRequest, n, SecretBytes)
	}
	if p := r.Prefilled; p != nil && (p.Pull == nil || r.Document || p.FirstToken < 0) {
		return nil, fmt.Errorf("%w: a Prefilled request needs a Pull and a first token, and is no document", ErrBadRequest)
	}
	ctx := r.Ctx
	if ctx == nil {
		ctx = context.Background()
	}
	s.mu.Lock()
	defer s.unlock()
	switch {
	case s.closing:
		return nil, ErrShutdown
	case !s.ready:
		return nil, fmt.Errorf("%w: it has not answered yet", ErrWorkerUnavailable)
	}
	if _, dup := s.byID[r.ID]; dup {
		return nil, fmt.Errorf("%w: request id %q already in flight", ErrBadRequest, r.ID)
	}
	if _, dup := s.blocks.holds[r.ID]; dup {
		return nil, fmt.Errorf("%w: request id %q still storing", ErrBadRequest, r.ID)
	}
	total := len(r.Prompt)
	if !r.Document {
		total += r.MaxTokens
	}
	if mp := int(s.info.GetMaxPositions()); mp > 0 && total > mp {
		return nil, fmt.Errorf("%w: %d tokens exceed the model's %d positions", ErrTooLong, total, mp)
	}
	if pool := s.blocks.pool; pool.BlocksFor(total) > pool.NumBlocks() {
		return nil, fmt.Errorf("%w: %d tokens need %d KV blocks, the pool has %d", ErrTooLong, total, pool.BlocksFor(total), pool.NumBlocks())
	}
	if v := s.info.GetVocab(); v > 0 {
		for i, t := range r.Prompt {
			if t < 0 || t >= v {
				return nil, fmt.Errorf("%w: token %d at position %d is outside the vocabulary [0, %d)", ErrBadRequest, t, i, v)
			}
		}
		if p := r.Prefilled; p != nil && p.FirstToken >= v {
			return nil, fmt.Errorf("%w: first token %d is outside the vocabulary [0, %d)", ErrBadRequest, p.FirstToken, v)
		}
	}

	if len(s.waiting) >= s.cfg.MaxQueue {
		return nil, fmt.Errorf("%w: %d waiting", ErrQueueFull, len(s.waiting))
	}

	sq := &seq{
		req:        r,
		id:         r.ID,
		h:          newHandle(len(r.Prompt), r.MaxTokens),
		tokens:     append(make([]int32, 0, total), r.Prompt...), // decode appends in place
		nPrompt:    len(r.Prompt),
		prefillEnd: len(r.Prompt),
		reqCtx:     ctx,
	}
	if r.Document || r.Prefilled != nil {
		sq.traceCtx, sq.traceSt = telemetry.InjectStrings(ctx)
	} else {
		sq.reqCtx, sq.reqSpan = s.spans.Start(ctx, spanname.CBRequest, trace.WithAttributes(
			attribute.String("request_id", r.ID),
			attribute.String("model", s.cfg.Model),
			attribute.Int("world_size", s.worldSize()),
			attribute.Int("n_prompt_tokens", len(r.Prompt)),
		))
		sq.traceCtx, sq.traceSt = telemetry.InjectStrings(sq.reqCtx)
	}
	s.waiting = append(s.waiting, sq)
	s.byID[r.ID] = sq
	sq.stopWatch = context.AfterFunc(ctx, func() { s.cancel(sq) })
	s.poke()
	return sq.h, nil
}

func (s *Scheduler) cancel(sq *seq) {
	s.mu.Lock()
	if sq.state != stDone {
		sq.cancelled = true
	}
	s.mu.Unlock()
	s.poke()
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// unlock releases mu and runs the actions deferred while it was held, then
// logs the block accounting errors met meanwhile.
func (s *Scheduler) unlock() {
	fns := s.after
	s.after = nil
	errs := s.blocks.takeErrors()
	s.mu.Unlock()
	for _, f := range fns {
		f()
	}
	for _, err := range errs {
		s.log.Error("kv block accounting error", "error", err.Error())
	}
}

func (s *Scheduler) defer_(f func()) { s.after = append(s.after, f) }

// run is the step loop.
func (s *Scheduler) run() {
	defer close(s.loopDone)
	for s.loopCtx.Err() == nil {
		s.mu.Lock()
		now := time.Now()
		if !s.ready {
			due := !now.Before(s.nextProbe)
			wakeAt := s.nextProbe
			s.unlock()
			if due {
				s.probe()
			} else {
				s.sleep(wakeAt)
			}
			continue
		}
		s.processCancels(now)
		s.expireStores(now)
		s.firstSights(now)
		s.driveLookups(now)
		s.drivePulls()
		batch := s.schedule(now)
		req := s.buildExecute(batch, now)
		if req != nil {
			s.countLookupWaits()
		}
		wakeAt := s.nextWake(now)
		s.unlock()
		if req == nil {
			s.sleep(wakeAt)
			continue
		}
		ctx, cancel := context.WithTimeout(s.loopCtx, s.cfg.StepTimeout)
		resp, err := s.deps.Worker.Execute(ctx, req)
		cancel()
		s.mu.Lock()
		s.applyStep(batch, resp, err, time.Now())
		s.unlock()
	}
}

func (s *Scheduler) sleep(until time.Time) {
	d := time.Until(until)
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.wake:
	case <-t.C:
	case <-s.loopCtx.Done():
	}
}

// ErrModelMismatch is why a worker that serves another model than the
// engine's (Config.ModelIdentity) is not paired with.
var ErrModelMismatch = errors.New("worker and engine hold different model files")

// describeModel names a model for ErrModelMismatch.
func describeModel(name, identity string) string {
	if identity == "" {
		return "the built-in model"
	}
	if name != "" {
		return fmt.Sprintf("model file %q (%s)", name, identity)
	}
	return "model file " + identity
}

// probe asks the worker for its Info and sizes the allocator.
func (s *Scheduler) probe() {
	ctx, cancel := context.WithTimeout(s.loopCtx, s.cfg.InfoTimeout)
	info, err := s.deps.Worker.Info(ctx, &cbv1.InfoRequest{})
	cancel()
	if err == nil && (info.GetNumBlocks() <= 0 || info.GetBlockSize() <= 0) {
		err = fmt.Errorf("worker reported an empty KV pool (%d blocks of %d tokens)", info.GetNumBlocks(), info.GetBlockSize())
	}
	if err == nil && info.GetModelIdentity() != s.cfg.ModelIdentity {
		err = fmt.Errorf("%w: the worker serves %s, this engine %s", ErrModelMismatch,
			describeModel(info.GetModelFileName(), info.GetModelIdentity()), describeModel(s.cfg.ModelFileName, s.cfg.ModelIdentity))
	}
	var alloc *kvcache.Allocator
	if err == nil {
		alloc, err = kvcache.NewAllocator(int(info.GetNumBlocks()), int(info.GetBlockSize()))
	}
	s.mu.Lock()
	if err != nil {
		s.nextProbe = time.Now().Add(s.cfg.WorkerRetryInterval)
		first := !s.everReady && s.stepID == 0
		s.unlock()
		s.probeFailures++
		// Logged on the 1st, 2nd, 4th, 8th... failure in a row: probes are
		// frequent, the log need not be.
		if n := s.probeFailures; s.loopCtx.Err() == nil && n&(n-1) == 0 {
			s.log.Warn("worker unavailable", "error", err.Error(), "retry_in", s.cfg.WorkerRetryInterval.String(), "first_probe", first, "failed_probes", n)
		}
		return
	}
	s.blocks.pool, s.info, s.ready, s.everReady = alloc, info, true, true
	s.probeFailures = 0
	s.unlock()
	s.log.Info("worker ready", "worker_id", info.GetWorkerId(), "model", info.GetModel(),
		"kv_blocks", info.GetNumBlocks(), "block_size", info.GetBlockSize(), "max_positions", info.GetMaxPositions())
}

// processCancels finishes requests whose context ended.
func (s *Scheduler) processCancels(now time.Time) {
	for _, sq := range s.liveSeqs() {
		if sq.cancelled {
			s.finish(sq, "", ErrCanceled, now)
		}
	}
}

// expireStores releases the blocks of stores not reported in time.
func (s *Scheduler) expireStores(now time.Time) {
	for id, hold := range s.blocks.expire(now) {
		if hold.doc != nil {
			s.finish(hold.doc, "", ErrStoreTimeout, now)
		}
		s.defer_(func() {
			s.log.Warn("store not reported done in time; blocks released", "request_id", id, "timeout", s.cfg.StoreTimeout.String())
		})
	}
	for _, id := range s.blocks.expireHandoffs(now) {
		s.defer_(func() {
			s.log.Warn("hand-over keep not reported ended in time; blocks released", "request_id", id, "timeout", s.cfg.HandoffTimeout.String())
		})
	}
}

// finish ends sq with reason (success) or err.
func (s *Scheduler) finish(sq *seq, reason string, err error, now time.Time) {
	if sq.state == stDone {
		return
	}
	switch sq.state {
	case stWaiting:
		s.waiting = slices.DeleteFunc(s.waiting, func(x *seq) bool { return x == sq })
	case stRunning:
		s.running = slices.DeleteFunc(s.running, func(x *seq) bool { return x == sq })
	case stPulling:
		s.pulling = slices.DeleteFunc(s.pulling, func(x *seq) bool { return x == sq })
		sq.pullCancel()
		// The worker stops a pull still writing before the next step's
		// sequences run (and so before these blocks serve another request).
		s.pendingFinished = append(s.pendingFinished, sq.id)
	}
	if sq.state == stStoring {
		if hold, ok := s.blocks.holds[sq.id]; ok && hold.doc == sq {
			hold.doc = nil // the blocks stay held until the report
		}
	}
	s.blocks.release(sq)
	if sq.started {
		s.pendingFinished = append(s.pendingFinished, sq.id)
		sq.started = false
	}
	sq.state = stDone
	delete(s.byID, sq.id)
	if len(s.byID) == 0 {
		select {
		case s.drained <- struct{}{}:
		default:
		}
	}
	if sq.stopWatch != nil {
		sq.stopWatch()
	}
	s.abandonLookup(sq, err)
	if sq.reqSpan != nil && sq.lookupOut == "" {
		// Finished before the loop decided its lookup (never seen, or a lookup
		// never opened): the statistics are stamped all the same.
		out := LookupAbandoned
		if !s.looksUp(sq) {
			out = LookupSkipped
		}
		s.stampLookup(sq, out, nil)
	}
	s.defer_(func() {
		if sq.schedSpan != nil && !sq.admitted {
			sq.schedSpan.SetError(errorType(err), err)
			sq.schedSpan.End()
		}
		if sq.reqSpan != nil {
			if err != nil {
				sq.reqSpan.SetError(errorType(err), err)
			} else {
				sq.reqSpan.SetAttributes(attribute.String("finish_reason", reason))
			}
			sq.reqSpan.End()
		}
		sq.h.finish(reason, err, now)
	})
}

// ErrorType names a request error for span error.type attributes:
// canceled, worker_unavailable, shutdown, timeout, kv_transfer_failed,
// worker_error or internal ("" for nil).
func ErrorType(err error) string { return errorType(err) }

func errorType(err error) string {
	var we *WorkerError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrCanceled):
		return "canceled"
	case errors.Is(err, ErrWorkerUnavailable):
		return "worker_unavailable"
	case errors.Is(err, ErrShutdown):
		return "shutdown"
	case errors.Is(err, ErrStoreTimeout):
		return "timeout"
	case errors.Is(err, ErrHandoff):
		return "kv_transfer_failed"
	case errors.As(err, &we):
		return "worker_error"
	default:
		return "internal"
	}
}

// preempt returns a running sequence to the front of the waiting queue,
// releasing its blocks; it is recomputed (prompt plus generated tokens) when
// readmitted.
func (s *Scheduler) preempt(sq *seq) {
	s.running = slices.DeleteFunc(s.running, func(x *seq) bool { return x == sq })
	s.blocks.release(sq)
	if sq.started {
		s.pendingFinished = append(s.pendingFinished, sq.id)
		sq.started = false
	}
	computed := sq.computed
	sq.computed, sq.committed = 0, 0
	sq.resumed = true
	sq.plan = nil
	sq.reused, sq.blendCost = sq.reused[:0], 0
	sq.state = stWaiting
	s.waiting = slices.Insert(s.waiting, 0, sq)
	s.preemptions++
	nOut := len(sq.tokens) - sq.nPrompt
	s.defer_(func() {
		sq.h.update(func(r *Result) { r.Preemptions++ })
		sq.reqSpan.AddEvent("preempted", trace.WithAttributes(
			attribute.Int("computed_tokens", computed), attribute.Int("output_tokens", nOut)))
	})
}

// schedule builds the next batch: running sequences first, then waiting
// ones, within the token budget. The batch lives in a buffer reused by the
// next call.
func (s *Scheduler) schedule(now time.Time) []item {
	buf := s.batchBuf[:cap(s.batchBuf)]
	clear(buf) // the last batch's sequences are not kept alive
	batch := s.fillBatch(buf[:0], now)
	s.batchBuf = batch
	return batch
}

// fillBatch appends the next batch to batch.
func (s *Scheduler) fillBatch(batch []item, now time.Time) []item {
	budget, maxRunning := s.stepLimits()
	preempted := false
	for i := 0; i < len(s.running) && budget.open(); i++ {
		sq := s.running[i]
		n, cost := budget.chunk(sq, sq.computed, s.lone(len(batch) == 0 && len(s.running) == 1))
		if n <= 0 {
			continue
		}
		for s.blocks.grow(sq, sq.computed+n) != nil {
			victim := s.running[len(s.running)-1]
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
	for i := 0; i < len(s.waiting) && budget.open() && len(s.running) < maxRunning; {
		sq := s.waiting[i]
		if sq.lk != nil && !sq.lk.done {
			i++ // deferred until its lookup is ready
			continue
		}
		if sq.req.Prefilled != nil && !sq.resumed {
			if len(s.pulling) >= s.cfg.MaxTransfers || !s.startPull(sq, now) {
				break // first come, first served
			}
			s.waiting = slices.Delete(s.waiting, i, i+1)
			continue
		}
		n, cost, ok := s.admit(sq, budget, s.lone(len(batch) == 0 && len(s.running) == 0), now)
		if !ok {
			break // first come, first served: no skipping ahead for blocks
		}
		s.waiting = slices.Delete(s.waiting, i, i+1)
		sq.state = stRunning
		s.running = append(s.running, sq)
		batch = append(batch, s.stepItem(sq, n))
		budget.charge(n, cost)
	}
	return batch
}

// stepBudget is what is left of a step: compute, in tokens of a full
// forward (StepTokenBudget), and raw tokens, within what the worker
// accepts in one Execute. A token of a CacheBlend prefill that the plan
// reuses is charged only its share of the forward (blendCost): the
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
	limit := min(len(sq.tokens)-from, b.raw)
	if limit <= 0 || b.compute <= 0 {
		return 0, 0
	}
	if len(sq.reused) == 0 || sq.blendCost >= 1 || from >= sq.prefillEnd {
		n = min(limit, b.compute)
		return n, n
	}
	if n = min(limit, lone); n > 0 {
		if m, c := blendChunk(sq.reused, from, limit, b.compute, sq.blendCost); m > n {
			return m, c // the budget goes further
		}
		_, cost = blendChunk(sq.reused, from, n, n, sq.blendCost) // a reused token costs at most 1
		return n, cost
	}
	return blendChunk(sq.reused, from, limit, b.compute, sq.blendCost)
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
// forward of a layers-deep model: every layer up to the check layer, then
// the recompute ratio of the rest, (cl+1 + (L-cl-1)·r)/L; 1 when the model
// is too shallow (or unknown) for the difference. The worker does not
// report its check layer: the default (defaults.CheckLayer) is assumed, as
// a scheduling estimate.
func blendTokenCost(layers int, ratio float64) float64 {
	cl := defaults.CheckLayer
	if layers <= cl+1 || ratio <= 0 || ratio >= 1 {
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
	if n := int(s.info.GetMaxStepTokens()); n > 0 {
		b.compute, b.raw = min(b.compute, n), n
	}
	if n := int(s.info.GetMaxStepSeqs()); n > 0 {
		seqs = min(seqs, n)
	}
	return b, seqs
}

func (s *Scheduler) stepItem(sq *seq, n int) item {
	return item{sq: sq, n: n, doc: sq.req.Document,
		sample: !sq.req.Document && sq.computed+n == len(sq.tokens)}
}

// admit allocates blocks for a waiting sequence's first chunk, reusing the
// prefix cache and the CacheBlend plan, and reports the tokens to compute
// and their cost in the budget.
func (s *Scheduler) admit(sq *seq, budget stepBudget, lone int, now time.Time) (int, int, bool) {
	planStart := time.Now()
	acquired, local := s.blocks.acquirePrefix(sq)
	start, reused := local, 0
	var plan *cbv1.CBPlan
	sq.reused, sq.blendCost = sq.reused[:0], 0
	if sq.lk != nil && sq.lk.result != nil && !sq.resumed {
		if p, ok := planOf(sq.lk.result, local, len(sq.tokens), s.cfg.RecompRatio); ok {
			plan, start, reused = rpc.PlanToProto(p), p.Start, p.ReusedTokens()
			for _, m := range p.Matches {
				if r := m.Cur.Intersect(reuseplan.Range{Start: p.Start, End: len(sq.tokens)}); !r.Empty() {
					sq.reused = append(sq.reused, r)
				}
			}
			sq.blendCost = blendTokenCost(int(s.info.GetNumLayers()), p.RecompRatio)
		}
	}
	sq.prefillEnd = len(sq.tokens)
	n, cost := budget.chunk(sq, start, lone)
	sq.blocks = acquired
	if err := s.blocks.grow(sq, start+n); err != nil {
		s.blocks.free(acquired)
		sq.blocks = nil
		sq.reused, sq.blendCost = sq.reused[:0], 0
		return 0, 0, false
	}
	nFresh := len(sq.blocks) - len(acquired)
	sq.computed, sq.committed = start, len(acquired)
	sq.plan = plan
	s.blocks.admitted(local+reused, len(sq.tokens)) // the prefix leg is among the reused tokens
	if sq.admitted {
		return n, cost, true
	}
	sq.admitted = true
	s.defer_(func() {
		sq.h.update(func(r *Result) {
			r.Admitted = now
			r.CachedTokens = local
			r.ReusedTokens = reused
			r.PrefixReusedTokens = max(start-local, 0)
		})
	})
	if sq.schedSpan != nil {
		// cb.build_meta ends once buildExecute has built the request's step
		// metadata (metaDone); cb.schedule with it.
		sq.meta = &buildMeta{start: planStart, attrs: []attribute.KeyValue{
			attribute.String("request_id", sq.id),
			attribute.Int("local_prefix_hit_tokens", local),
			attribute.Int("start_pos", start),
			attribute.Int("n_matches", len(plan.GetMatches())),
			attribute.Int("reused_tokens", reused),
			attribute.Int("n_blocks", len(acquired)+nFresh),
		}}
	}
	return n, cost, true
}

// buildExecute turns the batch into the step request; nil when there is
// nothing to send (no batch, no finished ids, no store report due).
func (s *Scheduler) buildExecute(batch []item, now time.Time) *cbv1.ExecuteRequest {
	storePoll := s.blocks.polling() && !now.Before(s.nextStorePoll)
	if len(batch) == 0 && len(s.pendingFinished) == 0 && !storePoll {
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
	req := &s.execReq
	seqs := req.Seqs[:cap(req.Seqs)]
	clear(seqs)
	req.Reset()
	req.StepId, req.FinishedRequestIds, req.Seqs = s.stepID, s.pendingFinished, seqs[:0]
	s.pendingFinished, s.spareFinished = s.spareFinished[:0], s.pendingFinished
	for _, it := range batch {
		sq := it.sq
		st := sq.step
		if st == nil {
			st = new(cbv1.SeqStep)
			sq.step = st
		} else {
			st.Reset()
		}
		st.RequestId = sq.id
		st.TraceContext = sq.traceCtx
		st.TraceState = sq.traceSt
		st.BlockTable = sq.blocks
		st.Tokens = sq.tokens[sq.computed : sq.computed+it.n : sq.computed+it.n]
		st.StartPos = int32(sq.computed)
		st.IsPrefill = sq.computed < sq.prefillEnd
		st.Sample = it.sample
		st.Sampling = sq.req.Sampling
		st.Document = sq.req.Document
		if !sq.started {
			st.PromptTokens = sq.tokens[:sq.prefillEnd:sq.prefillEnd]
			sq.started = true
			if p := sq.req.Prefilled; p != nil && !sq.resumed {
				st.RngDraws = p.RNGDraws
			}
		}
		if it.sample && len(sq.req.HandoffSecret) > 0 {
			st.HandoffSecret = sq.req.HandoffSecret
		}
		if st.IsPrefill && sq.plan != nil {
			st.CbPlan = sq.plan
		}
		wantStore := sq.req.Document || (s.deps.Blend != nil && !s.cfg.DisableStore && !sq.req.NoReuse)
		if wantStore && !sq.storeSent && sq.computed+it.n == sq.prefillEnd {
			st.Store = true
			sq.storeSent = true
			s.blocks.hold(sq.id, now.Add(s.cfg.StoreTimeout))
			s.nextStorePoll = now.Add(s.cfg.StorePollInterval)
		}
		req.Seqs = append(req.Seqs, st)
		if sq.meta != nil {
			s.metaDone(sq, time.Now())
		}
	}
	return req
}

// buildMeta is cb.build_meta of a request admitted in this iteration: from
// the start of its plan to the end of its step metadata.
type buildMeta struct {
	start time.Time
	attrs []attribute.KeyValue
}

// metaDone records cb.build_meta, ending at end, and ends cb.schedule.
func (s *Scheduler) metaDone(sq *seq, end time.Time) {
	m := sq.meta
	sq.meta = nil
	s.defer_(func() {
		_, bm := s.spans.Start(sq.schedCtx, spanname.CBBuildMeta, trace.WithTimestamp(m.start), trace.WithAttributes(m.attrs...))
		bm.End(trace.WithTimestamp(end))
		sq.schedSpan.End(trace.WithTimestamp(end))
	})
}

// applyStep folds the worker's answer into the sequences.
func (s *Scheduler) applyStep(batch []item, resp *cbv1.ExecuteResponse, err error, now time.Time) {
	if err != nil && s.loopCtx.Err() != nil { // shutting down: not the worker's fault
		for _, sq := range s.liveSeqs() {
			s.finish(sq, "", ErrShutdown, now)
		}
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
		sq.computed += it.n
		s.blocks.commit(sq)
		if it.doc && sq.computed >= sq.prefillEnd {
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
		s.appendToken(sq, out.GetToken(), now)
	}
	s.batchTokens = tokens
	for _, id := range resp.GetStoredRequestIds() {
		s.storeDone(id, now)
	}
	for _, id := range resp.GetHandoffReleasedIds() {
		s.blocks.handoffDone(id)
	}
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
	sq.tokens = append(sq.tokens, tok)
	nOut := len(sq.tokens) - sq.nPrompt
	sq.h.update(func(r *Result) {
		r.Tokens = append(r.Tokens, tok)
		r.TokenTimes = append(r.TokenTimes, now)
	})
	if len(sq.req.HandoffSecret) > 0 {
		s.handedOff(sq, now)
		return
	}
	eos := !sq.req.IgnoreEOS && s.info != nil && (tok == s.info.GetEos() || slices.Contains(s.info.GetStopTokens(), tok))
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
	s.mu.Lock()
	if stop {
		s.finish(sq, FinishStop, nil, now)
	} else {
		s.finish(sq, FinishLength, nil, now)
	}
	s.unlock()
}

// docPrefilled parks a document whose prefill is done until its store is
// reported.
func (s *Scheduler) docPrefilled(sq *seq) {
	s.running = slices.DeleteFunc(s.running, func(x *seq) bool { return x == sq })
	sq.state = stStoring
	hold := s.blocks.hold(sq.id, time.Now().Add(s.cfg.StoreTimeout)) // held since the store was sent
	hold.blocks = append(hold.blocks, sq.blocks)
	hold.doc = sq
	sq.blocks = nil
	if sq.started {
		s.pendingFinished = append(s.pendingFinished, sq.id)
		sq.started = false
	}
}

// storeDone releases what a finished store held.
func (s *Scheduler) storeDone(id string, now time.Time) {
	if hold := s.blocks.storeDone(id); hold != nil && hold.doc != nil {
		s.finish(hold.doc, FinishStored, nil, now)
	}
}

// workerFailed fails every request: the worker's state is gone or unknown.
func (s *Scheduler) workerFailed(cause error, now time.Time) {
	err := fmt.Errorf("%w: step failed: %w", ErrWorkerUnavailable, cause)
	for _, sq := range s.liveSeqs() {
		s.finish(sq, "", err, now)
	}
	s.blocks.reset()
	s.pendingFinished = nil
	s.ready = false
	s.nextProbe = now
	s.defer_(func() { s.log.Error("worker step failed; requests in flight failed", "error", cause.Error()) })
}

// nextWake is the next time the loop has something due.
func (s *Scheduler) nextWake(now time.Time) time.Time {
	at := now.Add(idleWake)
	earlier := func(t time.Time) {
		if t.Before(at) {
			at = t
		}
	}
	for _, sq := range s.waiting {
		if lk := sq.lk; lk != nil && !lk.done {
			earlier(lk.deadline)
		}
	}
	if at, ok := s.blocks.nextDeadline(); ok {
		earlier(at)
	}
	if s.blocks.polling() {
		earlier(s.nextStorePoll)
	}
	return at
}
