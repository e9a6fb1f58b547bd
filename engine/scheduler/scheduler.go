package scheduler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

// WorldSize is the number of worker ranks a request runs on when the
// worker does not report one (InfoResponse.world_size, cb worker --tp).
const WorldSize = 1

// idleWake bounds how long the loop sleeps when nothing is due.
const idleWake = time.Minute

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
	cfg  Config
	deps Deps // Spans and Logger set

	mu            sync.Mutex
	q             queues      // the requests in flight
	worker        workerState // the worker as last probed
	blocks        *blockManager
	buf           stepBuffers
	lookups       *calls[*cbv1.LookupResult] // Lookup calls in flight
	pulls         *calls[int64]              // KV pulls of Prefilled requests in flight
	closing       bool                       // Shutdown called: Submit refuses
	stepID        uint64
	preemptions   uint64
	batchTokens   int
	nextStorePoll time.Time
	after         []func() // run after mu is released

	loop loopState
}

// queues are the unfinished requests by state.
type queues struct {
	waiting []*seq // in arrival order (preempted ones at the front)
	running []*seq
	pulling []*seq          // Prefilled requests whose pull is in flight
	byID    map[string]*seq // every unfinished request, storing documents included
}

// workerState is what the loop knows of its worker.
type workerState struct {
	info      *cbv1.InfoResponse // nil until it answered
	ready     bool               // it answered Info and its last step succeeded
	failures  uint64             // Info probes failed in a row
	nextProbe time.Time
}

// stepBuffers are the step request and the batch, reused step after step
// (the loop sends one Execute at a time and the request is marshalled
// before the call returns), and the ids the next step reports finished
// (spare is their other buffer).
type stepBuffers struct {
	req             cbv1.ExecuteRequest
	batch           []item
	finished, spare []string
}

// loopState is the step loop's life.
type loopState struct {
	ctx              context.Context // ends when the loop and its calls must stop
	cancel           context.CancelFunc
	wake             chan struct{}
	drained          chan struct{} // poked when the last request in flight finished
	done             chan struct{} // closed when the loop returned
	started, stopped bool
}

// New returns a scheduler; it does nothing until Start.
func New(cfg Config, deps Deps) (*Scheduler, error) {
	if deps.Worker == nil {
		return nil, errors.New("scheduler: a worker client is required")
	}
	cfg = cfg.withDefaults()
	s := &Scheduler{
		cfg:    cfg,
		deps:   deps,
		q:      queues{byID: make(map[string]*seq)},
		blocks: newBlockManager(),
		loop:   loopState{wake: make(chan struct{}, 1), drained: make(chan struct{}, 1), done: make(chan struct{})},
	}
	s.loop.ctx, s.loop.cancel = context.WithCancel(context.Background())
	s.lookups = newCalls[*cbv1.LookupResult](cfg.MaxLookupRPCs, s.loop.ctx, s.poke)
	s.pulls = newCalls[int64](cfg.MaxTransfers, s.loop.ctx, s.poke)
	if s.deps.Spans == nil {
		s.deps.Spans = telemetry.NewSpans(nil, "github.com/cacheblend/cacheblend/engine/scheduler", nil)
	}
	if s.deps.Logger == nil {
		s.deps.Logger = slog.New(slog.DiscardHandler)
	}
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
	if s.loop.started {
		return errors.New("scheduler: already started")
	}
	if s.loop.stopped {
		return ErrShutdown
	}
	s.loop.started = true
	go s.run()
	return nil
}

// Shutdown stops accepting requests, waits for those in flight to finish
// (documents included) until ctx ends, then fails the rest with ErrShutdown
// and stops the loop and its RPC goroutines. It returns ctx's error when it
// had to fail requests. Later calls return nil at once.
func (s *Scheduler) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.loop.stopped {
		s.mu.Unlock()
		return nil
	}
	s.loop.stopped, s.closing = true, true
	started := s.loop.started
	s.mu.Unlock()
	s.poke()

	var err error
	for started && s.active() > 0 && err == nil {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-s.loop.drained: // the last one finished (or an earlier poke: checked again)
		}
	}
	if err != nil {
		s.Abort(ErrShutdown)
	}
	s.loop.cancel()
	if started {
		<-s.loop.done
	}
	s.lookups.wait()
	s.pulls.wait()
	return err
}

// active counts the requests not yet finished.
func (s *Scheduler) active() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.q.byID)
}

