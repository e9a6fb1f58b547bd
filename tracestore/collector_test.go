package tracestore

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	otelattr "go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

func newCollector(t *testing.T, cfg Config) *Collector {
	t.Helper()
	c, err := New(cfg, component.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func startCollector(t *testing.T, cfg Config) *Collector {
	t.Helper()
	if cfg.OTLPAddr == "" {
		cfg.OTLPAddr = "127.0.0.1:0"
	}
	if cfg.QueryAddr == "" {
		cfg.QueryAddr = "127.0.0.1:0"
	}
	c := newCollector(t, cfg)
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return c
}

// provider is one "process": a tracer provider with its own service.name exporting over
// OTLP/HTTP (protobuf, gzip) to the collector, as cb-engine, cb-worker and cb-blend do.
func provider(t *testing.T, endpoint, service string, gzip bool) *sdktrace.TracerProvider {
	t.Helper()
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(endpoint), otlptracehttp.WithInsecure()}
	if gzip {
		opts = append(opts, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	res := sdkresource.NewSchemaless(otelattr.String("service.name", service))
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
}

// TestCollectorEndToEnd exports one request's spans from three OpenTelemetry SDK tracer
// providers (three services) to the collector and reads them back through the Jaeger API.
func TestCollectorEndToEnd(t *testing.T) {
	c := startCollector(t, Config{})
	if strings.HasSuffix(c.OTLPAddr(), ":0") || strings.HasSuffix(c.QueryAddr(), ":0") {
		t.Fatalf("bound addresses not reported: %s %s", c.OTLPAddr(), c.QueryAddr())
	}
	ctx := context.Background()
	engine := provider(t, c.OTLPAddr(), "cb-engine", true)
	worker := provider(t, c.OTLPAddr(), "cb-worker", false)
	blend := provider(t, c.OTLPAddr(), "cb-blend", true)

	base := time.Now().Add(-time.Second)
	at := func(ms float64) time.Time { return base.Add(time.Duration(ms * float64(time.Millisecond))) }
	rid := otelattr.String("request_id", "e2e-1")
	ctxRoot, root := engine.Tracer("engine").Start(ctx, "chat m1", trace.WithTimestamp(at(0)), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(otelattr.String("gen_ai.operation.name", "chat"), otelattr.String("gen_ai.request.model", "m1"), rid))
	ctxReq, req := engine.Tracer("engine").Start(ctxRoot, spanname.CBRequest, trace.WithTimestamp(at(1)), trace.WithAttributes(rid,
		otelattr.Float64("hit_rate", 0.5), otelattr.Int("prefix_hit_tokens", 256), otelattr.Int("non_prefix_hit_tokens", 256), otelattr.Int("requested_tokens", 1024)))
	// The remote children: only the span context crosses the "process" boundary.
	remote := trace.ContextWithRemoteSpanContext(ctx, trace.SpanContextFromContext(ctxReq))
	_, lookup := blend.Tracer("blend").Start(remote, spanname.CBLookup, trace.WithTimestamp(at(2)), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(rid))
	lookup.End(trace.WithTimestamp(at(10)))
	_, exec := worker.Tracer("worker").Start(remote, spanname.CBExecute, trace.WithTimestamp(at(11)), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(rid))
	exec.End(trace.WithTimestamp(at(40)))
	req.End(trace.WithTimestamp(at(41)))
	root.End(trace.WithTimestamp(at(50)))
	for _, tp := range []*sdktrace.TracerProvider{engine, worker, blend} {
		if err := tp.Shutdown(ctx); err != nil {
			t.Fatalf("exporter: %v", err)
		}
	}

	client, err := jaeger.NewClient("http://"+c.QueryAddr(), jaeger.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	traces, err := client.FindTraces(ctx, jaeger.Query{Service: "cb-worker", Tags: map[string]string{"request_id": "e2e-1"}})
	if err != nil || len(traces) != 1 {
		t.Fatalf("FindTraces: %d traces, %v", len(traces), err)
	}
	tr := traces[0]
	if tr.TraceID != root.SpanContext().TraceID().String() || len(tr.Spans) != 4 || len(tr.Processes) != 3 {
		t.Fatalf("trace %s: %d spans, %d processes", tr.TraceID, len(tr.Spans), len(tr.Processes))
	}
	bd, ok := c.Store().Breakdown(tr.TraceID)
	if !ok || bd.RootName != "chat m1" || bd.DurationNs != int64(50*time.Millisecond) || bd.Detached != 0 {
		t.Fatalf("breakdown = %+v", bd)
	}
	var rows []RequestSummary
	if _, err := client.Get(ctx, "/api/requests", nil, &rows); err != nil || len(rows) != 1 || rows[0].RequestID != "e2e-1" ||
		rows[0].HitRate == nil || *rows[0].HitRate != 0.5 || len(rows[0].Services) != 3 {
		t.Fatalf("requests = %+v, %v", rows, err)
	}
	if st := c.Receiver().Stats(); st.Accepted < 3 || st.BadRequest != 0 {
		t.Fatalf("receiver stats = %+v", st)
	}
}

func TestCollectorStartErrors(t *testing.T) {
	c := startCollector(t, Config{})
	if err := c.Start(context.Background()); err == nil {
		t.Fatal("second Start succeeded")
	}
	// The OTLP port is taken: Start fails and leaves nothing listening.
	c2 := newCollector(t, Config{OTLPAddr: c.OTLPAddr(), QueryAddr: "127.0.0.1:0"})
	if err := c2.Start(context.Background()); err == nil {
		t.Fatal("Start on a busy port succeeded")
	}
	if err := c2.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown of a collector that never started: %v", err)
	}
	// The query port is taken: the OTLP listener bound first is released again.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c3 := newCollector(t, Config{OTLPAddr: "127.0.0.1:0", QueryAddr: ln.Addr().String()})
	if err := c3.Start(context.Background()); err == nil {
		t.Fatal("Start with a busy query port succeeded")
	}
	// Shut down: later Shutdowns return nil and Start fails.
	c4 := newCollector(t, Config{OTLPAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0"})
	if err := c4.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := c4.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := c4.Start(context.Background()); err == nil {
		t.Fatal("Start after Shutdown succeeded")
	}
	if _, err := New(Config{MaxSpans: -1}, component.Deps{}); err == nil {
		t.Fatal("negative MaxSpans accepted")
	}
}

func TestCollectorDefaults(t *testing.T) {
	c := newCollector(t, Config{})
	if c.OTLPAddr() != DefaultOTLPAddr || c.QueryAddr() != DefaultQueryAddr {
		t.Fatalf("defaults = %s %s", c.OTLPAddr(), c.QueryAddr())
	}
	if c.recv.maxBody != DefaultMaxBodyBytes || c.store.cfg.MaxTraces != DefaultMaxTraces || c.store.cfg.MaxSpans != DefaultMaxSpans {
		t.Fatalf("limits = %d %d %d", c.recv.maxBody, c.store.cfg.MaxTraces, c.store.cfg.MaxSpans)
	}
}
