package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// FleetTrustStats are the fleet tier's trust totals for FleetTrust.SetTotals: the values
// read from Redis that were refused, by reason, the local chunks not written to Redis, and
// whether Redis answered last.
type FleetTrustStats struct {
	// Values read from Redis and refused: no valid fleet-key tag (another fleet's key, a
	// tampered or moved value, the unauthenticated version 1 format), larger than the layout
	// allows, authenticated but malformed, K/V not finite.
	Unauthenticated, Oversize, Malformed, NonFinite uint64
	// WriteNonFinite counts local chunks with non-finite K/V never written to Redis.
	WriteNonFinite uint64
	// Reachable: the last Redis call (or health probe) was answered.
	Reachable bool
}

// FleetTrust holds the blend server's fleet-tier trust instruments
// (lmcache_blend_remote_refused_total, lmcache_blend_remote_reachable). Create it with
// NewFleetTrust; safe for concurrent use.
type FleetTrust struct {
	facade
	unauth, oversize, malformed, nonFinite, writeNonFinite *series
	reachable                                              *series
}

// NewFleetTrust registers the fleet-tier trust instruments on reg. Options as for
// NewBlendMetrics (a contract, a refusal handler).
func NewFleetTrust(reg prometheus.Registerer, opts ...Option) (*FleetTrust, error) {
	return newFacade("fleet trust", reg, opts, func(b *builder) *FleetTrust {
		const name = "lmcache_blend_remote_refused_total"
		return &FleetTrust{
			facade:         facade{b.r},
			unauth:         b.counterSeries(name, "unauthenticated"),
			oversize:       b.counterSeries(name, "oversize"),
			malformed:      b.counterSeries(name, "malformed"),
			nonFinite:      b.counterSeries(name, "non_finite"),
			writeNonFinite: b.counterSeries(name, "write_non_finite"),
			reachable:      b.gaugeSeries("lmcache_blend_remote_reachable"),
		}
	})
}

// SetTotals advances the counters to the tier's running totals and sets the reachability
// gauge (call before each scrape). A total lower than the previous one is refused for that
// counter (ErrCounterDecrease; see Registry); the others still move.
func (m *FleetTrust) SetTotals(s FleetTrustStats) {
	var errs []error
	for _, t := range []runningTotal{
		{m.unauth, s.Unauthenticated}, {m.oversize, s.Oversize}, {m.malformed, s.Malformed},
		{m.nonFinite, s.NonFinite}, {m.writeNonFinite, s.WriteNonFinite},
	} {
		errs = append(errs, t.s.setTotal(float64(t.total)))
	}
	r := 0.0
	if s.Reachable {
		r = 1
	}
	m.reachable.gauge.Set(r)
	m.reg.sink.refuseErr(errors.Join(errs...))
}
