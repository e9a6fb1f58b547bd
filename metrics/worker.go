package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/prometheus/client_golang/prometheus"
)

// WorkerMetrics records the instruments the contract assigns to cb-worker: forward-pass
// durations by phase (with trace exemplars), the recompute ratio, steps, failed blend-server
// calls and KV transfer. Every series is resolved by NewWorkerMetrics; the record methods
// return nothing, and a record they cannot take is refused whole (nothing recorded, counted in
// Registry().RecordStats(), reported to Config.OnRefused) as described on Registry. Safe for
// concurrent use.
type WorkerMetrics struct {
	facade
	forward   enumSeries // one series per ForwardPhase
	recompute *HistogramSeries
	steps     *series
	failures  enumSeries // one series per BlendOp
	kv        kvTransfer
	handoffs  enumSeries // one series per HandoffState
	gate      gateGauges
	quality   qualityInstruments
}

// qualityInstruments are the online quality check's.
type qualityInstruments struct {
	kl     *HistogramSeries
	top1   enumSeries // agree: true, false
	checks enumSeries // one series per QualityCheck
}

// gateGauges are the blend gate's outcome.
type gateGauges struct{ enabled, kl *series }

// NewWorkerMetrics registers the worker's contract instruments on reg and resolves all their
// series (one per ForwardPhase, BlendOp and KVDirection); a contract that lacks one of them is
// an error here. Options: WithContract (default: the embedded contract), WithLabelCap,
// WithOnRefused (default: refusals are only counted).
func NewWorkerMetrics(reg prometheus.Registerer, opts ...Option) (*WorkerMetrics, error) {
	return newFacade("worker", reg, opts, func(b *builder) *WorkerMetrics {
		return &WorkerMetrics{
			facade:    facade{b.r},
			forward:   b.enum(contract.Histogram, "cb_worker_forward_duration_seconds", forwardPhaseNames[:]),
			recompute: b.histogramSeries("cb_worker_recompute_ratio"),
			steps:     b.counterSeries("cb_worker_steps_total"),
			failures:  b.enum(contract.Counter, "cb_worker_blend_failures_total", blendOpNames[:]),
			kv:        newKVTransfer(b),
			handoffs:  b.enum(contract.Gauge, "cb_worker_kv_handoffs", handoffStateNames[:]),
			gate:      gateGauges{b.gaugeSeries("cb_worker_blend_enabled"), b.gaugeSeries("cb_worker_blend_gate_kl")},
			quality: qualityInstruments{
				kl:     b.histogramSeries("lmcache_blend_quality_kl"),
				top1:   b.enum(contract.Counter, "lmcache_blend_quality_top1_total", []string{"true", "false"}),
				checks: b.enum(contract.Counter, "cb_worker_quality_checks_total", qualityCheckNames[:]),
			},
		}
	})
}

// ObserveForward records the duration of one forward phase. A sampled span context in ctx
// (which may be nil) becomes an exemplar. A negative duration, or a phase that is not a
// ForwardPhase constant, refuses the record (see Registry). No allocation without a sampled
// span.
func (m *WorkerMetrics) ObserveForward(ctx context.Context, phase ForwardPhase, d time.Duration) {
	v := d.Seconds()
	if !m.forward.in.accepts(v, false) {
		return
	}
	if s := pick(m.forward, phase); s != nil {
		s.observe(ctx, m.forward.in.exemplars, v)
	}
}

// ObserveRecomputeRatio records impCount / reusedTokens for one blended prefill: the tokens
// recomputed after the check layer over the tokens whose KV was reused. A negative impCount
// (ErrNegative) or a reusedTokens that is not positive (ErrInvalidRecord) refuses the record
// (see Registry).
func (m *WorkerMetrics) ObserveRecomputeRatio(impCount, reusedTokens int) {
	switch {
	case impCount < 0:
		m.reg.sink.refuse(fmt.Errorf("metrics: recompute ratio: imp_count %d: %w", impCount, ErrNegative))
	case reusedTokens <= 0:
		m.reg.sink.refuse(fmt.Errorf("metrics: recompute ratio: %d reused tokens: %w", reusedTokens, ErrInvalidRecord))
	default:
		m.recompute.Observe(float64(impCount) / float64(reusedTokens))
	}
}

// SetBlendGate records the blend gate's outcome: whether blending is on
// for the worker's model and the mean KL the gate measured (0 when it did
// not check). A negative or NaN kl refuses the record (see Registry).
func (m *WorkerMetrics) SetBlendGate(enabled bool, kl float64) {
	if !(kl >= 0) {
		m.reg.sink.refuse(fmt.Errorf("metrics: blend gate KL %v: %w", kl, ErrNegative))
		return
	}
	v := 0.0
	if enabled {
		v = 1
	}
	m.gate.enabled.gauge.Set(v)
	m.gate.kl.gauge.Set(kl)
}

// QualityCheck counts one online quality check by result.
func (m *WorkerMetrics) QualityCheck(r QualityCheck) {
	if sr := pick(m.quality.checks, r); sr != nil {
		sr.counter.Inc()
	}
}

// ObserveQuality records a done quality check: its mean KL (nats) and, of
// its positions compared, how many agree on the most likely token. A
// negative or NaN KL, or agree outside [0, positions], refuses the record
// (see Registry).
func (m *WorkerMetrics) ObserveQuality(kl float64, agree, positions int) {
	if !(kl >= 0) || agree < 0 || agree > positions {
		m.reg.sink.refuse(fmt.Errorf("metrics: quality KL %v, %d of %d positions agree: %w", kl, agree, positions, ErrInvalidRecord))
		return
	}
	m.quality.kl.Observe(kl)
	m.quality.top1.ss[0].counter.Add(float64(agree))
	m.quality.top1.ss[1].counter.Add(float64(positions - agree))
}

// Step counts one executed step batch.
func (m *WorkerMetrics) Step() { m.steps.counter.Inc() }

// BlendFailure counts a failed call to the blend server. An op that is not a BlendOp constant
// is refused (see Registry).
func (m *WorkerMetrics) BlendFailure(op BlendOp) {
	if s := pick(m.failures, op); s != nil {
		s.counter.Inc()
	}
}

// AddKVTransfer counts KV moved between the worker's KV memory and the blend server in
// direction d. Negative bytes or tokens, or a d that is not a KVDirection constant, refuse the
// record (see Registry).
func (m *WorkerMetrics) AddKVTransfer(d KVDirection, bytes, tokens int64) { m.kv.add(d, bytes, tokens) }
