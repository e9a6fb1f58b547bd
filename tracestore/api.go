package tracestore

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// DefaultRequestsLimit is the page size of /api/requests when the query sets none.
const DefaultRequestsLimit = 500

// QueryStats is the body of /api/stats.
type QueryStats struct {
	Store    StoreStats     `json:"store"`
	Receiver *ReceiverStats `json:"receiver,omitempty"`
}

// NewQueryHandler returns the query port's handler: the Jaeger-compatible API, the
// collector's extensions and the web page.
//
//	GET /api/services                       service names
//	GET /api/services/{service}/operations  span names of a service
//	GET /api/operations?service=&spanKind=  span names with kinds
//	GET /api/traces?service=&operation=&tags=&start=&end=&lookback=&minDuration=&maxDuration=&limit=
//	GET /api/traces/{traceID}               one trace (404 when unknown)
//	GET /api/traces/{traceID}/breakdown     where the time went ([Breakdown])
//	GET /api/traces/{traceID}/linked?limit= spans of other traces linking to it ([LinkedSpan]),
//	                                        e.g. the request's cb.quality check; 200 with none
//	GET /api/requests?limit=&offset=        the request index ([RequestSummary]), newest first
//	GET /api/requests?traceID=              the index row of one trace
//	GET /api/stats                          store and receiver counters
//	GET /                                   the web page (embedded files)
//
// Responses use Jaeger's envelope {"data", "total", "limit", "offset", "errors"}. recv may
// be nil (no receiver counters in /api/stats). The handler is safe for concurrent use.
func NewQueryHandler(store *Store, recv *Receiver) http.Handler {
	h := &queryHandler{store: store, recv: recv, now: time.Now}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/services", h.services)
	mux.HandleFunc("GET /api/services/{service}/operations", h.serviceOperations)
	mux.HandleFunc("GET /api/operations", h.operations)
	mux.HandleFunc("GET /api/traces", h.findTraces)
	mux.HandleFunc("GET /api/traces/{id}", h.trace)
	mux.HandleFunc("GET /api/traces/{id}/breakdown", h.breakdown)
	mux.HandleFunc("GET /api/traces/{id}/linked", h.linked)
	mux.HandleFunc("GET /api/requests", h.requests)
	mux.HandleFunc("GET /api/stats", h.stats)
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such API endpoint: "+r.Method+" "+r.URL.Path)
	})
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil { // the embedded tree always has ui/
		panic("tracestore: embedded ui files missing: " + err.Error())
	}
	files := http.FileServerFS(sub)
	mux.Handle("/", securityHeaders(files))
	return mux
}

type queryHandler struct {
	store *Store
	recv  *Receiver
	now   func() time.Time
}

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-cache")
		next.ServeHTTP(w, r)
	})
}

func writeJSON[T any](w http.ResponseWriter, status int, resp jaeger.Response[T]) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(resp) // the client went away, or a bug in a type we own
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, jaeger.Response[any]{Errors: []jaeger.Error{{Code: status, Msg: msg}}})
}

func (h *queryHandler) services(w http.ResponseWriter, _ *http.Request) {
	svcs := h.store.Services()
	writeJSON(w, http.StatusOK, jaeger.Response[[]string]{Data: svcs, Total: len(svcs)})
}

func (h *queryHandler) serviceOperations(w http.ResponseWriter, r *http.Request) {
	ops := h.store.Operations(r.PathValue("service"))
	names := make([]string, 0, len(ops))
	for _, op := range ops {
		if len(names) == 0 || names[len(names)-1] != op.Name {
			names = append(names, op.Name)
		}
	}
	writeJSON(w, http.StatusOK, jaeger.Response[[]string]{Data: names, Total: len(names)})
}

