package httpfront

import (
	"net/http"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
)

// StatusWriter records the status a handler sent and whether anything was written, and
// renews the connection's write deadline (writeTimeout) before every write, so that a client
// that stops reading is cut after it while a long stream never is. Every response it writes
// carries an X-Request-Id (api.HeaderRequestID): the handler's when it set one before the
// first write, else a fresh api.NewRequestID. Not safe for concurrent use (one per request,
// like the http.ResponseWriter it wraps).
type StatusWriter struct {
	http.ResponseWriter
	// Status is the status sent (0 before); a handler may set it to one it could not send
	// (499: the client went away).
	Status       int
	wrote        bool
	rc           *http.ResponseController
	writeTimeout time.Duration
}

// NewStatusWriter wraps rw; writeTimeout <= 0 renews no deadline.
func NewStatusWriter(rw http.ResponseWriter, writeTimeout time.Duration) *StatusWriter {
	return &StatusWriter{ResponseWriter: rw, rc: http.NewResponseController(rw), writeTimeout: writeTimeout}
}

// Wrote reports whether anything (a header or a body) was written.
func (w *StatusWriter) Wrote() bool { return w.wrote }

// ensureRequestID sets a fresh X-Request-Id before the first write when the handler set
// none (the gateway's /health, /metrics and documents answers, an engine's /metrics).
func (w *StatusWriter) ensureRequestID() {
	if w.wrote {
		return
	}
	if h := w.ResponseWriter.Header(); h.Get(api.HeaderRequestID) == "" {
		h.Set(api.HeaderRequestID, api.NewRequestID())
	}
}

func (w *StatusWriter) renew() {
	if w.rc != nil && w.writeTimeout > 0 {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.writeTimeout))
	}
}

// WriteHeader implements http.ResponseWriter.
func (w *StatusWriter) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ensureRequestID()
	w.wrote = true
	w.renew()
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	w.ensureRequestID()
	w.wrote = true
	w.renew()
	return w.ResponseWriter.Write(b)
}

// FlushError flushes and reports a failed write (the client went away or stopped reading);
// http.ResponseController.Flush uses it.
func (w *StatusWriter) FlushError() error {
	w.ensureRequestID() // a flush before any write sends the header
	w.renew()
	if w.rc == nil {
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		return nil
	}
	return w.rc.Flush()
}

// Flush implements http.Flusher (server-sent events).
func (w *StatusWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// HandlerFunc serves one route of a front (see [Handlers]).
type HandlerFunc func(w *StatusWriter, r *http.Request, route string, t0 time.Time)

// route is one entry of a routing table: its method (GET also answers HEAD) and handler.
type route struct {
	Method  string
	Handler HandlerFunc
}

// routes serves table by path (/v1/models/… is RouteModel), answering OpenAI-shaped 404 and
// 405 errors, and after every request calls record with the method, the route template and
// the status (200 when none was written). Responses are written through a StatusWriter that
// renews writeTimeout.
func routes(table map[string]route, writeTimeout time.Duration, record func(method, route string, status int, seconds float64)) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		w := NewStatusWriter(rw, writeTimeout)
		route := r.URL.Path
		if strings.HasPrefix(route, api.RouteModels+"/") {
			route = api.RouteModel
		}
		ent, ok := table[route]
		switch {
		case !ok:
			route = api.RouteUnmatched
			api.RouteNotFound(r.Method, r.URL.Path).Write(w)
		case r.Method != ent.Method && !(ent.Method == http.MethodGet && r.Method == http.MethodHead):
			w.Header().Set("Allow", ent.Method)
			api.MethodNotAllowed(r.Method, r.URL.Path).Write(w)
		default:
			ent.Handler(w, r, route, t0)
		}
		w.ensureRequestID() // a handler that wrote nothing: net/http sends the header now
		status := w.Status
		if status == 0 {
			status = http.StatusOK
		}
		record(r.Method, route, status, time.Since(t0).Seconds())
	})
}
