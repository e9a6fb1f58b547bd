package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/httpserve"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/telemetry/provider"
)

// Version is the build version stamped on service.version and cb_build_info.
var Version = "0.1.0"

// Options configure a Runtime. The zero value of every field but ServiceName
// is valid.
type Options struct {
	// ServiceName is cb-engine, cb-worker, cb-blend, cb-traces or cb-gateway.
	ServiceName string
	// InstanceID is the resource's service.instance.id unless
	// OTEL_RESOURCE_ATTRIBUTES sets one; empty: a random UUID. The cb
	// processes pass [InstanceID] of their main listen address (unique per
	// host), so the trace page tells the processes of one service on
	// several nodes (or the prefill and the decode engine) apart.
	InstanceID string
	// OTLPEndpoint overrides OTEL_EXPORTER_OTLP_TRACES_ENDPOINT when non-empty
	// (the --otlp-traces-endpoint flag). A bare host:port or a URL without a
	// path gets /v1/traces appended for the HTTP protocols.
	OTLPEndpoint string
	// Getenv reads the environment; default os.Getenv.
	Getenv func(string) string
	// LogOutput receives the JSON log lines; default os.Stderr.
	LogOutput io.Writer
	// LogLevel is the minimum level logged; default Info.
	LogLevel slog.Level
	// IDGenerator, when set, replaces the SDK's random trace/span ids (the
	// blend server's option-B roots need deterministic trace ids).
	IDGenerator sdktrace.IDGenerator
	// ExtraTelemetry are more options of the telemetry provider (tests add
	// exporters).
	ExtraTelemetry []provider.Option
	// HTTP bounds each HTTP server the runtime serves (Serve, ServeMetrics);
	// zero fields take the defaults of package httpserve (header timeout
	// 10 s, request read 30 s, write 30 s, idle 60 s, 64 KiB of headers)
	// and DefaultMaxConns.
	HTTP httpserve.Limits
}

// DefaultMaxConns caps the connections of each HTTP server of a Runtime
// (/metrics and /health are scraped by a few clients).
const DefaultMaxConns = 256

// HealthCheck reports a component's health for /health: nil when healthy,
// else an error whose text is the reason.
type HealthCheck func() error

// Runtime holds the process-wide telemetry, metrics registry and logger.
// It is safe for concurrent use; call Shutdown once at exit.
type Runtime struct {
	Name      string
	Telemetry *provider.Provider
	Registry  *prometheus.Registry
	Logger    *slog.Logger
	Process   *metrics.ProcessMetrics

	httpLimits httpserve.Limits

	mu      sync.Mutex
	servers []*httpserve.Server
	checks  []namedCheck
	details []namedDetail
	// gatherers are served next to Registry (AddGatherer).
	gatherers prometheus.Gatherers
	shutdown  bool
}

type namedCheck struct {
	name  string
	check HealthCheck
}

// New builds a Runtime: telemetry from the environment with opts' overrides,
// a fresh Prometheus registry with Go/process collectors and the contract's
// process instruments, and a JSON logger stamping trace ids.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	cfg, err := provider.ConfigFromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("service: %w", err)
	}
	if cfg.ServiceName == "" || getenv("OTEL_SERVICE_NAME") == "" {
		cfg.ServiceName = opts.ServiceName
	}
	if cfg.ServiceVersion == "" {
		cfg.ServiceVersion = Version
	}
	if cfg.InstanceID == "" && !hasAttr(cfg.ResourceAttributes, "service.instance.id") {
		cfg.InstanceID = opts.InstanceID
	}
	if opts.OTLPEndpoint != "" {
		ep, err := NormalizeEndpoint(opts.OTLPEndpoint, cfg.Protocol)
		if err != nil {
			return nil, fmt.Errorf("service: --otlp-traces-endpoint: %w", err)
		}
		cfg.Endpoint = ep
	}
	topts := append([]provider.Option(nil), opts.ExtraTelemetry...)
	if opts.IDGenerator != nil {
		topts = append(topts, provider.WithIDGenerator(opts.IDGenerator))
	}
	tp, err := provider.New(ctx, cfg, topts...)
	if err != nil {
		return nil, fmt.Errorf("service: telemetry: %w", err)
	}
	out := opts.LogOutput
	if out == nil {
		out = os.Stderr
	}
	logger := slog.New(telemetry.NewLogHandler(out, &slog.HandlerOptions{Level: opts.LogLevel})).With("service", opts.ServiceName)
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pm, err := metrics.NewProcessMetrics(reg, metrics.BuildInfo{Service: opts.ServiceName, Version: Version}, func() metrics.TraceTotals {
		return metrics.TraceTotals{SpansDropped: tp.DroppedSpans(), ExportErrors: tp.ExportErrors()}
	}, metrics.WithOnRefused(func(err error) { logger.Warn("refresh process metrics", "err", err) }))
	if err != nil {
		_ = tp.Shutdown(ctx)
		return nil, fmt.Errorf("service: metrics: %w", err)
	}
	return &Runtime{Name: opts.ServiceName, Telemetry: tp, Registry: reg, Logger: logger, Process: pm,
		httpLimits: opts.HTTP.WithDefaults(httpserve.Limits{MaxConns: DefaultMaxConns})}, nil
}

