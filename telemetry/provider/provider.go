package provider

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/telemetry/internal/randid"
)

// shutdownGrace bounds how long Shutdown waits, after its context expired,
// for the export goroutines to stop once their exports were cancelled.
const shutdownGrace = 5 * time.Second

// Option configures [New].
type Option func(*options)

type options struct {
	processors []sdktrace.SpanProcessor
	exporters  []sdktrace.SpanExporter
	idGen      sdktrace.IDGenerator
	profile    io.Writer
}

// WithSpanProcessor registers sp with the tracer provider as-is (for
// example a tracetest.SpanRecorder). It is used only when tracing is on.
func WithSpanProcessor(sp sdktrace.SpanProcessor) Option {
	return func(o *options) { o.processors = append(o.processors, sp) }
}

// WithSpanExporter adds an exporter behind its own bounded batch queue,
// counted like the OTLP exporter (for example a
// tracetest.InMemoryExporter). It is used only when tracing is on.
func WithSpanExporter(e sdktrace.SpanExporter) Option {
	return func(o *options) { o.exporters = append(o.exporters, e) }
}

// WithIDGenerator replaces the random trace and span id generator (for
// seeded ids in tests). [telemetry.ContextWithTraceID] still takes
// precedence for root spans.
func WithIDGenerator(g sdktrace.IDGenerator) Option {
	return func(o *options) { o.idGen = g }
}

// WithProfileWriter makes the span profile go to w instead of the file named
// by Config.ProfilePath, and turns profiling on. The Provider flushes but
// never closes w.
func WithProfileWriter(w io.Writer) Option {
	return func(o *options) { o.profile = w }
}

// Provider owns a process's tracing pipeline: the tracer provider, its
// exporters, and the span profile. All methods are safe for concurrent use.
type Provider struct {
	cfg     Config
	enabled bool
	tp      trace.TracerProvider
	sdk     *sdktrace.TracerProvider // nil when tracing is off
	pipes   []*pipeline
	stats   counters
	profile *telemetry.ProfileSink // nil when profiling is off
	closer  io.Closer              // the profile file we opened, if any

	shutdownOnce sync.Once
	shutdownErr  error
}

type counters struct {
	dropped      atomic.Uint64
	failed       atomic.Uint64
	exported     atomic.Uint64
	exportErrors atomic.Uint64
}

// New builds a Provider from cfg. Tracing is on when cfg.TracingEnabled():
// an OTLP exporter for cfg.Endpoint (if set) with cfg.Protocol, the span
// processors and exporters of opts, the head sampler of cfg.Sampler, and a
// resource with service.name, service.version, service.instance.id,
// process.pid and cfg.ResourceAttributes. Otherwise TracerProvider returns a
// no-op provider. Profiling is on when cfg.Profile is set (the file is
// created or appended to) or [WithProfileWriter] is given, whether tracing is
// on or not.
//
// ctx is used only while building the exporter. A bad cfg is an error
// wrapping [ErrConfig]. The caller must call Shutdown.
func New(ctx context.Context, cfg Config, opts ...Option) (*Provider, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	cfg = cfg.withDefaults()
	cfg.ServiceName = cmp.Or(cfg.ServiceName, attrValue(cfg.ResourceAttributes, "service.name"),
		"unknown_service:"+filepath.Base(os.Args[0]))
	cfg.InstanceID = cmp.Or(cfg.InstanceID, attrValue(cfg.ResourceAttributes, "service.instance.id"), newUUID())
	cfg.ServiceVersion = cmp.Or(cfg.ServiceVersion, attrValue(cfg.ResourceAttributes, "service.version"))

	p := &Provider{cfg: cfg, enabled: cfg.TracingEnabled(), tp: noop.NewTracerProvider()}

	if o.profile != nil {
		p.profile = telemetry.AsProfileSink(o.profile)
	} else if cfg.Profile {
		path := cfg.ProfilePath
		if path == "" {
			path = fmt.Sprintf("cb-profile-%s-%d.jsonl", sanitizeFileName(cfg.ServiceName), os.Getpid())
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open span profile: %w", err)
		}
		p.cfg.ProfilePath = path
		p.profile = telemetry.NewProfileSink(f)
		p.closer = f
	}

	if !p.enabled {
		return p, nil
	}

	sampler, _ := cfg.sampler() // validated above
	tpOpts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(newResource(cfg)),
		sdktrace.WithSampler(sampler),
		sdktrace.WithIDGenerator(idGenerator{inner: o.idGen}),
	}
	if cfg.Endpoint != "" {
		exp, closeIdle, err := newOTLPExporter(ctx, cfg)
		if err != nil {
			p.closeProfile()
			return nil, fmt.Errorf("create OTLP %s exporter for %s: %w", cfg.Protocol, cfg.Endpoint, err)
		}
		p.pipes = append(p.pipes, newPipeline(exp, closeIdle, cfg, &p.stats))
	}
	for _, e := range o.exporters {
		p.pipes = append(p.pipes, newPipeline(e, nil, cfg, &p.stats))
	}
	for _, pl := range p.pipes {
		tpOpts = append(tpOpts, sdktrace.WithSpanProcessor(pl))
	}
	for _, sp := range o.processors {
		tpOpts = append(tpOpts, sdktrace.WithSpanProcessor(sp))
	}
	p.sdk = sdktrace.NewTracerProvider(tpOpts...)
	p.tp = p.sdk
	return p, nil
}

