package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// Handler serves g on /metrics through promhttp: Prometheus text format 0.0.4 by default and
// OpenMetrics when the scraper asks for it (exemplars are only exposed in OpenMetrics). before,
// if non-nil, runs before every gather to refresh gauges and running totals (e.g.
// EngineMetrics.SetEngine, ProcessMetrics.Refresh); it may run concurrently for concurrent
// scrapes and must be safe for that. A gather error is served as HTTP 500 with the error text.
// The handler is safe for concurrent use.
func Handler(g prometheus.Gatherer, before func()) http.Handler {
	gather := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		if before != nil {
			before()
		}
		return g.Gather()
	})
	return promhttp.HandlerFor(gather, promhttp.HandlerOpts{EnableOpenMetrics: true})
}
