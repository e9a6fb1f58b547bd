package metrics

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo labels cb_build_info.
type BuildInfo struct {
	// Service is "cb-engine", "cb-worker", "cb-blend" or "cb-traces".
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
// exporter's dropped spans and export errors. Safe for concurrent use.
type ProcessMetrics struct {
	reg     *Registry
	dropped *series
	errors  *series
	totals  func() TraceTotals

	mu sync.Mutex // serialises Refresh/SetTraceTotals so the pair is checked before either moves
}

// NewProcessMetrics registers the process instruments on reg and sets cb_build_info{info} to
// 1. totals, if non-nil, is called by Refresh to read the trace exporter's running totals (it
// must be safe for concurrent use). Options: WithContract, WithLabelCap.
func NewProcessMetrics(reg prometheus.Registerer, info BuildInfo, totals func() TraceTotals, opts ...Option) (*ProcessMetrics, error) {
	r, err := newFacadeRegistry("process", reg, opts)
	if err != nil {
		return nil, err
	}
	b := &builder{r: r}
	m := &ProcessMetrics{
		reg:     r,
		dropped: b.counterSeries("cb_trace_spans_dropped_total"),
		errors:  b.counterSeries("cb_trace_export_errors_total"),
		totals:  totals,
	}
	if g := b.gauge("cb_build_info"); g != nil {
		b.keep(g.Set(1, info.Service, info.Version))
	}
	if b.err != nil {
		return nil, fmt.Errorf("metrics: process: %w", b.err)
	}
	return m, nil
}

// Registry returns the registry the facade registers through.
func (m *ProcessMetrics) Registry() *Registry { return m.reg }

// Refresh reads the totals function given to NewProcessMetrics (if any) and advances the
// counters to it. Call it before each scrape, e.g. from Handler's before hook.
func (m *ProcessMetrics) Refresh() error {
	if m.totals == nil {
		return nil
	}
	return m.SetTraceTotals(m.totals())
}

// SetTraceTotals advances cb_trace_spans_dropped_total and cb_trace_export_errors_total to
// the exporter's running totals; a lower total is refused (ErrCounterDecrease) and then
// neither counter moves.
func (m *ProcessMetrics) SetTraceTotals(t TraceTotals) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.dropped.checkTotal("cb_trace_spans_dropped_total", float64(t.SpansDropped)); err != nil {
		return err
	}
	if err := m.errors.checkTotal("cb_trace_export_errors_total", float64(t.ExportErrors)); err != nil {
		return err
	}
	if err := m.dropped.setTotal("cb_trace_spans_dropped_total", float64(t.SpansDropped)); err != nil {
		return err
	}
	return m.errors.setTotal("cb_trace_export_errors_total", float64(t.ExportErrors))
}
