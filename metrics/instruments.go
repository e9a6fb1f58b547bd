package metrics

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Counter is a contract counter. Label values are passed in contract order. Safe for
// concurrent use.
type Counter struct{ in *instrument }

// Name returns the metric name.
func (c *Counter) Name() string { return c.in.name }

// Add increases the series by v. Negative, NaN and infinite v are refused.
func (c *Counter) Add(v float64, labelValues ...string) error {
	if err := checkValue(c.in.name, v, false); err != nil {
		return err
	}
	s, err := c.in.lookup(labelValues)
	if err != nil {
		return err
	}
	s.counter.Add(v)
	return nil
}

// Inc increases the series by 1.
func (c *Counter) Inc(labelValues ...string) error {
	s, err := c.in.lookup(labelValues)
	if err != nil {
		return err
	}
	s.counter.Inc()
	return nil
}

// SetTotal mirrors an external running total (e.g. a component's atomic counter read before
// each scrape): the series grows by the difference to the previous SetTotal. A total lower
// than the previous one is refused with ErrCounterDecrease (a counter never goes down); NaN,
// negative and infinite totals are refused. Meant for series fed from one source; do not mix
// with Add on the same series, and avoid it on capped labels, whose overflow values share the
// "_other" series.
func (c *Counter) SetTotal(total float64, labelValues ...string) error {
	if err := checkValue(c.in.name, total, false); err != nil {
		return err
	}
	s, err := c.in.lookup(labelValues)
	if err != nil {
		return err
	}
	return s.setTotal(c.in.name, total)
}

func (s *series) setTotal(name string, total float64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if total < s.total {
		return fmt.Errorf("metrics: %s: total %v after %v: %w", name, total, s.total, ErrCounterDecrease)
	}
	if d := total - s.total; d > 0 {
		s.counter.Add(d)
	}
	s.total = total
	return nil
}

// checkTotal reports whether setTotal(total) would be accepted, without recording.
func (s *series) checkTotal(name string, total float64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if total < s.total {
		return fmt.Errorf("metrics: %s: total %v after %v: %w", name, total, s.total, ErrCounterDecrease)
	}
	return nil
}

// Series resolves the series for labelValues once and returns a handle that records into it
// without any lookup.
func (c *Counter) Series(labelValues ...string) (*CounterSeries, error) {
	s, err := c.in.lookup(labelValues)
	if err != nil {
		return nil, err
	}
	return &CounterSeries{name: c.in.name, s: s}, nil
}

// CounterSeries is one resolved series of a Counter. Safe for concurrent use.
type CounterSeries struct {
	name string
	s    *series
}

// Add increases the series by v; negative, NaN and infinite v are refused.
func (cs *CounterSeries) Add(v float64) error {
	if err := checkValue(cs.name, v, false); err != nil {
		return err
	}
	cs.s.counter.Add(v)
	return nil
}

// Inc increases the series by 1.
func (cs *CounterSeries) Inc() { cs.s.counter.Inc() }

// SetTotal advances the series to an external running total; see Counter.SetTotal.
func (cs *CounterSeries) SetTotal(total float64) error {
	if err := checkValue(cs.name, total, false); err != nil {
		return err
	}
	return cs.s.setTotal(cs.name, total)
}

// Gauge is a contract gauge. Safe for concurrent use.
type Gauge struct{ in *instrument }

// Name returns the metric name.
func (g *Gauge) Name() string { return g.in.name }

// Set sets the series to v. NaN and infinite v are refused; negative values are allowed.
func (g *Gauge) Set(v float64, labelValues ...string) error {
	if err := checkValue(g.in.name, v, true); err != nil {
		return err
	}
	s, err := g.in.lookup(labelValues)
	if err != nil {
		return err
	}
	s.gauge.Set(v)
	return nil
}

// Series resolves the series for labelValues once and returns a handle that sets it without
// any lookup.
func (g *Gauge) Series(labelValues ...string) (*GaugeSeries, error) {
	s, err := g.in.lookup(labelValues)
	if err != nil {
		return nil, err
	}
	return &GaugeSeries{name: g.in.name, s: s}, nil
}

// GaugeSeries is one resolved series of a Gauge. Safe for concurrent use.
type GaugeSeries struct {
	name string
	s    *series
}

// Set sets the series to v; NaN and infinite v are refused.
func (gs *GaugeSeries) Set(v float64) error {
	if err := checkValue(gs.name, v, true); err != nil {
		return err
	}
	gs.s.gauge.Set(v)
	return nil
}

// Histogram is a contract histogram. Safe for concurrent use.
type Histogram struct{ in *instrument }

// Name returns the metric name.
func (h *Histogram) Name() string { return h.in.name }

// Observe records v (seconds, for duration histograms). Negative, NaN and infinite values are
// refused. Into an existing series it allocates nothing.
func (h *Histogram) Observe(v float64, labelValues ...string) error {
	if err := checkValue(h.in.name, v, false); err != nil {
		return err
	}
	s, err := h.in.lookup(labelValues)
	if err != nil {
		return err
	}
	s.obs.Observe(v)
	return nil
}

// Series resolves the series for labelValues once (validation and label cap included) and
// returns a handle that observes into it without any lookup: the fastest path for a caller
// that records repeatedly with the same label values.
func (h *Histogram) Series(labelValues ...string) (*HistogramSeries, error) {
	s, err := h.in.lookup(labelValues)
	if err != nil {
		return nil, err
	}
	return &HistogramSeries{name: h.in.name, exemplars: h.in.exemplars, s: s}, nil
}

// HistogramSeries is one resolved series of a Histogram. Safe for concurrent use.
type HistogramSeries struct {
	name      string
	exemplars bool
	s         *series
}

// Observe records v; negative, NaN and infinite values are refused. No allocation.
func (hs *HistogramSeries) Observe(v float64) error {
	if err := checkValue(hs.name, v, false); err != nil {
		return err
	}
	hs.s.obs.Observe(v)
	return nil
}

// ObserveContext records v with a {trace_id, span_id} exemplar when the contract declares
// exemplars and ctx carries a sampled span context.
func (hs *HistogramSeries) ObserveContext(ctx context.Context, v float64) error {
	if err := checkValue(hs.name, v, false); err != nil {
		return err
	}
	hs.s.observe(ctx, hs.exemplars, v)
	return nil
}

// ObserveContext is Observe that, when the contract declares exemplars for the histogram and
// ctx carries a sampled span context, attaches the exemplar {trace_id, span_id} (visible in
// OpenMetrics exposition).
func (h *Histogram) ObserveContext(ctx context.Context, v float64, labelValues ...string) error {
	if err := checkValue(h.in.name, v, false); err != nil {
		return err
	}
	s, err := h.in.lookup(labelValues)
	if err != nil {
		return err
	}
	s.observe(ctx, h.in.exemplars, v)
	return nil
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
