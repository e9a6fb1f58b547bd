package httpfront

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/httpserve"
)

// Config holds a front's settings, read once by [New].
type Config struct {
	// Component names the component in errors ("engine: listen on …").
	Component string
	// Addr is the listen address.
	Addr string
	// Settings are the API key, body bound and server limits; zero fields take their
	// defaults. RequestTimeout is the component's to apply.
	Settings
	// Logger receives the server's errors; nil: slog.Default().
	Logger *slog.Logger
}

// Handlers are the routes of the OpenAI-compatible API a front serves. Every field is
// required.
type Handlers struct {
	// Generate serves POST /v1/chat/completions (operation api.OperationChat) and
	// /v1/completions (api.OperationTextCompletion).
	Generate func(w *StatusWriter, r *http.Request, operation, route string, t0 time.Time)
	// Documents serves POST /v1/documents, Models GET /v1/models and /v1/models/{model},
	// Health GET /health.
	Documents, Models, Health HandlerFunc
	// Metrics serves GET /metrics.
	Metrics http.Handler
	// Record is called after every request with its method, route template (RouteUnmatched
	// for an unknown path), status and duration: the HTTP server duration metric.
	Record func(method, route string, status int, seconds float64)
}

// Front is the HTTP front the engine and the gateway share: the routes with their OpenAI-shaped
// 404/405 errors and HTTP metric, the API key, the bounded body read, and the server's
// lifecycle (Start, Addr, Shutdown). Safe for concurrent use.
type Front struct {
	cfg     Config
	handler http.Handler

	mu       sync.Mutex
	srv      *httpserve.Server
	lis      net.Listener
	started  bool
	shutdown bool
	done     chan struct{} // closed when Serve returned
}

// New returns a front serving h with cfg; it listens from Start.
func New(cfg Config, h Handlers) *Front {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Settings = cfg.Settings.WithDefaults()
	generate := func(op string) HandlerFunc {
		return func(w *StatusWriter, r *http.Request, route string, t0 time.Time) { h.Generate(w, r, op, route, t0) }
	}
	table := map[string]route{
		api.RouteChat:        {Method: http.MethodPost, Handler: generate(api.OperationChat)},
		api.RouteCompletions: {Method: http.MethodPost, Handler: generate(api.OperationTextCompletion)},
		api.RouteDocuments:   {Method: http.MethodPost, Handler: h.Documents},
		api.RouteModels:      {Method: http.MethodGet, Handler: h.Models},
		api.RouteModel:       {Method: http.MethodGet, Handler: h.Models},
		api.RouteHealth:      {Method: http.MethodGet, Handler: h.Health},
		api.RouteMetrics: {Method: http.MethodGet, Handler: func(w *StatusWriter, r *http.Request, _ string, _ time.Time) {
			h.Metrics.ServeHTTP(w, r)
		}},
	}
	return &Front{cfg: cfg, handler: routes(table, cfg.WriteTimeout, h.Record)}
}

// Handler returns the routes (without the server's limits).
func (f *Front) Handler() http.Handler { return f.handler }

// Authorize checks the API key of a request: nil, or the OpenAI-shaped 401.
func (f *Front) Authorize(r *http.Request) *api.Error { return authorize(r, f.cfg.APIKey) }

// ReadRequest authorizes a request (401), checks that its body is declared JSON (415) and
// reads it within MaxBodyBytes (413) and the read timeout (408); a connection closed under
// the read is a 499, not sent.
func (f *Front) ReadRequest(w http.ResponseWriter, r *http.Request) ([]byte, *api.Error) {
	if apiErr := f.Authorize(r); apiErr != nil {
		return nil, apiErr
	}
	if apiErr := checkJSON(r); apiErr != nil {
		return nil, apiErr
	}
	return readBody(w, r, f.cfg.MaxBodyBytes, f.cfg.ReadTimeout)
}

// Start listens on Config.Addr, runs prepare (nil: nothing) with the listener bound and then
// serves in the background until Shutdown. A prepare error closes the listener and is
// returned wrapped. Start fails when called twice or after Shutdown.
func (f *Front) Start(ctx context.Context, prepare func(context.Context) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started || f.shutdown {
		return fmt.Errorf("%s: Start called twice or after Shutdown", f.cfg.Component)
	}
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", f.cfg.Addr)
	if err != nil {
		return fmt.Errorf("%s: listen on %s: %w", f.cfg.Component, f.cfg.Addr, err)
	}
	if prepare != nil {
		if err := prepare(ctx); err != nil {
			_ = lis.Close()
			return fmt.Errorf("%s: %w", f.cfg.Component, err)
		}
	}
	f.started, f.lis = true, lis
	f.srv = httpserve.New("api", f.handler, f.cfg.Limits, f.cfg.Logger)
	f.done = make(chan struct{})
	srv, done, log := f.srv, f.done, f.cfg.Logger
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "error", err.Error())
		}
	}()
	return nil
}

// Addr returns the bound listen address once started ("" before).
func (f *Front) Addr() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lis == nil {
		return ""
	}
	return f.lis.Addr().String()
}

// Stats returns the server's connection counters (zero before Start).
func (f *Front) Stats() httpserve.Stats {
	f.mu.Lock()
	srv := f.srv
	f.mu.Unlock()
	if srv == nil {
		return httpserve.Stats{}
	}
	return srv.Stats()
}

// ShuttingDown reports whether Shutdown was called.
func (f *Front) ShuttingDown() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.shutdown
}

// Shutdown stops accepting connections and runs alongside (nil: nothing; the component's own
// shutdown) while the requests in flight finish until ctx ends; then it closes the remaining
// connections and waits for the server to stop. It returns false when Shutdown was called
// before (doing nothing), and the server's error (ctx's when it cut requests short).
func (f *Front) Shutdown(ctx context.Context, alongside func()) (bool, error) {
	f.mu.Lock()
	if f.shutdown {
		f.mu.Unlock()
		return false, nil
	}
	f.shutdown = true
	srv, done := f.srv, f.done
	f.mu.Unlock()
	var wg sync.WaitGroup
	var err error
	if srv != nil {
		wg.Go(func() { err = srv.Shutdown(ctx) })
	}
	if alongside != nil {
		alongside()
	}
	wg.Wait()
	if srv != nil {
		if err != nil {
			_ = srv.Close()
		}
		<-done
	}
	return true, err
}

// WriteJSON writes v as a JSON body with status (a 500 when v does not encode).
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		api.Internal(fmt.Sprintf("encode response: %v", err)).Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
