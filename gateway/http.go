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
		Generate: func(w *statusWriter, r *http.Request, op, route string, t0 time.Time) {
			w, r = withRetryAfter(w, r)
			g.serveGenerate(w, r, op, route, t0)
		},
		Documents: func(w *statusWriter, r *http.Request, route string, t0 time.Time) {
			w, r = withRetryAfter(w, r)
			g.serveDocuments(w, r, route, t0)
		},
		Models: g.serveModels, Health: g.serveHealth,
		Metrics: metrics.Handler(g.gatherer, g.refreshEngineMetrics), Record: g.metrics.RecordHTTP,
	})
}

// healthBody is the JSON body of GET /health.
type healthBody struct {
	// Status is "ok", "degraded" (prefill/decode routing with no decode engine up: requests
	// are served whole on the prefill engines) or "unavailable".
	Status  string         `json:"status"`
	Reason  string         `json:"reason,omitempty"`
	Policy  string         `json:"policy"`
	Engines []healthEngine `json:"engines"`
	// DecodeEngines are the decode engines' states (prefill/decode routing only).
	DecodeEngines []healthEngine `json:"decode_engines,omitempty"`
}

type healthEngine struct {
	URL    string `json:"url"`
	Up     bool   `json:"up"`
	Reason string `json:"reason,omitempty"`
	// Failures counts the consecutive failed health probes (Config.HealthFailures take the
	// engine out of routing).
	Failures int     `json:"consecutive_failures"`
	InFlight int     `json:"in_flight"`
	Load     float64 `json:"load"`
}

// healthOf lists pool p's engines and counts those up.
func healthOf(p *pool) (list []healthEngine, up int) {
	for i, s := range p.snapshot() {
		list = append(list, healthEngine{URL: p.engines[i].url, Up: s.up, Reason: s.reason, Failures: s.fails, InFlight: s.inFlight, Load: s.load})
		if s.up {
			up++
		}
	}
	return list, up
}

// serveHealth answers 200 "ok" when an engine (with prefill/decode routing: a prefill and a
// decode engine) is up; 200 "degraded" with prefill/decode routing when prefill engines are up
// but no decode engine is (the gateway still answers every request, whole on the prefill
// side, so a load balancer must keep sending traffic: a 503 would turn a slower service into
// an outage; monitoring reads the status); else 503 "unavailable" with the reason and
// Retry-After. The body lists every engine's state, the decode engines' too.
func (g *Gateway) serveHealth(w *statusWriter, _ *http.Request, _ string, _ time.Time) {
	down := g.front.ShuttingDown()
	b := healthBody{Status: "ok", Policy: g.policy.Name()}
	var up, dup int
	b.Engines, up = healthOf(g.pool)
	if g.decode != nil {
		b.DecodeEngines, dup = healthOf(g.decode)
	}
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case down:
		b.Status, b.Reason = "unavailable", "shutting down"
	case up == 0 && g.decode != nil:
		b.Status, b.Reason = "unavailable", "no prefill engine is up"
	case up == 0:
		b.Status, b.Reason = "unavailable", "no engine is up"
	case g.decode != nil && dup == 0:
		b.Status, b.Reason = "degraded", "no decode engine is up: requests are served whole on the prefill engines"
		httpfront.WriteJSON(w, http.StatusOK, b)
		return
	default:
		httpfront.WriteJSON(w, http.StatusOK, b)
		return
	}
	w.Header().Set("Retry-After", retryAfter(g.cfg.HealthInterval))
	httpfront.WriteJSON(w, http.StatusServiceUnavailable, b)
}

// withRetryAfter gives a routed request its retry ticket (the pool reads whether it is an
// SDK's retry and, refusing it for a full queue, leaves the wait it expects) and makes the
// 429 of such a refusal carry that wait as Retry-After and Retry-After-Ms, whatever the
// handler set.
func withRetryAfter(w *statusWriter, r *http.Request) (*statusWriter, *http.Request) {
	tk := newTicket(r.Header)
	w.ResponseWriter = &retryAfterWriter{ResponseWriter: w.ResponseWriter, tk: tk}
	return w, r.WithContext(withTicket(r.Context(), tk))
}

// retryAfterWriter sets the ticket's Retry-After on a 429 written after the pool refused the
// request.
type retryAfterWriter struct {
	http.ResponseWriter
	tk *retryTicket
}

// WriteHeader implements http.ResponseWriter.
func (w *retryAfterWriter) WriteHeader(code int) {
	if code == http.StatusTooManyRequests && w.tk.wait > 0 {
		retryAfterHeaders(w.Header(), w.tk.wait)
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *retryAfterWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