// TracerProvider returns the tracer provider to instrument with: the SDK
// provider when tracing is on, a no-op provider otherwise.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// Enabled reports whether tracing is on.
func (p *Provider) Enabled() bool { return p.enabled }

// Config returns the effective configuration, defaults applied.
func (p *Provider) Config() Config { return p.cfg }

// ProfileWriter returns the span profile sink, or nil when profiling is off.
func (p *Provider) ProfileWriter() *telemetry.ProfileSink { return p.profile }

// Spans returns a span helper for the instrumentation scope, bound to this
// provider's tracer provider and span profile.
func (p *Provider) Spans(scope string) *telemetry.Spans {
	if p.profile == nil {
		return telemetry.NewSpans(p.tp, scope, nil)
	}
	return telemetry.NewSpans(p.tp, scope, p.profile)
}

// DroppedSpans returns how many sampled spans were lost: dropped before
// export because the export queue was full (or the provider was shutting
// down; [Provider.QueueDroppedSpans]), or in export batches that failed
// ([Provider.FailedSpans]). It is what cb_trace_spans_dropped_total counts.
// The count is monotonic.
func (p *Provider) DroppedSpans() uint64 { return p.stats.dropped.Load() + p.stats.failed.Load() }

// QueueDroppedSpans returns how many sampled spans were dropped before
// export because the export queue was full (or the provider was shutting
// down). The count is monotonic.
func (p *Provider) QueueDroppedSpans() uint64 { return p.stats.dropped.Load() }

// FailedSpans returns how many spans were in export batches that failed
// (collector unreachable, hanging past the export timeout, or refusing
// them). The count is monotonic.
func (p *Provider) FailedSpans() uint64 { return p.stats.failed.Load() }

// ExportErrors returns how many export calls failed. The count is monotonic.
func (p *Provider) ExportErrors() uint64 { return p.stats.exportErrors.Load() }

// ExportedSpans returns how many spans were exported successfully. The count
// is monotonic.
func (p *Provider) ExportedSpans() uint64 { return p.stats.exported.Load() }

// ForceFlush exports the spans ended so far and flushes the span profile,
// giving up when ctx is done.
func (p *Provider) ForceFlush(ctx context.Context) error {
	var errs []error
	if p.sdk != nil {
		if err := p.sdk.ForceFlush(ctx); err != nil {
			errs = append(errs, fmt.Errorf("flush spans: %w", err))
		}
	}
	if p.profile != nil {
		if err := p.profile.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("flush span profile: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Shutdown flushes the queued spans and stops the exporters and the span
// profile. It gives up flushing when ctx is done or after Config.ExportTimeout,
// whichever comes first: the exports still running are then cancelled (their
// spans counted as failed) and Shutdown returns the context's error once the
// export goroutines have stopped. Only the first call has an effect; later
// calls return its result.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.shutdownOnce.Do(func() {
		var errs []error
		if p.sdk != nil {
			// Never wait for a dead or hanging collector longer than one
			// export timeout.
			ctx, cancel := context.WithTimeout(ctx, p.cfg.ExportTimeout)
			if err := p.sdk.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("shut down tracer provider: %w", err))
			}
			cancel()
			grace, cancelGrace := context.WithTimeout(context.Background(), shutdownGrace)
			for _, pl := range p.pipes {
				_ = pl.Shutdown(ctx) // no-op unless the SDK skipped it on a done ctx
				pl.abort()
				select {
				case <-pl.done:
					pl.reconcile()
				case <-grace.Done():
					errs = append(errs, errors.New("span export did not stop within the shutdown grace period"))
				}
			}
			cancelGrace()
		}
		if err := p.closeProfile(); err != nil {
			errs = append(errs, err)
		}
		p.shutdownErr = errors.Join(errs...)
	})
	return p.shutdownErr
}

