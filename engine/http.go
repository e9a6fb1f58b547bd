package engine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
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

// statusWriter is the API writer (api.StatusWriter).
type statusWriter = api.StatusWriter

// routes builds the engine's handler: routing, the HTTP duration metric, and
// OpenAI-shaped 404/405 errors.
func (e *Engine) routes() http.Handler {
	metricsHandler := metrics.Handler(e.gatherer, e.refreshMetrics)
	table := map[string]api.Route{
		RouteChat: {Method: http.MethodPost, Handler: func(w *statusWriter, r *http.Request, route string, t0 time.Time) {
			e.serveGenerate(w, r, api.OperationChat, route, t0)
		}},
		RouteCompletions: {Method: http.MethodPost, Handler: func(w *statusWriter, r *http.Request, route string, t0 time.Time) {
			e.serveGenerate(w, r, api.OperationTextCompletion, route, t0)
		}},
		RouteModels:    {Method: http.MethodGet, Handler: e.serveModels},
		RouteModel:     {Method: http.MethodGet, Handler: e.serveModels},
		RouteDocuments: {Method: http.MethodPost, Handler: e.serveDocuments},
		RouteHealth:    {Method: http.MethodGet, Handler: e.serveHealth},
		RouteMetrics: {Method: http.MethodGet, Handler: func(w *statusWriter, r *http.Request, _ string, _ time.Time) {
			metricsHandler.ServeHTTP(w, r)
		}},
	}
	return api.Routes(table, e.cfg.WriteTimeout, e.metrics.RecordHTTP)
}

// authorize checks the API key of a /v1/ request (api.Authorize).
func (e *Engine) authorize(r *http.Request) *api.Error { return api.Authorize(r, e.cfg.APIKey) }

// readBody reads a request body within the limits of the server
// (api.ReadBody), after checking it is declared JSON (api.CheckJSON: 415).
func (e *Engine) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *api.Error) {
	if apiErr := api.CheckJSON(r); apiErr != nil {
		return nil, apiErr
	}
	return api.ReadBody(w, r, e.cfg.MaxBodyBytes, e.cfg.ReadTimeout)
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

func (e *Engine) serveModels(w *statusWriter, r *http.Request, route string, _ time.Time) {
	if apiErr := e.authorize(r); apiErr != nil {
		apiErr.Write(w)
		return
	}
	m := api.Model{ID: e.cfg.Model, Object: "model", Created: e.created, OwnedBy: "cacheblend"}
	if info, ok := e.sched.WorkerInfo(); ok {
		m.MaxModelLen = int(info.GetMaxPositions())
	}
	if route == RouteModel {
		if id := strings.TrimPrefix(r.URL.Path, RouteModels+"/"); id != e.cfg.Model {
			api.ModelNotFound(id).Write(w)
			return
		}
		writeJSON(w, http.StatusOK, m)
		return
	}
	writeJSON(w, http.StatusOK, api.ModelList{Object: "list", Data: []api.Model{m}})
}

func (e *Engine) serveHealth(w *statusWriter, _ *http.Request, _ string, _ time.Time) {
	_, ready := e.sched.WorkerInfo()
	e.mu.Lock()
	down := e.shutdown
	e.mu.Unlock()
	switch {
	case down:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "shutting down", "role": e.cfg.Role})
	case !ready:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "worker unavailable", "role": e.cfg.Role})
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "role": e.cfg.Role})
	}
}
