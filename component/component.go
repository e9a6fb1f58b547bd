// Package component is the one shape of the stack's long-lived components:
// cb-engine (engine.Engine), cb-worker (worker.Worker), the blend server
// (blend.Server) and the embedded trace collector (tracestore.Collector).
// Each is built and run the same way:
//
//	c, err := pkg.New(cfg, deps) // validate, allocate, register metrics; nothing runs
//	err = c.Start(ctx)           // bind the listeners, serve in the background; returns once ready
//	addr := c.Addr()             // (or OTLPAddr/QueryAddr) the bound address, e.g. of "127.0.0.1:0"
//	err = c.Shutdown(ctx)        // stop gracefully, cut short when ctx ends
//
// cfg is the package's Config (a plain value; every zero field takes its
// documented default). deps is a [Deps], the process-wide collaborators,
// either directly (blend, tracestore) or embedded in the package's own Deps
// next to its peers, the gRPC clients of the other processes (engine: the
// worker and the blend server; worker: the blend server). Peers are dialled
// by the caller (cmd/cb), which also closes them after Shutdown.
//
// The lifecycle, modelled on net/http.Server and grpc.Server, is described by
// [Lifecycle]. Package service turns a process's runtime (tracer provider,
// registry, logger, span profile) into a [Deps] (service.Runtime.Deps).
//
// This package depends on the OpenTelemetry and Prometheus client APIs, on
// gRPC's server option type and on package telemetry only, never on an SDK
// or exporter, so every component may import it.
package component

import (
	"context"
	"io"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"

	"github.com/cacheblend/cacheblend/telemetry"
)

// Lifecycle is the run-time contract every component implements:
//
//   - Start binds the component's listeners and starts its goroutines, then
//     returns: serving goes on in the background until Shutdown (there is no
//     blocking Serve; a caller that wants to block waits for a signal, as
//     cmd/cb does, then calls Shutdown). ctx bounds the start-up only and is
//     not retained. When Start fails nothing is left listening or running.
//     Starting twice, or after Shutdown, is an error.
//   - Shutdown stops accepting work, lets the work in flight finish until ctx
//     ends, then cuts the rest short and releases every resource (listeners,
//     goroutines, files, shared memory). It returns an error wrapping ctx's
//     error when it had to cut work short. It may be called before Start (it
//     releases what New allocated) and more than once (later calls return
//     nil).
//
// Implementations are safe for concurrent use.
type Lifecycle interface {
	Start(ctx context.Context) error
	Shutdown(ctx context.Context) error
}

// Deps are the process-wide collaborators of a component. The zero value is
// valid: every nil field takes the default [Deps.WithDefaults] documents.
// A Deps is a plain value, copied freely; what its fields hold must be safe
// for concurrent use (tracer providers, registries and slog loggers are; an
// io.Writer given as Profile is serialized by the component's span helper).
type Deps struct {
	// TracerProvider records the component's spans and the trace ids of its
	// log lines. Default: a no-op provider (no spans). Head sampling is its
	// sampler's.
	TracerProvider trace.TracerProvider
	// Registerer receives the component's instruments
	// (contract/instruments.yaml). Default: a fresh private registry.
	Registerer prometheus.Registerer
	// Logger receives the component's log lines. Default: a logger that
	// discards them.
	Logger *slog.Logger
	// Profile, when set, receives one JSONL line per span of the component's
	// span helper (CB_PROFILE; see telemetry.Spans). A nil
	// *telemetry.ProfileSink, which telemetry/provider's
	// Provider.ProfileWriter returns when profiling is off, counts as unset.
	// Default: none.
	Profile io.Writer
	// GRPCServerOptions are added to the options of the component's gRPC
	// server (rpc.NewServer; the worker's and the blend server's, the other
	// components serve none): cmd/cb passes the mutual-TLS credentials and
	// the caller-role check here (rpc/mtls, Identity.ServerOptions).
	// Default: none, a plaintext server that admits every caller.
	GRPCServerOptions []grpc.ServerOption
}

// WithDefaults returns d with every unset field replaced by its default: a
// no-op tracer provider, a new private *prometheus.Registry (also a
// Gatherer; each call makes a new one), a logger that discards, and no
// profile (a nil interface, also when Profile held a nil *ProfileSink).
// Components call it once, in New.
func (d Deps) WithDefaults() Deps {
	if d.TracerProvider == nil {
		d.TracerProvider = noop.NewTracerProvider()
	}
	if d.Registerer == nil {
		d.Registerer = prometheus.NewRegistry()
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	d.Profile = d.profile()
	return d
}

// Spans returns a span helper for the instrumentation scope over d's tracer
// provider and profile, defaults applied.
func (d Deps) Spans(scope string) *telemetry.Spans {
	return telemetry.NewSpans(d.TracerProvider, scope, d.profile())
}

// profile is Profile with a nil *telemetry.ProfileSink turned into a nil
// interface, so that "no profile" has one representation.
func (d Deps) profile() io.Writer {
	if ps, ok := d.Profile.(*telemetry.ProfileSink); ok && ps == nil {
		return nil
	}
	return d.Profile
}
