package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// WorkerMetrics records the instruments the contract assigns to cb-worker: forward-pass
// durations by phase (with trace exemplars), the recompute ratio, steps, failed blend-server
// calls and KV transfer. Safe for concurrent use.
type WorkerMetrics struct {
	reg       *Registry
	forward   *Histogram
	recompute *series
	steps     *series
	failures  *Counter
	kv        kvTransfer
}

// NewWorkerMetrics registers the worker's contract instruments on reg. Options: WithContract,
// WithLabelCap.
func NewWorkerMetrics(reg prometheus.Registerer, opts ...Option) (*WorkerMetrics, error) {
	r, err := newFacadeRegistry("worker", reg, opts)
	if err != nil {
		return nil, err
	}
	b := &builder{r: r}
	m := &WorkerMetrics{
		reg:      r,
		forward:  b.histogram("cb_worker_forward_duration_seconds"),
		steps:    b.counterSeries("cb_worker_steps_total"),
		failures: b.counter("cb_worker_blend_failures_total"),
		kv:       newKVTransfer(b),
	}
	if h := b.histogram("cb_worker_recompute_ratio"); h != nil {
		m.recompute = b.series(h.in, nil)
	}
	if b.err != nil {
		return nil, fmt.Errorf("metrics: worker: %w", b.err)
	}
	return m, nil
}

// Registry returns the registry the facade registers through.
func (m *WorkerMetrics) Registry() *Registry { return m.reg }

// ObserveForward records the duration of one forward phase: "prefill", "full_recomp",
// "check", "partial" or "decode". A sampled span context in ctx becomes an exemplar.
func (m *WorkerMetrics) ObserveForward(ctx context.Context, phase string, d time.Duration) error {
	return m.forward.ObserveContext(ctx, d.Seconds(), phase)
}

// ObserveRecomputeRatio records impCount / reusedTokens for one blended prefill: the tokens
// recomputed after the check layer over the tokens whose KV was reused. reusedTokens must be
// positive and impCount non-negative (else ErrInvalidRecord / ErrNegative).
func (m *WorkerMetrics) ObserveRecomputeRatio(impCount, reusedTokens int) error {
	if impCount < 0 {
		return fmt.Errorf("metrics: recompute ratio: imp_count %d: %w", impCount, ErrNegative)
	}
	if reusedTokens <= 0 {
		return fmt.Errorf("metrics: recompute ratio: %d reused tokens: %w", reusedTokens, ErrInvalidRecord)
	}
	m.recompute.obs.Observe(float64(impCount) / float64(reusedTokens))
	return nil
}

// Step counts one executed step batch.
func (m *WorkerMetrics) Step() { m.steps.counter.Inc() }

// BlendFailure counts a failed call to the blend server; op is "register", "retrieve" or
// "store".
func (m *WorkerMetrics) BlendFailure(op string) error { return m.failures.Inc(op) }

// AddKVTransfer counts KV moved between the worker's KV memory and the blend server;
// direction is "load" or "store".
func (m *WorkerMetrics) AddKVTransfer(direction string, bytes, tokens int64) error {
	return m.kv.add(direction, bytes, tokens)
}