// Abort fails every request in flight with err (ErrShutdown when nil); the
// loop keeps running.
func (s *Scheduler) Abort(err error) {
	if err == nil {
		err = ErrShutdown
	}
	s.mu.Lock()
	s.finishAll(err, time.Now())
	s.unlock()
}

// finishAll fails every unfinished request with err.
func (s *Scheduler) finishAll(err error, now time.Time) {
	for _, sq := range s.liveSeqs() {
		s.finish(sq, "", err, now)
	}
}

// liveSeqs lists every unfinished request in a deterministic order.
func (s *Scheduler) liveSeqs() []*seq {
	out := slices.Concat(s.q.running, s.q.waiting, s.q.pulling)
	for _, sq := range s.q.byID {
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
	return s.worker.info, s.worker.ready
}

// Stats returns a snapshot of the queues, the KV pool and the counters.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Waiting:      len(s.q.waiting),
		Running:      len(s.q.running),
		Preemptions:  s.preemptions,
		BatchTokens:  s.batchTokens,
		Steps:        s.stepID,
		WorkerReady:  s.worker.ready,
		Transferring: len(s.q.pulling),
	}
	s.blocks.stats(&st)
	return st
}

// worldSize is the worker's reported world size (WorldSize before it
// answered). s.mu must be held.
func (s *Scheduler) worldSize() int {
	return max(WorldSize, int(s.worker.info.GetWorldSize()))
}

// Submit queues a request and returns its handle. It fails fast with
// ErrShutdown, ErrWorkerUnavailable, ErrQueueFull, ErrTooLong or
// ErrBadRequest (all wrapped with detail).
func (s *Scheduler) Submit(r *Request) (*Handle, error) {
	if err := validate(r); err != nil {
		return nil, err
	}
	ctx := cmp.Or(r.Ctx, context.Background())
	s.mu.Lock()
	defer s.unlock()
	if err := s.acceptable(r); err != nil {
		return nil, err
	}
	sq := s.newSeq(r, ctx, time.Now())
	s.q.waiting = append(s.q.waiting, sq)
	s.q.byID[r.ID] = sq
	sq.stopWatch = context.AfterFunc(ctx, func() { s.cancel(sq) })
	s.poke()
	return sq.h, nil
}

// validate checks what a request says about itself.
func validate(r *Request) error {
	if r == nil || r.ID == "" || len(r.Prompt) == 0 {
		return fmt.Errorf("%w: a request needs an id and a non-empty prompt", ErrBadRequest)
	}
	if !r.Document && r.MaxTokens < 1 {
		return fmt.Errorf("%w: max tokens %d < 1", ErrBadRequest, r.MaxTokens)
	}
	if n := len(r.HandoffSecret); n != 0 && (n != SecretBytes || r.Document || r.Prefilled != nil) {
		return fmt.Errorf("%w: a hand-over secret of %d bytes (want %d, on a generation that is not Prefilled)", ErrBadRequest, n, SecretBytes)
	}
	if p := r.Prefilled; p != nil && (p.Pull == nil || r.Document || p.FirstToken < 0) {
		return fmt.Errorf("%w: a Prefilled request needs a Pull and a first token, and is no document", ErrBadRequest)
	}
	return nil
}

// maxLen is the most tokens r can hold: its prompt and every token it may
// generate.
func maxLen(r *Request) int {
	if r.Document {
		return len(r.Prompt)
	}
	return len(r.Prompt) + r.MaxTokens
}

// acceptable checks r against the scheduler's state, the worker's model
// and the queue. s.mu is held.
func (s *Scheduler) acceptable(r *Request) error {
	switch {
	case s.closing:
		return ErrShutdown
	case !s.worker.ready:
		return fmt.Errorf("%w: it has not answered yet", ErrWorkerUnavailable)
	}
	if _, dup := s.q.byID[r.ID]; dup {
		return fmt.Errorf("%w: request id %q already in flight", ErrBadRequest, r.ID)
	}
	if s.blocks.holding(r.ID) {
		return fmt.Errorf("%w: request id %q still storing", ErrBadRequest, r.ID)
	}
	total := maxLen(r)
	if mp := int(s.worker.info.GetMaxPositions()); mp > 0 && total > mp {
		return fmt.Errorf("%w: %d tokens exceed the model's %d positions", ErrTooLong, total, mp)
	}
	if err := s.blocks.fits(total); err != nil {
		return err
	}
	if v := s.worker.info.GetVocab(); v > 0 {
		for i, t := range r.Prompt {
			if t < 0 || t >= v {
				return fmt.Errorf("%w: token %d at position %d is outside the vocabulary [0, %d)", ErrBadRequest, t, i, v)
			}
		}
		if p := r.Prefilled; p != nil && p.FirstToken >= v {
			return fmt.Errorf("%w: first token %d is outside the vocabulary [0, %d)", ErrBadRequest, p.FirstToken, v)
		}
	}
	if len(s.q.waiting) >= s.cfg.MaxQueue {
		return fmt.Errorf("%w: %d waiting", ErrQueueFull, len(s.q.waiting))
	}
	return nil
}

