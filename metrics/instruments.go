package metrics

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Counter is a contract counter. Label values are passed in contract order. Its record
// methods return nothing: what they cannot take as given is refused or recorded as OtherValue
// as described on Registry. Safe for concurrent use.
type Counter struct{ in *instrument }

// Name returns the metric name.
func (c *Counter) Name() string { return c.in.name }

// Add increases the series by v. Negative, NaN and infinite v, and label values the contract
// refuses, are refused (nothing recorded; see Registry).
func (c *Counter) Add(v float64, labelValues ...string) {
	if s := c.in.take(v, false, labelValues); s != nil {
		s.counter.Add(v)
	}
}

// Inc increases the series by 1. Label values the contract refuses are refused (see Registry).
func (c *Counter) Inc(labelValues ...string) {
	if s := c.in.take(1, false, labelValues); s != nil {
		s.counter.Inc()
	}
}

// SetTotal mirrors an external running total (e.g. a component's atomic counter read before
// each scrape): the series grows by the difference to the previous SetTotal. A total lower
// than the previous one is refused (ErrCounterDecrease: a counter never goes down), as are
// NaN, negative and infinite totals (see Registry). Meant for series fed from one source; do
// not mix with Add on the same series, and avoid it on capped labels, whose overflow values
// share the "_other" series.
func (c *Counter) SetTotal(total float64, labelValues ...string) {
	if s := c.in.take(total, false, labelValues); s != nil {
		c.in.sink.refuseErr(s.setTotal(total))
	}
}

// setTotal advances the series to total; a lower total is an ErrCounterDecrease.
func (s *series) setTotal(total float64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if total < s.total {
		return fmt.Errorf("metrics: %s: total %v after %v: %w", s.name, total, s.total, ErrCounterDecrease)
	}
	if d := total - s.total; d > 0 {
		s.counter.Add(d)
	}
	s.total = total
	return nil
}

// runningTotal is a counter series with the external running total to advance it to.
type runningTotal struct {
	s     *series
	total uint64
}

// setTotals advances every series to its total, or none of them when one total is lower than
// its series' previous one (ErrCounterDecrease). Callers serialise calls on the same series.
func setTotals(ts ...runningTotal) error {
	for _, t := range ts {
		t.s.mu.Lock()
		prev := t.s.total
		t.s.mu.Unlock()
		if float64(t.total) < prev {
			return fmt.Errorf("metrics: %s: total %v after %v: %w", t.s.name, float64(t.total), prev, ErrCounterDecrease)
		}
	}
	for _, t := range ts {
		if err := t.s.setTotal(float64(t.total)); err != nil {
			return err
		}
	}
	return nil
}

// Series resolves the series for labelValues once and returns a handle that records into it
// without any lookup. A value outside an allowed list or a wrong number of values is an error
// (*LabelError); a capped value that is not valid UTF-8 resolves to the OtherValue series.
func (c *Counter) Series(labelValues ...string) (*CounterSeries, error) {
	s, err := c.in.lookup(labelValues)
	if err != nil {
		return nil, err
	}
	return &CounterSeries{in: c.in, s: s}, nil
}

// CounterSeries is one resolved series of a Counter. Its record methods return nothing (see
// Registry). Safe for concurrent use.
type CounterSeries struct {
	in *instrument
	s  *series
}

// Add increases the series by v; negative, NaN and infinite v are refused (see Registry).
func (cs *CounterSeries) Add(v float64) {
	if cs.in.accepts(v, false) {
		cs.s.counter.Add(v)
	}
}

// Inc increases the series by 1.
func (cs *CounterSeries) Inc() { cs.s.counter.Inc() }

// SetTotal advances the series to an external running total; see Counter.SetTotal.
func (cs *CounterSeries) SetTotal(total float64) {
	if cs.in.accepts(total, false) {
		cs.in.sink.refuseErr(cs.s.setTotal(total))
	}
}

// Gauge is a contract gauge. Its record methods return nothing (see Registry). Safe for
// concurrent use.
type Gauge struct{ in *instrument }

// Name returns the metric name.
func (g *Gauge) Name() string { return g.in.name }

