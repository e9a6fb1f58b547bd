package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo labels cb_build_info.
type BuildInfo struct {
	// Service is "cb-engine", "cb-worker", "cb-blend", "cb-traces" or "cb-gateway".
	Service string
	// Version is the build version (a capped label; "" allowed).
	Version string
}

// TraceTotals are the trace exporter's running totals since the process started.
type TraceTotals struct {
	// SpansDropped counts spans the exporter's bounded queue dropped; ExportErrors counts
	// failed export attempts.
	SpansDropped, ExportErrors uint64
}

// ProcessMetrics records the instruments every process exposes: cb_build_info and the trace
// exporter's dropped spans and export errors. Its record methods return nothing; a pair of
// totals going down is refused (see Registry). Safe for concurrent use.
type ProcessMetrics struct {
	facade
	dropped *series
	errors  *series
	totals  func() TraceTotals

	mu sync.Mutex // serialises Refresh/SetTraceTotals so the pair is checked before either moves
}

// NewProcessMetrics registers the process instruments on reg and sets cb_build_info{info} to
// 1: a Service outside the contract's list is an error (*LabelError); a Version that is not
// valid UTF-8 is recorded as OtherValue. totals, if non-nil, is called by Refresh to read the
// trace exporter's running totals (it must be safe for concurrent use). Options:
// WithContract (default: the embedded contract), WithLabelCap, WithOnRefused (default:
// refusals are only counted).
func NewProcessMetrics(reg prometheus.Registerer, info BuildInfo, totals func() TraceTotals, opts ...Option) (*ProcessMetrics, error) {
	return newFacade("process", reg, opts, func(b *builder) *ProcessMetrics {
		m := &ProcessMetrics{
			facade:  facade{b.r},
			dropped: b.counterSeries("cb_trace_spans_dropped_total"),
			errors:  b.counterSeries("cb_trace_export_errors_total"),
			totals:  totals,
		}
		if s := b.gaugeSeries("cb_build_info", info.Service, info.Version); s != nil {
			s.gauge.Set(1)
		}
		return m
	})
}

// Refresh reads the totals function given to NewProcessMetrics (if any) and advances the
// counters to it, as SetTraceTotals. Call it before each scrape, e.g. from Handler's before
// hook.
func (m *ProcessMetrics) Refresh() {
	if m.totals != nil {
		m.SetTraceTotals(m.totals())
	}
}

// SetTraceTotals advances cb_trace_spans_dropped_total and cb_trace_export_errors_total to
// the exporter's running totals. A total lower than the previous one refuses the pair —
// neither counter moves (ErrCounterDecrease; see Registry).
func (m *ProcessMetrics) SetTraceTotals(t TraceTotals) {
	m.mu.Lock()
	err := setTotals(runningTotal{m.dropped, t.SpansDropped}, runningTotal{m.errors, t.ExportErrors})
	m.mu.Unlock()
	m.reg.sink.refuseErr(err)
}