// newSeq is the state of a submitted request. A generation opens
// cb.request ⊃ cb.schedule and its lookup; a document or a Prefilled
// request opens no span (its steps carry the context of ctx).
func (s *Scheduler) newSeq(r *Request, ctx context.Context, now time.Time) *seq {
	total := maxLen(r)
	sq := &seq{
		req: r,
		id:  r.ID,
		h:   newHandle(len(r.Prompt), r.MaxTokens),
		kv: seqKV{tokens: append(make([]int32, 0, total), r.Prompt...), // decode appends in place
			nPrompt: len(r.Prompt), maxLen: total, prefillEnd: len(r.Prompt), noCache: r.NoReuse},
		trace: seqTrace{reqCtx: ctx},
	}
	tr := &sq.trace
	if r.Document || r.Prefilled != nil {
		tr.parent, tr.state = telemetry.InjectStrings(ctx)
		return sq
	}
	tr.reqCtx, tr.reqSpan = s.deps.Spans.Start(ctx, spanname.CBRequest, trace.WithAttributes(
		attribute.String("request_id", r.ID),
		attribute.String("model", s.cfg.Model),
		attribute.Int("world_size", s.worldSize()),
		attribute.Int("n_prompt_tokens", len(r.Prompt)),
	))
	tr.parent, tr.state = telemetry.InjectStrings(tr.reqCtx)
	tr.schedCtx, tr.schedSpan = s.deps.Spans.Start(tr.reqCtx, spanname.CBSchedule,
		trace.WithAttributes(attribute.String("request_id", r.ID)))
	s.openLookup(sq, now)
	return sq
}

func (s *Scheduler) cancel(sq *seq) {
	s.mu.Lock()
	if sq.state != stDone {
		sq.cancelled = true
	}
	s.mu.Unlock()
	s.poke()
}

func (s *Scheduler) poke() { notify(s.loop.wake) }

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
		s.deps.Logger.Error("kv block accounting error", "error", err.Error())
	}
}

func (s *Scheduler) defer_(f func()) { s.after = append(s.after, f) }

// run is the step loop.
func (s *Scheduler) run() {
	defer close(s.loop.done)
	for s.loop.ctx.Err() == nil {
		s.mu.Lock()
		now := time.Now()
		if !s.worker.ready {
			due := !now.Before(s.worker.nextProbe)
			wakeAt := s.worker.nextProbe
			s.unlock()
			if due {
				s.probe()
			} else {
				s.sleep(wakeAt)
			}
			continue
		}
		s.processCancels(now)
		s.expireHolds(now)
		s.driveLookups(now)
		s.pulls.drain(s.pullDone)
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
		ctx, cancel := context.WithTimeout(s.loop.ctx, s.cfg.StepTimeout)
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
	case <-s.loop.wake:
	case <-t.C:
	case <-s.loop.ctx.Done():
	}
}

// nextWake is the next time the loop has something due.
func (s *Scheduler) nextWake(now time.Time) time.Time {
	at := now.Add(idleWake)
	earlier := func(t time.Time) {
		if t.Before(at) {
			at = t
		}
	}
	for _, sq := range s.q.waiting {
		if sq.lk.pending() {
			earlier(sq.lk.deadline)
		}
	}
	if t, ok := s.blocks.nextDeadline(); ok {
		earlier(t)
	}
	if s.blocks.polling() {
		earlier(s.nextStorePoll)
	}
	return at
}

// processCancels finishes requests whose context ended.
func (s *Scheduler) processCancels(now time.Time) {
	for _, sq := range s.liveSeqs() {
		if sq.cancelled {
			s.finish(sq, "", ErrCanceled, now)
		}
	}
}