// Set sets the series to v. NaN and infinite v, and label values the contract refuses, are
// refused (see Registry); negative values are allowed.
func (g *Gauge) Set(v float64, labelValues ...string) {
	if s := g.in.take(v, true, labelValues); s != nil {
		s.gauge.Set(v)
	}
}

// Series resolves the series for labelValues once and returns a handle that sets it without
// any lookup. Errors as for Counter.Series.
func (g *Gauge) Series(labelValues ...string) (*GaugeSeries, error) {
	s, err := g.in.lookup(labelValues)
	if err != nil {
		return nil, err
	}
	return &GaugeSeries{in: g.in, s: s}, nil
}

// GaugeSeries is one resolved series of a Gauge. Safe for concurrent use.
type GaugeSeries struct {
	in *instrument
	s  *series
}

// Set sets the series to v; NaN and infinite v are refused (see Registry).
func (gs *GaugeSeries) Set(v float64) {
	if gs.in.accepts(v, true) {
		gs.s.gauge.Set(v)
	}
}

// Histogram is a contract histogram. Its record methods return nothing (see Registry). Safe
// for concurrent use.
type Histogram struct{ in *instrument }

// Name returns the metric name.
func (h *Histogram) Name() string { return h.in.name }

// Observe records v (seconds, for duration histograms). Negative, NaN and infinite values,
// and label values the contract refuses, are refused (see Registry). Into an existing series
// it allocates nothing.
func (h *Histogram) Observe(v float64, labelValues ...string) {
	if s := h.in.take(v, false, labelValues); s != nil {
		s.obs.Observe(v)
	}
}

// ObserveContext is Observe that, when the contract declares exemplars for the histogram and
// ctx carries a sampled span context, attaches the exemplar {trace_id, span_id} (visible in
// OpenMetrics exposition). A nil ctx records without exemplar.
func (h *Histogram) ObserveContext(ctx context.Context, v float64, labelValues ...string) {
	if s := h.in.take(v, false, labelValues); s != nil {
		s.observe(ctx, h.in.exemplars, v)
	}
}

// Series resolves the series for labelValues once (validation and label cap included) and
// returns a handle that observes into it without any lookup: the fastest path for a caller
// that records repeatedly with the same label values. Errors as for Counter.Series.
func (h *Histogram) Series(labelValues ...string) (*HistogramSeries, error) {
	s, err := h.in.lookup(labelValues)
	if err != nil {
		return nil, err
	}
	return &HistogramSeries{in: h.in, s: s}, nil
}

// HistogramSeries is one resolved series of a Histogram. Safe for concurrent use.
type HistogramSeries struct {
	in *instrument
	s  *series
}

// Observe records v; negative, NaN and infinite values are refused (see Registry). No
// allocation.
func (hs *HistogramSeries) Observe(v float64) {
	if hs.in.accepts(v, false) {
		hs.s.obs.Observe(v)
	}
}

// ObserveContext records v with a {trace_id, span_id} exemplar when the contract declares
// exemplars and ctx (which may be nil) carries a sampled span context; values as for Observe.
func (hs *HistogramSeries) ObserveContext(ctx context.Context, v float64) {
	if hs.in.accepts(v, false) {
		hs.s.observe(ctx, hs.in.exemplars, v)
	}
}

// observe records v with an exemplar when wanted and ctx carries a sampled span context.
func (s *series) observe(ctx context.Context, exemplars bool, v float64) {
	s.observeSpan(spanOf(ctx), exemplars, v)
}

// spanOf returns the span context in ctx (the zero, invalid one for a nil ctx).
func spanOf(ctx context.Context) trace.SpanContext {
	if ctx == nil {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(ctx)
}

// observeSpan records v with a {trace_id, span_id} exemplar when wanted and sc is a valid,
// sampled span context.
func (s *series) observeSpan(sc trace.SpanContext, exemplars bool, v float64) {
	if exemplars && s.exo != nil && sc.IsSampled() && sc.IsValid() {
		s.exo.ObserveWithExemplar(v, prometheus.Labels{
			"trace_id": sc.TraceID().String(),
			"span_id":  sc.SpanID().String(),
		})
		return
	}
	s.obs.Observe(v)
}
