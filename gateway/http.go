package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/metrics"
)

// Route templates (the http_route label), the engine's.
const (
	RouteChat        = "/v1/chat/completions"
	RouteCompletions = "/v1/completions"
	RouteModels      = "/v1/models"
	RouteModel       = "/v1/models/{model}"
	RouteDocuments   = "/v1/documents"
	RouteHealth      = "/health"
	RouteMetrics     = "/metrics"
	// RouteUnmatched labels requests to unknown paths.
	RouteUnmatched = "unmatched"
)

// HeaderEngine is the response header naming the engine (host:port) that answered.
const HeaderEngine = "X-Cb-Engine"

// statusWriter records the status a handler sent and whether anything was written, and
// renews the connection's write deadline (Config.WriteTimeout) before every write, so that a
// client that stops reading is cut after WriteTimeout while a long stream never is.
type statusWriter struct {
	http.ResponseWriter
	status       int
	wrote        bool
	rc           *http.ResponseController
	writeTimeout time.Duration
}

func (w *statusWriter) renew() {
	if w.rc != nil && w.writeTimeout > 0 {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.writeTimeout))
	}
}

// WriteHeader implements http.ResponseWriter.
func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.wrote = true
	w.renew()
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.wrote = true
	w.renew()
	return w.ResponseWriter.Write(b)
}

// FlushError flushes and reports a failed write (the client went away).
func (w *statusWriter) FlushError() error {
	w.renew()
	if w.rc == nil {
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		return nil
	}
	return w.rc.Flush()
}

// Flush implements http.Flusher.
func (w *statusWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// routes builds the gateway's handler: routing, the HTTP duration metric, OpenAI-shaped
// 404/405 errors.
func (g *Gateway) routes() http.Handler {
	metricsHandler := metrics.Handler(g.gatherer, g.refreshEngineMetrics)
	type entry struct {
		method string
		h      func(w *statusWriter, r *http.Request, route string, t0 time.Time)
	}
	table := map[string]entry{
		RouteChat: {http.MethodPost, func(w *statusWriter, r *http.Request, route string, t0 time.Time) {
			g.serveGenerate(w, r, api.OperationChat, route, t0)
		}},
		RouteCompletions: {http.MethodPost, func(w *statusWriter, r *http.Request, route string, t0 time.Time) {
			g.serveGenerate(w, r, api.OperationTextCompletion, route, t0)
		}},
		RouteDocuments: {http.MethodPost, g.serveDocuments},
		RouteModels:    {http.MethodGet, g.serveModels},
		RouteModel:     {http.MethodGet, g.serveModels},
		RouteHealth:    {http.MethodGet, g.serveHealth},
		RouteMetrics: {http.MethodGet, func(w *statusWriter, r *http.Request, _ string, _ time.Time) {
			metricsHandler.ServeHTTP(w, r)
		}},
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		w := &statusWriter{ResponseWriter: rw, rc: http.NewResponseController(rw), writeTimeout: g.cfg.WriteTimeout}
		route := r.URL.Path
		if strings.HasPrefix(route, RouteModels+"/") {
			route = RouteModel
		}
		ent, ok := table[route]
		switch {
		case !ok:
			route = RouteUnmatched
			api.RouteNotFound(r.Method, r.URL.Path).Write(w)
		case r.Method != ent.method && !(ent.method == http.MethodGet && r.Method == http.MethodHead):
			w.Header().Set("Allow", ent.method)
			api.MethodNotAllowed(r.Method, r.URL.Path).Write(w)
		default:
			ent.h(w, r, route, t0)
		}
		status := w.status
		if status == 0 {
			status = http.StatusOK
		}
		g.metrics.RecordHTTP(r.Method, route, status, time.Since(t0).Seconds())
	})
}

// authorize checks the API key of a /v1/ request (api.Authorize).
func (g *Gateway) authorize(r *http.Request) *api.Error { return api.Authorize(r, g.cfg.APIKey) }

// readBody reads a request body within the limits of the server (api.ReadBody).
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *api.Error) {
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
