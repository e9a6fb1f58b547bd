package gateway

import (
	"net/http"
	"time"

	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/metrics"
)

// HeaderEngine is the response header naming the engine (host:port) that answered.
const HeaderEngine = "X-Cb-Engine"

// statusWriter is the API writer (httpfront.StatusWriter).
type statusWriter = httpfront.StatusWriter

// newFront builds the gateway's HTTP front: its routes, API key, body bounds and server.
func (g *Gateway) newFront() *httpfront.Front {
	return httpfront.New(httpfront.Config{
		Component: "gateway", Addr: g.cfg.Addr, Settings: g.cfg.Settings, Logger: g.log,
	}, httpfront.Handlers{
		Generate: g.serveGenerate, Documents: g.serveDocuments, Models: g.serveModels, Health: g.serveHealth,
		Metrics: metrics.Handler(g.gatherer, g.refreshEngineMetrics), Record: g.metrics.RecordHTTP,
	})
}

// healthBody is the JSON body of GET /health.
type healthBody struct {
	Status  string         `json:"status"`
	Reason  string         `json:"reason,omitempty"`
	Policy  string         `json:"policy"`
	Engines []healthEngine `json:"engines"`
}

type healthEngine struct {
	URL      string  `json:"url"`
	Up       bool    `json:"up"`
	Reason   string  `json:"reason,omitempty"`
	InFlight int     `json:"in_flight"`
	Load     float64 `json:"load"`
}

// serveHealth answers 200 when at least one engine is up, else 503 with the reasons; the body
// lists every engine's state.
func (g *Gateway) serveHealth(w *statusWriter, _ *http.Request, _ string, _ time.Time) {
	down := g.front.ShuttingDown()
	b := healthBody{Status: "ok", Policy: g.policy.Name()}
	up := 0
	for i, s := range g.pool.snapshot() {
		b.Engines = append(b.Engines, healthEngine{URL: g.pool.engines[i].url, Up: s.up, Reason: s.reason, InFlight: s.inFlight, Load: s.load})
		if s.up {
			up++
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case down:
		b.Status, b.Reason = "unavailable", "shutting down"
	case up == 0:
		b.Status, b.Reason = "unavailable", "no engine is up"
	default:
		httpfront.WriteJSON(w, http.StatusOK, b)
		return
	}
	w.Header().Set("Retry-After", retryAfter(g.cfg.HealthInterval))
	httpfront.WriteJSON(w, http.StatusServiceUnavailable, b)
}
