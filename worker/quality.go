package worker

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/quality"
	"github.com/cacheblend/cacheblend/telemetry"
)

// Defaults of the online quality check's Config fields.
const (
	// DefaultQualityBudget is the share of one core's time the checker may
	// spend checking (its thread's CPU time on Linux, else wall time).
	DefaultQualityBudget = 0.25
	// DefaultQualityPositions is K, the output positions compared.
	DefaultQualityPositions = 4
)

// reserveTokens and reserveBytes bound what the checker's memory is made
// ready for at start: prompts of reserveTokens tokens, or fewer when the
// memory (the served copy and the full prefill's, every layer's K and V)
// would exceed reserveBytes — 64 MiB, the default model's 4,096 tokens; a
// 1B model with 64 KiB of K and V per token gets 512 tokens. A longer prompt
// grows the memory at its snapshot.
const (
	reserveTokens = 4096
	reserveBytes  = 64 << 20
)

// reserveFor returns the prompt tokens the checker's memory of m is made
// ready for at start (reserveTokens, reserveBytes).
func reserveFor(m *model.Model, dt kvcache.DType) int {
	perToken := 2 * int(m.KVLayout(1, 1, dt).TokenBytes()) // two copies
	return max(1, min(m.Config().MaxPositions, reserveTokens, reserveBytes/max(perToken, 1)))
}

// qualitySampler is the online quality check (Config.QualitySampleRate):
// for a sampled share of blended prefills, the prompt's KV as served is
// copied at the end of the step (Checker.Snapshot), and the worker's
// checker goroutine later runs the full prefill and compares (cb.quality,
// lmcache_blend_quality_*). One check at a time; a sample taken while the
// checker is busy, or before its budget allows, is dropped and counted.
type qualitySampler struct {
	rate, budget float64
	k            int
	reserve      int           // prompt tokens the checker's memory is made ready for at start
	ready        chan struct{} // closed once it is (samples before are dropped)
	rng          *rand.Rand    // guarded by Worker.execMu (steps are serialized)
	checker      *quality.Checker
	busy         atomic.Bool  // a snapshot waits for or is in Compare
	resume       atomic.Int64 // unix ns before which no sample is taken
	jobs         chan qualityJob
}

// qualityJob is a snapshot waiting for its comparison.
type qualityJob struct {
	id       string
	link     trace.SpanContext // the request's cb.model_forward
	ratio    float64
	selected int
}

// newQualitySampler returns the sampler of cfg for m, or nil when the
// check is off (rate 0) or m is a tensor-parallel shard (a full prefill
// needs every rank).
func newQualitySampler(cfg Config, m *model.Model, dt kvcache.DType) *qualitySampler {
	if cfg.Quality.SampleRate <= 0 || m.WorldSize() > 1 {
		return nil
	}
	return &qualitySampler{
		rate: min(cfg.Quality.SampleRate, 1), budget: cfg.Quality.Budget, k: cfg.Quality.Positions,
		reserve: reserveFor(m, dt),
		rng:     rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x51)),
		checker: quality.NewChecker(m.WithThreads(1), dt), // on the checker's own thread
		jobs:    make(chan qualityJob, 1),
		ready:   make(chan struct{}),
	}
}

// sampleQuality takes a snapshot of a blended prefill's served KV for the
// checker when the request is sampled (or asked for a check: force) and
// the checker is free, and reports whether it took one. Called from the
// step, with Worker.execMu held.
func (w *Worker) sampleQuality(id string, prompt []int32, bt []int32, logits []float32, s model.BlendStats, fwd *telemetry.Span, force bool) bool {
	q := w.quality
	if q == nil || (!force && q.rng.Float64() >= q.rate) {
		return false
	}
	if time.Now().UnixNano() < q.resume.Load() || !q.busy.CompareAndSwap(false, true) {
		w.metrics.QualityCheck(metrics.QualityDropped)
		return false
	}
	if err := q.checker.Snapshot(w.kv, bt, prompt, logits, q.k); err != nil {
		q.busy.Store(false)
		w.metrics.QualityCheck(metrics.QualityFailed)
		w.logger.Warn("quality check: snapshot failed", "request_id", id, "err", err)
		return false
	}
	q.jobs <- qualityJob{id: id, link: fwd.SpanContext(), ratio: s.RecompRatio, selected: s.Selected} // never blocks: busy
	return true
}

// checkQuality is the checker goroutine: it compares each snapshot with a
// full prefill until the worker stops, on an OS thread of its own at the
// lowest priority, with a Go processor added for it (checkerProcs): the
// comparisons take the CPU the request path leaves idle.
func (w *Worker) checkQuality(q *qualitySampler) {
	defer w.life.bg.Done()
	// Never unlocked: the thread, niced, ends with the goroutine.
	runtime.LockOSThread()
	addCheckerProc()
	defer removeCheckerProc()
	if err := lowerThreadPriority(); err != nil {
		w.logger.Warn("quality checker runs at normal priority", "err", err)
	}
	// The snapshot's memory is made ready here, not in the first sampled
	// request's step. busy keeps samples out meanwhile.
	if q.busy.CompareAndSwap(false, true) {
		if err := q.checker.Reserve(q.reserve, q.k); err != nil {
			w.logger.Warn("quality checker: memory not reserved", "tokens", q.reserve, "err", err)
		}
		q.busy.Store(false)
	}
	close(q.ready)
	for {
		select {
		case <-w.life.stop:
			return
		case j := <-q.jobs:
			t0 := time.Now()
			c0, cpuOK := threadCPU()
			w.compareQuality(q, j, c0, cpuOK)
			d := time.Since(t0)
			if c1, ok := threadCPU(); ok && cpuOK {
				d = c1 - c0 // the CPU it took: its waits for idle CPU cost nothing
			}
			// At most budget of one core: no sample before t0 + d/budget.
			q.resume.Store(t0.Add(time.Duration(float64(d) / q.budget)).UnixNano())
			q.busy.Store(false)
		}
	}
}

// compareQuality runs one comparison and records it: cb.quality, the root
// of its own trace linked to the request's forward, and the metrics.
// c0 is the thread's CPU time before it (cpuOK: readable).
func (w *Worker) compareQuality(q *qualitySampler, j qualityJob, c0 time.Duration, cpuOK bool) {
	ctx := trace.ContextWithSpanContext(context.Background(), trace.SpanContext{})
	_, sp := w.spans.Start(ctx, spanname.CBQuality, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: j.link}),
		trace.WithAttributes(attrRequestID.String(j.id)))
	defer sp.End()
	r, err := q.checker.Compare()
	if err != nil {
		sp.SetError("quality_failed", err)
		w.metrics.QualityCheck(metrics.QualityFailed)
		w.logger.Warn("quality check failed", "request_id", j.id, "err", err)
		return
	}
	sp.SetAttributes(attribute.Float64("first_kl", r.FirstKL), attribute.Float64("mean_kl", r.MeanKL),
		attribute.Float64("top1", r.Top1), attribute.Int("greedy_match", r.GreedyMatch), attribute.Int("positions", r.Positions),
		attribute.Float64("recomp_ratio", j.ratio), attribute.Int("selected", j.selected),
		attribute.Float64("full_ms", float64(r.FullTime)/float64(time.Millisecond)))
	if c1, ok := threadCPU(); ok && cpuOK {
		sp.SetAttributes(attribute.Float64("cpu_ms", float64(c1-c0)/float64(time.Millisecond)))
	}
	w.metrics.QualityCheck(metrics.QualityDone)
	w.metrics.ObserveQuality(r.MeanKL, int(r.Top1*float64(r.Positions)+0.5), r.Positions)
}