func (p *Provider) closeProfile() error {
	if p.profile == nil {
		return nil
	}
	err := p.profile.Flush()
	if p.closer != nil {
		err = errors.Join(err, p.closer.Close())
	}
	if err != nil {
		return fmt.Errorf("close span profile: %w", err)
	}
	return nil
}

// pipeline is a bounded, counted batch export path: a span processor in
// front of the SDK batch span processor that admits at most MaxQueueSize
// spans not yet handed to the exporter, and an exporter wrapper that counts
// outcomes and can be aborted.
type pipeline struct {
	bsp      sdktrace.SpanProcessor
	inner    sdktrace.SpanExporter
	limit    int64
	inflight atomic.Int64
	stopped  atomic.Bool
	stats    *counters

	abortCtx  context.Context
	abort     context.CancelFunc
	closeIdle func()
	done      chan struct{}
	doneOnce  sync.Once

	shutOnce sync.Once
	shutErr  error
}

func newPipeline(e sdktrace.SpanExporter, closeIdle func(), cfg Config, stats *counters) *pipeline {
	pl := &pipeline{
		inner:     e,
		limit:     int64(cfg.MaxQueueSize),
		stats:     stats,
		closeIdle: closeIdle,
		done:      make(chan struct{}),
	}
	pl.abortCtx, pl.abort = context.WithCancel(context.Background())
	// The SDK queue gets some headroom over our admission limit so that
	// ForceFlush markers never make it drop (uncounted) an admitted span.
	pl.bsp = sdktrace.NewBatchSpanProcessor((*countingExporter)(pl),
		sdktrace.WithMaxQueueSize(cfg.MaxQueueSize+64),
		sdktrace.WithMaxExportBatchSize(cfg.MaxExportBatchSize),
		sdktrace.WithBatchTimeout(cfg.BatchTimeout),
		sdktrace.WithExportTimeout(cfg.ExportTimeout),
	)
	return pl
}

// OnStart implements sdktrace.SpanProcessor.
func (*pipeline) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd admits s to the batch queue or drops and counts it. It never blocks.
func (pl *pipeline) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return // the batch processor exports sampled spans only
	}
	if n := pl.inflight.Add(1); n > pl.limit || pl.stopped.Load() {
		pl.inflight.Add(-1)
		pl.stats.dropped.Add(1)
		return
	}
	pl.bsp.OnEnd(s)
}

// ForceFlush implements sdktrace.SpanProcessor.
func (pl *pipeline) ForceFlush(ctx context.Context) error { return pl.bsp.ForceFlush(ctx) }

// Shutdown implements sdktrace.SpanProcessor. When ctx ends before the queue
// is drained, the remaining exports are aborted.
func (pl *pipeline) Shutdown(ctx context.Context) error {
	pl.shutOnce.Do(func() {
		pl.stopped.Store(true)
		pl.shutErr = pl.bsp.Shutdown(ctx)
		if pl.shutErr != nil {
			pl.abort()
		}
	})
	return pl.shutErr
}

// reconcile counts as dropped the admitted spans the batch processor
// discarded without exporting (spans racing with its shutdown). It is called
// once the export goroutine has stopped.
func (pl *pipeline) reconcile() {
	if n := pl.inflight.Swap(0); n > 0 {
		pl.stats.dropped.Add(uint64(n))
	}
}

// countingExporter is the exporter side of a pipeline.
type countingExporter pipeline

// ExportSpans exports through the inner exporter, cancelled early when the
// pipeline is aborted, and counts the outcome.
func (ce *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	pl := (*pipeline)(ce)
	n := len(spans)
	pl.inflight.Add(-int64(n))
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(pl.abortCtx, cancel)
	err := pl.inner.ExportSpans(ctx, spans)
	stop()
	cancel()
	if err != nil {
		pl.stats.failed.Add(uint64(n))
		pl.stats.exportErrors.Add(1)
		return fmt.Errorf("export %d spans: %w", n, err)
	}
	pl.stats.exported.Add(uint64(n))
	return nil
}