func hasAttr(attrs []attribute.KeyValue, key attribute.Key) bool {
	for _, kv := range attrs {
		if kv.Key == key {
			return true
		}
	}
	return false
}

// InstanceID returns a process's service.instance.id from its main listen
// address, unique per host by default:
//
//   - a specific, routable address ("10.0.0.2:8001") is its own id: no other
//     host listens there;
//   - an unspecified or empty host (":8001", "0.0.0.0:8001", "[::]:8001") or a
//     loopback one ("127.0.0.1:8001", "localhost:8001", "[::1]:8001"), which
//     every host of a fleet may bind alike, becomes the host name followed by
//     the port and a random 8-hex-digit suffix drawn once per process
//     ("node-a:8001/3f9a1c2e"): host names can repeat too (network
//     namespaces share one), so the suffix keeps two processes apart, as the
//     OpenTelemetry conventions recommend a random id where nothing inherent
//     is unique. A process restarted is a new instance.
//
// A port chosen at listen time (":0") becomes "pid<process id>". "" when
// addr is not host:port. OTEL_RESOURCE_ATTRIBUTES=service.instance.id=…
// overrides it ([New]). Safe for concurrent use.
func InstanceID(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if port == "0" {
		port = fmt.Sprintf("pid%d", os.Getpid())
	}
	ip := net.ParseIP(host)
	shared := host == "" || strings.EqualFold(host, "localhost") || (ip != nil && (ip.IsUnspecified() || ip.IsLoopback()))
	if !shared {
		return net.JoinHostPort(host, port)
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "unknown-host"
	}
	return net.JoinHostPort(h, port) + "/" + instanceSuffix()
}

// instanceSuffix is this process's random instance suffix (8 hex digits,
// crypto/rand), drawn once.
var instanceSuffix = sync.OnceValue(func() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b[:])
})

// Deps returns the runtime's collaborators in the shape every component's
// New takes: the tracer provider, the registry, the logger and the span
// profile sink (nil, a typed nil that component.Deps treats as unset, when
// CB_PROFILE is off). Components then add their peers (engine.Deps,
// worker.Deps).
func (r *Runtime) Deps() component.Deps {
	return component.Deps{
		TracerProvider: r.TracerProvider(),
		Registerer:     r.Registry,
		Logger:         r.Logger,
		Profile:        r.Telemetry.ProfileWriter(),
	}
}

// TracerProvider is the process's tracer provider (a no-op one when tracing
// is off).
func (r *Runtime) TracerProvider() trace.TracerProvider { return r.Telemetry.TracerProvider() }

// Gatherer gathers the registry after refreshing the process instruments
// (dropped spans, export errors), so any /metrics handler built on it, the
// engine's included, serves current totals.
func (r *Runtime) Gatherer() prometheus.Gatherer {
	own := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		r.Process.Refresh()
		return r.Registry.Gather()
	})
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		r.mu.Lock()
		gs := append(prometheus.Gatherers{own}, r.gatherers...)
		r.mu.Unlock()
		return gs.Gather()
	})
}

// AddGatherer adds g to what /metrics serves next to the registry (e.g. the
// series of a tensor-parallel worker's other ranks, gathered by rank 0).
// Families of the same name are merged (prometheus.Gatherers); a gather
// error of g is served with what could be gathered. Safe to call at any
// time.
func (r *Runtime) AddGatherer(g prometheus.Gatherer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gatherers = append(r.gatherers, g)
}

// MetricsHandler serves the registry; before runs before each gather (after
// the process instruments are refreshed).
func (r *Runtime) MetricsHandler(before func()) http.Handler {
	return metrics.Handler(r.Gatherer(), before)
}

