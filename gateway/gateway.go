package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/modelfile"
	"github.com/cacheblend/cacheblend/telemetry"
)

// Scope is the instrumentation scope of the gateway's spans.
const Scope = "github.com/cacheblend/cacheblend/gateway"

var _ component.Lifecycle = (*Gateway)(nil)

// Gateway is cb-gateway: an OpenAI-compatible front that routes each request to one of its
// engines. Create it with [New], then Start; stop it with Shutdown (component.Lifecycle). All
// methods are safe for concurrent use.
type Gateway struct {
	cfg        Config
	policy     Policy
	policyName string          // the metrics' policy label
	file       *modelfile.File // the engines' model file (nil: the built-in model)
	pool       *pool
	decode     *pool        // the decode engines (least-loaded) with Config.Decode, else nil
	client     *http.Client // forwarding (no timeout: requests are bounded by their context)
	probe      *http.Client // health checks
	metrics    *metrics.GatewayMetrics
	gatherer   prometheus.Gatherer
	spans      *telemetry.Spans
	log        *slog.Logger
	front      *httpfront.Front

	// Set by Start under the front's lock (its prepare), read by Shutdown after the front's.
	stopCheck context.CancelFunc
	checkDone chan struct{}
}

// New builds a gateway from cfg and deps; it does nothing until Start.
func New(cfg Config, deps Deps) (*Gateway, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	deps.Deps = deps.Deps.WithDefaults()
	g := &Gateway{cfg: cfg, log: deps.Logger, policy: deps.Policy, policyName: cfg.Policy, file: deps.ModelFile}
	if g.policy == nil {
		g.policy = newPolicy(cfg.Policy, cfg.Alpha, cfg.SpreadMargin)
	} else if slices.Contains(Policies(), g.policy.Name()) {
		g.policyName = g.policy.Name()
	}
	gath := deps.Gatherer
	if gath == nil {
		gr, ok := deps.Registerer.(prometheus.Gatherer)
		if !ok {
			return nil, errors.New("gateway: Deps.Gatherer is required when Deps.Registerer is not a Gatherer")
		}
		gath = gr
	}
	m, err := metrics.NewGatewayMetrics(deps.Registerer, metrics.WithOnRefused(func(err error) {
		g.log.Warn("metrics record refused", "error", err.Error())
	}))
	if err != nil {
		return nil, fmt.Errorf("gateway: register metrics: %w", err)
	}
	g.metrics, g.gatherer = m, gath
	g.spans = deps.Spans(Scope)
	tr := deps.Transport
	if tr == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 256
		t.ResponseHeaderTimeout = 0 // a non-streamed generation answers at its end (IdleTimeout bounds it)
		t.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAliveConfig: tcpKeepAlive()}).DialContext
		tr = t
	}
	g.client = &http.Client{Transport: tr, CheckRedirect: noRedirect}
	g.probe = &http.Client{Transport: tr, CheckRedirect: noRedirect, Timeout: cfg.ProbeTimeout}
	stall := max(time.Duration(cfg.HealthFailures)*cfg.HealthInterval, cfg.ProbeTimeout)
	g.pool = &pool{policy: g.policy, maxInFlight: cfg.MaxInFlight, maxQueue: cfg.MaxQueue, onQueue: m.SetQueueWaiting,
		failures: cfg.HealthFailures, stall: stall}
	for i, u := range cfg.Engines {
		g.pool.engines = append(g.pool.engines, newUpstream(i, u, newReuseIndex(cfg.Model, cfg.ChunkSize, cfg.IndexBytes, cfg.IndexSequences)))
	}
	if len(cfg.Decode) > 0 {
		// Decode engines: the least loaded healthy one; nothing is registered in their
		// (empty) reuse indexes, the prompt's reuse happens on the prefill engine.
		g.decode = &pool{policy: leastLoaded{}, maxInFlight: cfg.MaxInFlight, maxQueue: cfg.MaxQueue,
			failures: cfg.HealthFailures, stall: stall}
		for i, u := range cfg.Decode {
			g.decode.engines = append(g.decode.engines, newUpstream(i, u, newReuseIndex(cfg.Model, cfg.ChunkSize, 0, 1)))
		}
	}
	g.front = g.newFront()
	return g, nil
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// dialTimeout bounds a connection to an engine; tcpKeepAlive probes an idle connection after
// 5 s, every 2 s, and gives up after 5 unanswered probes: a connection to a host that stopped
// answering (link down, host gone) fails in about 15 s even while the engine's answer is
// legitimately silent (a long prefill), which IdleTimeout alone could not tell apart.
const dialTimeout = 5 * time.Second

func tcpKeepAlive() net.KeepAliveConfig {
	return net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 5}
}

// Handler returns the gateway's HTTP routes. Requests get 503 until Start has checked the
// engines' health.
func (g *Gateway) Handler() http.Handler { return g.front.Handler() }

// Metrics returns the gateway's metrics facade.
func (g *Gateway) Metrics() *metrics.GatewayMetrics { return g.metrics }

