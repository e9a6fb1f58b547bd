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

// Route templates (the http_route label).
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

// statusWriter records the status a handler sent, and renews the
// connection's write deadline (Config.WriteTimeout) before every write, so
// that a client that stops reading is cut after WriteTimeout while a long
// generation or stream never is.
type statusWriter struct {
	http.ResponseWriter
	status       int
	rc           *http.ResponseController // of ResponseWriter
	writeTimeout time.Duration
}

// renew moves the write deadline WriteTimeout ahead (a no-op where the
// writer has no deadline, e.g. in tests).
func (w *statusWriter) renew() {
	if w.rc != nil && w.writeTimeout > 0 {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.writeTimeout))
	}
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.renew()
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.renew()
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher (server-sent events).
func (w *statusWriter) Flush() { _ = w.FlushError() }

// FlushError flushes and reports a failed write (the client went away or
// stopped reading); http.ResponseController.Flush uses it.
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

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// handlerFunc serves one route; it may set w.status to a status it could not
// send (499: the client went away).
type handlerFunc func(w *statusWriter, r *http.Request, route string, t0 time.Time)

// routes builds the engine's handler: routing, the HTTP duration metric, and
// OpenAI-shaped 404/405 errors.
func (e *Engine) routes() http.Handler {
	metricsHandler := metrics.Handler(e.gatherer, e.refreshMetrics)
	type entry struct {
		method string
		h      handlerFunc
	}
	table := map[string]entry{
		RouteChat: {http.MethodPost, func(w *statusWriter, r *http.Request, route string, t0 time.Time) {
			e.serveGenerate(w, r, api.OperationChat, route, t0)
		}},
		RouteCompletions: {http.MethodPost, func(w *statusWriter, r *http.Request, route string, t0 time.Time) {
			e.serveGenerate(w, r, api.OperationTextCompletion, route, t0)
		}},
		RouteModels:    {http.MethodGet, e.serveModels},
		RouteModel:     {http.MethodGet, e.serveModels},
		RouteDocuments: {http.MethodPost, e.serveDocuments},
		RouteHealth:    {http.MethodGet, e.serveHealth},
		RouteMetrics: {http.MethodGet, func(w *statusWriter, r *http.Request, _ string, _ time.Time) {
			metricsHandler.ServeHTTP(w, r)
		}},
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		w := &statusWriter{ResponseWriter: rw, rc: http.NewResponseController(rw), writeTimeout: e.cfg.WriteTimeout}
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
		e.metrics.RecordHTTP(r.Method, route, status, time.Since(t0).Seconds())
	})
}

// authorize checks the API key of a /v1/ request (api.Authorize).
func (e *Engine) authorize(r *http.Request) *api.Error { return api.Authorize(r, e.cfg.APIKey) }

// readBody reads a request body within the limits of the server (api.ReadBody).
func (e *Engine) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *api.Error) {
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
