package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/scheduler"
	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/httpserve"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/modelfile"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/tokenizer"
)

// Scope is the instrumentation scope of the engine's spans.
const Scope = "github.com/cacheblend/cacheblend/engine"

var _ component.Lifecycle = (*Engine)(nil)

// Engine is cb-engine. Create it with [New], then Start; stop it with
// Shutdown (the lifecycle of component.Lifecycle). All methods are safe for
// concurrent use.
type Engine struct {
	cfg      Config
	sched    *scheduler.Scheduler
	metrics  *metrics.EngineMetrics
	gatherer prometheus.Gatherer
	spans    *telemetry.Spans
	log      *slog.Logger
	tok      Tokenizer
	file     *modelfile.File // the model file (nil: the built-in model)
	front    *httpfront.Front
	worker   cbv1.WorkerServiceClient // the worker: steps (through the scheduler) and KV pulls
	blend    cbv1.BlendServiceClient  // nil without a blend server: asked for stored documents' fleet state
	client   *http.Client             // calls to decode engines (no redirects followed)
	sec      *metrics.HandoffSecurityMetrics
	allowed  map[string]bool // Config.DecodeEngines, normalized
	peerMu   sync.Mutex
	peers    map[string]int // hand-overs in flight per decode engine (at most Config.MaxHandoffsPerPeer)
	created  int64
	drain    drainMeter // the queue's drain rate, for Retry-After
}