// Serve starts an HTTP server for h on addr (127.0.0.1:0 picks a port),
// bounded by Options.HTTP, and returns the bound address. Shutdown stops it.
func (r *Runtime) Serve(addr string, h http.Handler) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("service: listen %s: %w", addr, err)
	}
	return r.ServeOn(ln, h)
}

// ServeOn is Serve on a listener the caller opened (or inherited); the
// server owns ln from then on.
func (r *Runtime) ServeOn(ln net.Listener, h http.Handler) (net.Addr, error) {
	srv := httpserve.New("metrics", h, r.httpLimits, r.Logger)
	r.mu.Lock()
	if r.shutdown {
		r.mu.Unlock()
		ln.Close()
		return nil, errors.New("service: runtime is shut down")
	}
	r.servers = append(r.servers, srv)
	r.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.Logger.Error("http server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return ln.Addr(), nil
}

// AddHealthCheck adds check, named name, to the checks /health runs (e.g.
// the blend server's lookup workers). Safe to call at any time.
func (r *Runtime) AddHealthCheck(name string, check HealthCheck) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks = append(r.checks, namedCheck{name, check})
}

// namedDetail is a line /health shows after its status.
type namedDetail struct {
	name   string
	detail func() string
}

// AddHealthDetail adds a line "name: detail()" that /health shows after
// its status, whether healthy or not (e.g. the worker's blend gate: why
// blending is off). An empty detail shows no line. Safe to call at any
// time.
func (r *Runtime) AddHealthDetail(name string, detail func() string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.details = append(r.details, namedDetail{name, detail})
}

// Health runs the health checks: nil when every one passes, else the
// failures joined, each prefixed by its check's name.
func (r *Runtime) Health() error {
	r.mu.Lock()
	checks := slices.Clone(r.checks)
	r.mu.Unlock()
	var errs []error
	for _, c := range checks {
		if err := c.check(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
		}
	}
	return errors.Join(errs...)
}

// ServeMetrics serves /metrics and /health on addr. /health answers 200
// "ok" when every health check passes (AddHealthCheck), else 503
// "unavailable: " and the reasons, one line.
func (r *Runtime) ServeMetrics(addr string, before func()) (net.Addr, error) {
	return r.Serve(addr, r.metricsMux(before))
}

// ServeMetricsOn is ServeMetrics on a listener the caller opened (or
// inherited: a tensor-parallel rank's, rankgroup.MetricsListener).
func (r *Runtime) ServeMetricsOn(ln net.Listener, before func()) (net.Addr, error) {
	return r.ServeOn(ln, r.metricsMux(before))
}

func (r *Runtime) metricsMux(before func()) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", r.MetricsHandler(before))
	mux.HandleFunc("GET /health", r.serveHealth)
	return mux
}

func (r *Runtime) serveHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	status := "ok\n"
	if err := r.Health(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		status = "unavailable: " + strings.ReplaceAll(err.Error(), "\n", "; ") + "\n"
	}
	io.WriteString(w, status)
	r.mu.Lock()
	details := slices.Clone(r.details)
	r.mu.Unlock()
	for _, d := range details {
		if v := d.detail(); v != "" {
			io.WriteString(w, d.name+": "+strings.ReplaceAll(v, "\n", "; ")+"\n")
		}
	}
}

// Shutdown stops the HTTP servers and flushes and stops telemetry.
func (r *Runtime) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	r.shutdown = true
	servers := r.servers
	r.servers = nil
	r.mu.Unlock()
	var errs []error
	for _, s := range servers {
		if err := s.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.Telemetry.Shutdown(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// NewGoCollector returns the Go runtime collector of every process's
// /metrics, exposable as strict OpenMetrics: the legacy go_memstats_* series
// are off (go_memstats_alloc_bytes, a gauge, and
// go_memstats_alloc_bytes_total, a counter, are one family name in
// OpenMetrics and a strict parser refuses the exposition: client_golang
// issue #829); their runtime/metrics equivalents (go_gc_*, go_memory_*) are
// exposed instead, next to go_goroutines, go_threads, go_gc_duration_seconds
// and go_info.
func NewGoCollector() prometheus.Collector {
	return collectors.NewGoCollector(
		collectors.WithGoCollectorMemStatsMetricsDisabled(),
		collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC, collectors.MetricsMemory),
	)
}