// Shutdown stops the inner exporter; it is the last thing the batch
// processor's goroutine does.
func (ce *countingExporter) Shutdown(ctx context.Context) error {
	pl := (*pipeline)(ce)
	err := pl.inner.Shutdown(ctx)
	if pl.closeIdle != nil {
		pl.closeIdle()
	}
	pl.doneOnce.Do(func() { close(pl.done) })
	return err
}

// newOTLPExporter builds the OTLP exporter for cfg.Protocol. The returned
// func closes idle HTTP connections after shutdown.
func newOTLPExporter(ctx context.Context, cfg Config) (sdktrace.SpanExporter, func(), error) {
	// Retries stop at the export timeout; the batch processor's context
	// enforces the same bound.
	initial := min(200*time.Millisecond, cfg.ExportTimeout/4)
	maxInterval := min(2*time.Second, cfg.ExportTimeout/2)
	switch cfg.Protocol {
	case ProtocolGRPC:
		opts := []otlptracegrpc.Option{
			otlptracegrpc.WithEndpointURL(cfg.Endpoint),
			otlptracegrpc.WithTimeout(cfg.ExportTimeout),
			otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{
				Enabled: true, InitialInterval: initial, MaxInterval: maxInterval, MaxElapsedTime: cfg.ExportTimeout,
			}),
		}
		if strings.HasPrefix(cfg.Endpoint, "http://") {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		return exp, nil, err
	default:
		// Our own transport, so that Shutdown can close its idle
		// connections (the exporter's shared default transport keeps them).
		tr := http.DefaultTransport.(*http.Transport).Clone()
		hc := &http.Client{Transport: tr, Timeout: cfg.ExportTimeout}
		opts := []otlptracehttp.Option{
			otlptracehttp.WithEndpointURL(cfg.Endpoint),
			otlptracehttp.WithTimeout(cfg.ExportTimeout),
			otlptracehttp.WithHTTPClient(hc),
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig{
				Enabled: true, InitialInterval: initial, MaxInterval: maxInterval, MaxElapsedTime: cfg.ExportTimeout,
			}),
		}
		if cfg.Protocol == ProtocolHTTPJSON {
			opts = append(opts, otlptracehttp.WithEncoding(otlptracehttp.EncodingJSON))
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		return exp, tr.CloseIdleConnections, err
	}
}

func newResource(cfg Config) *resource.Resource {
	attrs := make([]attribute.KeyValue, 0, len(cfg.ResourceAttributes)+7)
	attrs = append(attrs, cfg.ResourceAttributes...)
	attrs = append(attrs,
		attribute.String("telemetry.sdk.language", "go"),
		attribute.String("telemetry.sdk.name", "opentelemetry"),
		attribute.String("telemetry.sdk.version", sdk.Version()),
		attribute.String("service.name", cfg.ServiceName),
		attribute.String("service.instance.id", cfg.InstanceID),
		attribute.Int("process.pid", os.Getpid()),
	)
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.ServiceVersion))
	}
	// attribute sets keep the last value of a duplicated key, so the
	// explicit fields win over OTEL_RESOURCE_ATTRIBUTES.
	return resource.NewSchemaless(attrs...)
}

// NewIDGenerator returns the id generator every [Provider] uses: a root
// span started with a context from [telemetry.ContextWithTraceID] gets that
// trace id; otherwise ids come from inner (random ids when inner is nil). A
// TracerProvider built directly with the SDK (tests) passes it to
// sdktrace.WithIDGenerator to get the same behaviour. Safe for concurrent
// use.
func NewIDGenerator(inner sdktrace.IDGenerator) sdktrace.IDGenerator {
	return idGenerator{inner: inner}
}

type idGenerator struct{ inner sdktrace.IDGenerator }

func (g idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if id, ok := telemetry.TraceIDFromContext(ctx); ok {
		return id, g.NewSpanID(ctx, id)
	}
	if g.inner != nil {
		return g.inner.NewIDs(ctx)
	}
	return randid.TraceID(), randid.SpanID()
}

func (g idGenerator) NewSpanID(ctx context.Context, tid trace.TraceID) trace.SpanID {
	if g.inner != nil {
		return g.inner.NewSpanID(ctx, tid)
	}
	return randid.SpanID()
}

func newUUID() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func sanitizeFileName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
}