// New builds an engine from cfg and deps; it does nothing until Start.
func New(cfg Config, deps Deps) (*Engine, error) {
	if deps.Worker == nil {
		return nil, errors.New("engine: a worker client is required")
	}
	if f := deps.ModelFile; f != nil {
		if cfg.Model == "" {
			cfg.Model = f.Name
		}
		cfg.ModelIdentity, cfg.ModelFileName = f.Identity, f.Name
		if deps.Tokenizer == nil {
			deps.Tokenizer = f.Vocab
		}
	}
	cfg = cfg.withDefaults()
	switch cfg.Role {
	case RoleBoth, RoleDecode:
	case RolePrefill:
		if err := api.ValidHostPort(cfg.WorkerAdvertise); err != nil {
			return nil, fmt.Errorf("engine: role prefill needs the worker's address for the decode workers (WorkerAdvertise): %w", err)
		}
	default:
		return nil, fmt.Errorf("engine: role %q, want %s, %s or %s", cfg.Role, RoleBoth, RolePrefill, RoleDecode)
	}
	if cfg.Role != RoleBoth && len(cfg.StackKey) < api.MinStackKeyBytes {
		return nil, fmt.Errorf("engine: role %s needs the stack key (StackKey, at least %d bytes; cb engine --stack-key-file or CB_STACK_KEY): it authenticates hand-overs", cfg.Role, api.MinStackKeyBytes)
	}
	allowed := map[string]bool{}
	for _, u := range cfg.DecodeEngines {
		n, err := api.ParseDecodeEngine(u)
		if err != nil {
			return nil, fmt.Errorf("engine: decode engine allow-list: %w", err)
		}
		allowed[n] = true
	}
	deps.Deps = deps.Deps.WithDefaults()
	e := &Engine{cfg: cfg, tok: deps.Tokenizer, file: deps.ModelFile, log: deps.Logger, created: time.Now().Unix(), worker: deps.Worker, blend: deps.Blend,
		allowed: allowed, peers: map[string]int{}}
	e.client = noRedirects(deps.HTTPClient, cfg.HandoffConnectTimeout)
	if e.tok == nil {
		e.tok = tokenizer.Tokenizer{}
	}
	gath := deps.Gatherer
	if gath == nil {
		g, ok := deps.Registerer.(prometheus.Gatherer)
		if !ok {
			return nil, errors.New("engine: Deps.Gatherer is required when Deps.Registerer is not a Gatherer")
		}
		gath = g
	}
	m, err := metrics.NewEngineMetrics(deps.Registerer, metrics.WithOnRefused(func(err error) {
		e.log.Warn("metrics record refused", "error", err.Error())
	}))
	if err != nil {
		return nil, fmt.Errorf("engine: register metrics: %w", err)
	}
	e.metrics, e.gatherer = m, gath
	if e.sec, err = metrics.NewHandoffSecurityMetrics(deps.Registerer, metrics.WithOnRefused(func(err error) {
		e.log.Warn("metrics record refused", "error", err.Error())
	})); err != nil {
		return nil, fmt.Errorf("engine: register metrics: %w", err)
	}
	e.spans = deps.Spans(Scope)
	e.sched, err = scheduler.New(cfg.Config, scheduler.Deps{
		Worker: deps.Worker,
		Blend:  deps.Blend,
		Spans:  e.spans,
		Logger: e.log,
		OnFallback: func(reason string) {
			m.LookupFallback(reason)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e.front = e.newFront()
	return e, nil
}

// Handler returns the engine's HTTP routes. Generation requests get 503
// until Start has started the scheduler and the worker answered. The HTTP
// limits of Config (timeouts, connection cap) belong to the server Start
// runs; a caller mounting Handler elsewhere brings its own.
func (e *Engine) Handler() http.Handler { return e.front.Handler() }

// Metrics returns the engine's metrics facade.
func (e *Engine) Metrics() *metrics.EngineMetrics { return e.metrics }

// Stats returns the scheduler's statistics in the metrics facade's shape.
func (e *Engine) Stats() metrics.EngineStats {
	s := e.sched.Stats()
	return metrics.EngineStats{
		Waiting: s.Waiting, Running: s.Running,
		KVFree: s.KVFree, KVUsed: s.KVUsed, KVCached: s.KVCached, KVTotal: s.KVTotal,
		Evictions: s.Evictions, Preemptions: s.Preemptions,
		BatchTokens: s.BatchTokens, PrefixHitRatio: s.PrefixHitRatio,
	}
}

// SchedulerStats returns the scheduler's full statistics.
func (e *Engine) SchedulerStats() scheduler.Stats { return e.sched.Stats() }

// refreshMetrics feeds the engine gauges before a /metrics render.
func (e *Engine) refreshMetrics() {
	e.metrics.SetEngine(e.Stats())
}

// Start starts the scheduler and listens on Config.Addr, serving in the
// background until Shutdown, within the HTTP limits of Config
// (ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout,
// MaxHeaderBytes, MaxConns; see ConnStats).
func (e *Engine) Start(ctx context.Context) error {
	if err := e.front.Start(ctx, e.sched.Start); err != nil {
		return err
	}
	e.log.Info("cb-engine listening", "addr", e.front.Addr(), "model", e.cfg.Model, "max_conns", e.front.Stats().MaxConns)
	return nil
}

// ConnStats returns the API server's connection counters (zero before
// Start): connections held, admitted, evicted and refused at the cap.
func (e *Engine) ConnStats() httpserve.Stats { return e.front.Stats() }

// Addr returns the bound listen address once started ("" before).
func (e *Engine) Addr() string { return e.front.Addr() }

// Shutdown stops accepting connections and requests, lets the requests in
// flight finish until ctx ends, then fails the rest (503) and closes the
// connections, and stops the step loop. It returns ctx's error when it had
// to cut requests short. Later calls return nil.
func (e *Engine) Shutdown(ctx context.Context) error {
	var schedErr error
	first, srvErr := e.front.Shutdown(ctx, func() {
		schedErr = e.sched.Shutdown(ctx) // refuses new requests at once; aborts at ctx's end
	})
	switch {
	case !first:
		return nil
	case srvErr != nil:
		return fmt.Errorf("engine: shutdown: %w", srvErr)
	case schedErr != nil:
		return fmt.Errorf("engine: shutdown: %w", schedErr)
	}
	return nil
}

// Role returns the engine's role: RoleBoth, RolePrefill or RoleDecode.
func (e *Engine) Role() string { return e.cfg.Role }

// Model is the name the engine serves its model under (Config.Model after
// defaults: the model file's name when it has one).
func (e *Engine) Model() string { return e.cfg.Model }

// defaultHTTPClient is the client of a prefill engine's calls to decode
// engines: connect within connect (Config.HandoffConnectTimeout), keep-alive connections with TCP keep-alive
// probes after 5 s idle, every 2 s, 5 unanswered: dead after about 15 s; no
// overall timeout (the request's deadline and the idle timeout bound a
// call).
func defaultHTTPClient(connect time.Duration) *http.Client {
	ka := net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 5}
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: connect, KeepAliveConfig: ka}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// errRedirect refuses a decode engine's redirect: a hand-over goes to the
// URL the gateway named and allowed, nowhere else.
var errRedirect = errors.New("the decode engine answered with a redirect, which a hand-over does not follow")

// noRedirects returns a copy of c (nil: defaultHTTPClient(connect)) that
// follows no redirect.
func noRedirects(c *http.Client, connect time.Duration) *http.Client {
	if c == nil {
		c = defaultHTTPClient(connect)
	}
	cc := *c
	cc.CheckRedirect = func(*http.Request, []*http.Request) error { return errRedirect }
	return &cc
}

// newID returns prefix followed by 24 random hex digits.
func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
