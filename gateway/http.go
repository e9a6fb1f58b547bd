package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/metrics"
)

// Route templates (the http_route label): the API's, see package api.
const (
	RouteChat        = api.RouteChat
	RouteCompletions = api.RouteCompletions
	RouteModels      = api.RouteModels
	RouteModel       = api.RouteModel
	RouteDocuments   = api.RouteDocuments
	RouteHealth      = api.RouteHealth
	RouteMetrics     = api.RouteMetrics
	// RouteUnmatched labels requests to unknown paths.
	RouteUnmatched = api.RouteUnmatched
)

// HeaderEngine is the response header naming the engine (host:port) that answered.
const HeaderEngine = "X-Cb-Engine"

// statusWriter is the API writer (api.StatusWriter).
type statusWriter = api.StatusWriter

// routes builds the gateway's handler: routing, the HTTP duration metric, OpenAI-shaped
// 404/405 errors.
func (g *Gateway) routes() http.Handler {
	metricsHandler := metrics.Handler(g.gatherer, g.refreshEngineMetrics)
	table := map[string]api.Route{
		RouteChat: {Method: http.MethodPost, Handler: func(w *statusWriter, r *http.Request, route string, t0 time.Time) {
			g.serveGenerate(w, r, api.OperationChat, route, t0)
		}},
		RouteCompletions: {Method: http.MethodPost, Handler: func(w *statusWriter, r *http.Request, route string, t0 time.Time) {
			g.serveGenerate(w, r, api.OperationTextCompletion, route, t0)
		}},
		RouteDocuments: {Method: http.MethodPost, Handler: g.serveDocuments},
		RouteModels:    {Method: http.MethodGet, Handler: g.serveModels},
		RouteModel:     {Method: http.MethodGet, Handler: g.serveModels},
		RouteHealth:    {Method: http.MethodGet, Handler: g.serveHealth},
		RouteMetrics: {Method: http.MethodGet, Handler: func(w *statusWriter, r *http.Request, _ string, _ time.Time) {
			metricsHandler.ServeHTTP(w, r)
		}},
	}
	return api.Routes(table, g.cfg.WriteTimeout, g.metrics.RecordHTTP)
}

// authorize checks the API key of a /v1/ request (api.Authorize).
func (g *Gateway) authorize(r *http.Request) *api.Error { return api.Authorize(r, g.cfg.APIKey) }

// readBody reads a request body within the limits of the server (api.ReadBody).
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *api.Error) {
	if apiErr := api.CheckJSON(r); apiErr != nil { // 415: never served as JSON
		return nil, apiErr
	}
	return api.ReadBody(w, r, g.cfg.MaxBodyBytes, g.cfg.ReadTimeout)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		api.Internal(fmt.Sprintf("encode response: %v", err)).Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
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
	g.mu.Lock()
	down := g.shutdown
	g.mu.Unlock()
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
		writeJSON(w, http.StatusOK, b)
		return
	}
	w.Header().Set("Retry-After", retryAfter(g.cfg.HealthInterval))
	writeJSON(w, http.StatusServiceUnavailable, b)
}
