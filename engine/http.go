package engine

import (
	"net/http"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/metrics"
)

// statusWriter is the API writer (httpfront.StatusWriter).
type statusWriter = httpfront.StatusWriter

// writeJSON writes a JSON body (httpfront.WriteJSON).
var writeJSON = httpfront.WriteJSON

// newFront builds the engine's HTTP front: its routes, API key, body bounds and server.
func (e *Engine) newFront() *httpfront.Front {
	return httpfront.New(httpfront.Config{
		Component: "engine", Addr: e.cfg.Addr, Settings: e.cfg.Settings, Logger: e.log,
	}, httpfront.Handlers{
		Generate: e.serveGenerate, Documents: e.serveDocuments, Models: e.serveModels, Health: e.serveHealth,
		Metrics: metrics.Handler(e.gatherer, e.refreshMetrics), Record: e.metrics.RecordHTTP,
	})
}

func (e *Engine) serveModels(w *statusWriter, r *http.Request, route string, _ time.Time) {
	if apiErr := e.front.Authorize(r); apiErr != nil {
		apiErr.Write(w)
		return
	}
	m := api.Model{ID: e.cfg.Model, Object: "model", Created: e.created, OwnedBy: "cacheblend"}
	if info, ok := e.sched.WorkerInfo(); ok {
		m.MaxModelLen = int(info.GetMaxPositions())
	}
	if route == api.RouteModel {
		if id := strings.TrimPrefix(r.URL.Path, api.RouteModels+"/"); id != e.cfg.Model {
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
	down := e.front.ShuttingDown()
	switch {
	case down:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "shutting down", "role": e.cfg.Role})
	case !ready:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "worker unavailable", "role": e.cfg.Role})
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "role": e.cfg.Role})
	}
}