// expireHolds releases the blocks of stores and hand-overs not reported in
// time (a document waiting for its store fails).
func (s *Scheduler) expireHolds(now time.Time) {
	stores, handoffs := s.blocks.expire(now)
	for id, hold := range stores {
		if hold.doc != nil {
			s.finish(hold.doc, "", ErrStoreTimeout, now)
		}
		s.defer_(func() {
			s.deps.Logger.Warn("store not reported done in time; blocks released", "request_id", id, "timeout", s.cfg.StoreTimeout.String())
		})
	}
	for id := range handoffs {
		s.defer_(func() {
			s.deps.Logger.Warn("hand-over keep not reported ended in time; blocks released", "request_id", id, "timeout", s.cfg.HandoffTimeout.String())
		})
	}
}

// forget tells the worker, in the next step, to drop sq's state, if it
// holds any.
func (s *Scheduler) forget(sq *seq) {
	if sq.started {
		s.buf.finished = append(s.buf.finished, sq.id)
		sq.started = false
	}
}

// finish ends sq with reason (success) or err.
func (s *Scheduler) finish(sq *seq, reason string, err error, now time.Time) {
	switch sq.state {
	case stDone:
		return
	case stWaiting:
		s.q.waiting = without(s.q.waiting, sq)
	case stRunning:
		s.q.running = without(s.q.running, sq)
	case stPulling:
		s.q.pulling = without(s.q.pulling, sq)
		sq.pullCancel()
		// The worker stops a pull still writing before the next step's
		// sequences run (and so before these blocks serve another request).
		s.buf.finished = append(s.buf.finished, sq.id)
	} // a storing document's blocks stay held until the store's report
	s.blocks.release(sq.id, &sq.kv)
	s.forget(sq)
	sq.state = stDone
	delete(s.q.byID, sq.id)
	if len(s.q.byID) == 0 {
		notify(s.loop.drained)
	}
	if sq.stopWatch != nil {
		sq.stopWatch()
	}
	s.endLookup(sq, LookupAbandoned, nil, err, time.Now())
	tr := sq.trace
	s.defer_(func() {
		if tr.schedSpan != nil && !sq.admitted {
			tr.schedSpan.SetError(ErrorType(err), err)
			tr.schedSpan.End()
		}
		if tr.reqSpan != nil {
			if err != nil {
				tr.reqSpan.SetError(ErrorType(err), err)
			} else {
				tr.reqSpan.SetAttributes(attribute.String("finish_reason", reason))
			}
			tr.reqSpan.End()
		}
		sq.h.finish(reason, err, now)
	})
}

// ErrorType names a request error for span error.type attributes:
// canceled, worker_unavailable, shutdown, timeout, kv_transfer_failed,
// worker_error or internal ("" for nil).
func ErrorType(err error) string {
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
	ctx, cancel := context.WithTimeout(s.loop.ctx, s.cfg.InfoTimeout)
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
	w := &s.worker
	if err != nil {
		w.nextProbe = time.Now().Add(s.cfg.WorkerRetryInterval)
		first := w.info == nil // it never answered
		w.failures++
		n := w.failures
		s.unlock()
		// Logged on the 1st, 2nd, 4th, 8th... failure in a row: probes are
		// frequent, the log need not be.
		if s.loop.ctx.Err() == nil && n&(n-1) == 0 {
			s.deps.Logger.Warn("worker unavailable", "error", err.Error(), "retry_in", s.cfg.WorkerRetryInterval.String(), "first_probe", first, "failed_probes", n)
		}
		return
	}
	s.blocks.reset(alloc)
	w.info, w.ready, w.failures = info, true, 0
	s.unlock()
	s.deps.Logger.Info("worker ready", "worker_id", info.GetWorkerId(), "model", info.GetModel(),
		"kv_blocks", info.GetNumBlocks(), "block_size", info.GetBlockSize(), "max_positions", info.GetMaxPositions(),
		"blend_gate", info.GetBlendGate(), "blend_gate_kl", info.GetBlendGateKl())
	if off := info.GetBlendOff(); off != "" {
		s.deps.Logger.Warn("CacheBlend blending is off for the worker's model: requests reuse exact prefixes only", "reason", off)
	}
}

// workerFailed fails every request: the worker's state is gone or unknown.
func (s *Scheduler) workerFailed(cause error, now time.Time) {
	s.finishAll(fmt.Errorf("%w: step failed: %w", ErrWorkerUnavailable, cause), now)
	s.blocks.reset(nil)
	s.buf.finished = nil
	s.worker.ready = false
	s.worker.nextProbe = now
	s.defer_(func() { s.deps.Logger.Error("worker step failed; requests in flight failed", "error", cause.Error()) })
}
