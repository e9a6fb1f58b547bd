package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/telemetry/provider"
)

// Version is the build version stamped on service.version and cb_build_info.
var Version = "0.1.0"

// Options configure a Runtime. The zero value of every field but ServiceName
// is valid.
type Options struct {
	// ServiceName is cb-engine, cb-worker, cb-blend or cb-traces.
	ServiceName string
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
}

// Runtime holds the process-wide telemetry, metrics registry and logger.
// It is safe for concurrent use; call Shutdown once at exit.
type Runtime struct {
	Name      string
	Telemetry *provider.Provider
	Registry  *prometheus.Registry
	Logger    *slog.Logger
	Process   *metrics.ProcessMetrics

	mu       sync.Mutex
	servers  []*http.Server
	shutdown bool
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
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pm, err := metrics.NewProcessMetrics(reg, metrics.BuildInfo{Service: opts.ServiceName, Version: Version}, func() metrics.TraceTotals {
		return metrics.TraceTotals{SpansDropped: tp.DroppedSpans(), ExportErrors: tp.ExportErrors()}
	}, metrics.WithOnRefused(func(err error) { logger.Warn("refresh process metrics", "err", err) }))
	if err != nil {
		_ = tp.Shutdown(ctx)
		return nil, fmt.Errorf("service: metrics: %w", err)
	}
	return &Runtime{Name: opts.ServiceName, Telemetry: tp, Registry: reg, Logger: logger, Process: pm}, nil
}

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
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		r.Process.Refresh()
		return r.Registry.Gather()
	})
}

// MetricsHandler serves the registry; before runs before each gather (after
// the process instruments are refreshed).
func (r *Runtime) MetricsHandler(before func()) http.Handler {
	return metrics.Handler(r.Gatherer(), before)
}

// Serve starts an HTTP server for h on addr (127.0.0.1:0 picks a port) and
// returns the bound address. Shutdown stops it.
func (r *Runtime) Serve(addr string, h http.Handler) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("service: listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
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

// ServeMetrics serves /metrics (and /health answering 200 "ok") on addr.
func (r *Runtime) ServeMetrics(addr string, before func()) (net.Addr, error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", r.MetricsHandler(before))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	return r.Serve(addr, mux)
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