// Start checks every engine's health once (bounded by Config.HealthInterval), starts the
// health checks and listens on Config.Addr, serving in the background until Shutdown.
func (g *Gateway) Start(ctx context.Context) error {
	err := g.front.Start(ctx, func(ctx context.Context) error {
		g.checkAll(ctx)
		cctx, cancel := context.WithCancel(context.Background())
		g.stopCheck, g.checkDone = cancel, make(chan struct{})
		go g.healthLoop(cctx, g.checkDone)
		return nil
	})
	if err != nil {
		return err
	}
	up := 0
	for _, s := range g.pool.snapshot() {
		if s.up {
			up++
		}
	}
	g.log.Info("cb-gateway listening", "addr", g.front.Addr(), "policy", g.policy.Name(),
		"engines", len(g.cfg.Engines), "engines_up", up, "max_conns", g.front.Stats().MaxConns)
	return nil
}

// Addr returns the bound listen address once started ("" before).
func (g *Gateway) Addr() string { return g.front.Addr() }

// Engines returns the engines' base URLs, in the order of Config.Engines (with prefill/decode
// routing: the prefill engines).
func (g *Gateway) Engines() []string { return slices.Clone(g.cfg.Engines) }

// DecodeEngines returns the decode engines' base URLs (Config.Decode), nil without
// prefill/decode routing.
func (g *Gateway) DecodeEngines() []string { return slices.Clone(g.cfg.Decode) }

// pools returns the engine pools: the (prefill) engines, and the decode engines if any.
func (g *Gateway) pools() []*pool {
	if g.decode != nil {
		return []*pool{g.pool, g.decode}
	}
	return []*pool{g.pool}
}

// Shutdown stops accepting connections, fails the requests waiting in the queue (503), lets the
// requests in flight finish until ctx ends, then closes the connections and stops the health
// checks. It returns ctx's error when it had to cut requests short. Later calls return nil.
func (g *Gateway) Shutdown(ctx context.Context) error {
	first, err := g.front.Shutdown(ctx, func() {
		for _, p := range g.pools() {
			p.close()
		}
	})
	if !first {
		return nil
	}
	if g.stopCheck != nil {
		g.stopCheck()
		<-g.checkDone
	}
	g.client.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("gateway: shutdown: %w", err)
	}
	return nil
}

// healthLoop checks every engine each HealthInterval until ctx ends.
func (g *Gateway) healthLoop(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(g.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.checkAll(ctx)
		}
	}
}

// checkAll checks every engine concurrently and waits for the checks.
func (g *Gateway) checkAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range g.pools() {
		for _, u := range p.engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g.check(ctx, p, u)
			}()
		}
	}
	wg.Wait()
	g.refreshEngineMetrics()
}

// check runs one health check of u: GET /health must answer 200 within Config.ProbeTimeout
// (Config.HealthFailures failures in a row take it out of routing); GET /metrics gives its
// load gauges (a failure there keeps the engine up with its last gauges).
func (g *Gateway) check(ctx context.Context, p *pool, u *upstream) {
	mark := p.placedMark(u)
	ok, reason := g.probeHealth(ctx, u)
	var gauges *engineGauges
	if ok {
		if gg, err := g.probeMetrics(ctx, u); err == nil {
			gauges = &gg
		}
	}
	g.metrics.HealthCheck(u.name, ok)
	if p.setHealth(u, ok, true, reason, gauges, mark) {
		if ok {
			g.log.Info("engine up", "engine", u.name)
		} else {
			g.log.Warn("engine down", "engine", u.name, "reason", reason)
		}
	}
}

func (g *Gateway) probeHealth(ctx context.Context, u *upstream) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.url+"/health", nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := g.probe.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	_, _ = drain(resp.Body, 64<<10)
	if resp.StatusCode != http.StatusOK {
		return false, "health " + resp.Status
	}
	return true, ""
}

func (g *Gateway) probeMetrics(ctx context.Context, u *upstream) (engineGauges, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.url+"/metrics", nil)
	if err != nil {
		return engineGauges{}, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := g.probe.Do(req)
	if err != nil {
		return engineGauges{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = drain(resp.Body, 64<<10)
		return engineGauges{}, fmt.Errorf("gateway: %s/metrics: %s", u.url, resp.Status)
	}
	gg, err := parseEngineGauges(resp.Body)
	_, _ = drain(resp.Body, maxMetricsBytes)
	return gg, err
}

// refreshEngineMetrics sets the per-engine gauges.
func (g *Gateway) refreshEngineMetrics() {
	for _, p := range g.pools() {
		for i, s := range p.snapshot() {
			u := p.engines[i]
			seqs, bytes := u.index.Stats()
			g.metrics.SetEngine(u.name, metrics.GatewayEngineStats{Up: s.up, InFlight: s.inFlight, Load: s.load,
				IndexSequences: seqs, IndexBytes: bytes})
		}
	}
}

// markDown takes u, an engine of pool p, out of routing after a failed attempt, until a
// health check passes.
func (g *Gateway) markDown(p *pool, u *upstream, reason string) {
	if p.setHealth(u, false, false, reason, nil, 0) {
		g.log.Warn("engine down", "engine", u.name, "reason", reason)
	}
}