func (h *queryHandler) operations(w http.ResponseWriter, r *http.Request) {
	svc := r.URL.Query().Get("service")
	if svc == "" {
		writeError(w, http.StatusBadRequest, "parameter 'service' is required")
		return
	}
	kind := r.URL.Query().Get("spanKind")
	ops := []jaeger.Operation{}
	for _, op := range h.store.Operations(svc) {
		if kind == "" || op.SpanKind == kind {
			ops = append(ops, op)
		}
	}
	writeJSON(w, http.StatusOK, jaeger.Response[[]jaeger.Operation]{Data: ops, Total: len(ops)})
}

func (h *queryHandler) findTraces(w http.ResponseWriter, r *http.Request) {
	q, err := jaeger.ParseQuery(r.URL.Query(), h.now())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	traces := h.store.FindTraces(q)
	writeJSON(w, http.StatusOK, jaeger.Response[[]jaeger.Trace]{Data: traces, Total: len(traces), Limit: q.Limit})
}

func (h *queryHandler) trace(w http.ResponseWriter, r *http.Request) {
	serveTrace(w, r, func(id string) ([]jaeger.Trace, bool) {
		t, ok := h.store.Trace(id)
		return []jaeger.Trace{t}, ok
	})
}

func (h *queryHandler) breakdown(w http.ResponseWriter, r *http.Request) {
	serveTrace(w, r, h.store.Breakdown)
}

// serveTrace answers a request for the trace of the path's id with what get returns for it:
// 400 for a malformed id, 404 when get finds nothing.
func serveTrace[T any](w http.ResponseWriter, r *http.Request, get func(id string) (T, bool)) {
	id := r.PathValue("id")
	if !jaeger.IsTraceID(id) {
		writeError(w, http.StatusBadRequest, "malformed trace id "+strconv.Quote(id))
		return
	}
	v, ok := get(id)
	if !ok {
		writeError(w, http.StatusNotFound, "trace not found")
		return
	}
	writeJSON(w, http.StatusOK, jaeger.Response[T]{Data: v, Total: 1})
}

func (h *queryHandler) linked(w http.ResponseWriter, r *http.Request) {
	limit, err := intParam(r, "limit", DefaultLinkedLimit)
	if err != nil {
		writeError(w, http.StatusBadRequest, "limit: "+err.Error())
		return
	}
	if limit == 0 {
		limit = DefaultLinkedLimit
	}
	id := r.PathValue("id")
	spans, total, ok := h.store.LinkedFrom(id, limit)
	if !ok {
		writeError(w, http.StatusBadRequest, "malformed trace id "+strconv.Quote(id))
		return
	}
	writeJSON(w, http.StatusOK, jaeger.Response[[]LinkedSpan]{Data: spans, Total: total, Limit: limit})
}

var errBadInt = errors.New("not a non-negative integer")

func intParam(r *http.Request, name string, def int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, errBadInt
	}
	return n, nil
}

func (h *queryHandler) requests(w http.ResponseWriter, r *http.Request) {
	limit, err := intParam(r, "limit", DefaultRequestsLimit)
	if err != nil {
		writeError(w, http.StatusBadRequest, "limit: "+err.Error())
		return
	}
	offset, err := intParam(r, "offset", 0)
	if err != nil {
		writeError(w, http.StatusBadRequest, "offset: "+err.Error())
		return
	}
	if id := r.URL.Query().Get("traceID"); id != "" {
		rows := []RequestSummary{}
		if row, ok := h.store.Request(id); ok {
			rows = append(rows, row)
		}
		writeJSON(w, http.StatusOK, jaeger.Response[[]RequestSummary]{Data: rows, Total: len(rows)})
		return
	}
	rows, total := h.store.Requests(limit, offset)
	writeJSON(w, http.StatusOK, jaeger.Response[[]RequestSummary]{Data: rows, Total: total, Limit: limit, Offset: offset})
}

func (h *queryHandler) stats(w http.ResponseWriter, _ *http.Request) {
	st := QueryStats{Store: h.store.Stats()}
	if h.recv != nil {
		rs := h.recv.Stats()
		st.Receiver = &rs
	}
	writeJSON(w, http.StatusOK, jaeger.Response[QueryStats]{Data: st, Total: 1})
}
