package provider

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/telemetry"
)

func newProvider(t *testing.T, cfg Config, opts ...Option) *Provider {
	t.Helper()
	p, err := New(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p
}

func spanByName(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no span %q among %d", name, len(spans))
	return tracetest.SpanStub{}
}

func attrOf(attrs []attribute.KeyValue, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range attrs {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestRequestSpanTree builds the engine's request trace under the caller's
// traceparent and continues it in a second "process" through the
// trace_context string, as the CacheBlend RPCs do.
func TestRequestSpanTree(t *testing.T) {
	engineExp := tracetest.NewInMemoryExporter()
	blendExp := tracetest.NewInMemoryExporter()
	engine := newProvider(t, Config{ServiceName: "cb-engine", Enabled: true}, WithSpanExporter(engineExp))
	blend := newProvider(t, Config{ServiceName: "cb-blend", Enabled: true}, WithSpanExporter(blendExp))

	// The gateway's request.
	h := http.Header{"Traceparent": {w3cExample}}
	ctx := telemetry.ExtractHTTP(context.Background(), h)

	es := engine.Spans("cacheblend/engine")
	ctx, server := es.Start(ctx, "chat tiny", trace.WithSpanKind(trace.SpanKindServer))
	server.SetAttributes(attribute.String("request_id", "req-1"))

	qctx, queue := es.Start(ctx, "engine.queue")
	_ = qctx
	queue.End()
	_, prefill := es.Start(ctx, "engine.prefill")
	prefill.End()
	_, decode := es.Start(ctx, "engine.decode")
	for i := 1; i <= 64; i++ {
		if i%32 == 0 {
			decode.AddEvent("token", trace.WithAttributes(attribute.Int("n", i)))
		}
	}
	decode.SetError("timeout", errors.New("decode deadline exceeded"))
	decode.End()

	rctx, cbReq := es.Start(ctx, "cb.request")
	lctx, lookupRPC := es.Start(rctx, "cb.lookup.rpc", trace.WithSpanKind(trace.SpanKindClient))
	payloadTraceContext := telemetry.InjectString(lctx) // the Lookup payload's trace_context

	// cb-blend side.
	bctx := telemetry.ExtractString(context.Background(), payloadTraceContext)
	_, lookup := blend.Spans("cacheblend/blend").Start(bctx, "cb.lookup", trace.WithSpanKind(trace.SpanKindServer))
	lookup.End()

	lookupRPC.End()
	cbReq.End()
	server.End()

	ctxF := context.Background()
	if err := engine.ForceFlush(ctxF); err != nil {
		t.Fatal(err)
	}
	if err := blend.ForceFlush(ctxF); err != nil {
		t.Fatal(err)
	}
	spans := engineExp.GetSpans()
	if len(spans) != 6 {
		t.Fatalf("engine exported %d spans, want 6", len(spans))
	}

	srv := spanByName(t, spans, "chat tiny")
	if srv.SpanKind != trace.SpanKindServer {
		t.Errorf("server kind %v", srv.SpanKind)
	}
	if srv.SpanContext.TraceID().String() != exTrace {
		t.Errorf("server trace id %s, want the caller's %s", srv.SpanContext.TraceID(), exTrace)
	}
	if srv.Parent.SpanID().String() != exSpan || !srv.Parent.IsRemote() {
		t.Errorf("server parent %v, want the caller's span %s (remote)", srv.Parent, exSpan)
	}
	if srv.SpanContext.SpanID().String() == exSpan {
		t.Error("server span reused the caller's span id")
	}
	if v, _ := attrOf(srv.Resource.Attributes(), "service.name"); v.AsString() != "cb-engine" {
		t.Errorf("resource service.name %q", v.AsString())
	}
	for _, name := range []string{"engine.queue", "engine.prefill", "engine.decode", "cb.request"} {
		c := spanByName(t, spans, name)
		if c.SpanContext.TraceID() != srv.SpanContext.TraceID() {
			t.Errorf("%s: trace id %s", name, c.SpanContext.TraceID())
		}
		if c.Parent.SpanID() != srv.SpanContext.SpanID() {
			t.Errorf("%s: parent %s, want the SERVER span %s", name, c.Parent.SpanID(), srv.SpanContext.SpanID())
		}
		if c.StartTime.Before(srv.StartTime) || c.EndTime.After(srv.EndTime) {
			t.Errorf("%s: interval outside the SERVER span", name)
		}
	}
	dec := spanByName(t, spans, "engine.decode")
	if len(dec.Events) != 3 { // two token events + the exception event
		t.Errorf("decode events %d", len(dec.Events))
	}
	if dec.Status.Code != codes.Error {
		t.Errorf("decode status %v", dec.Status)
	}
	if v, _ := attrOf(dec.Attributes, telemetry.ErrorTypeKey); v.AsString() != "timeout" {
		t.Errorf("error.type %q", v.AsString())
	}
	if ok := spanByName(t, spans, "engine.queue"); ok.Status.Code == codes.Error {
		t.Error("queue span marked failed")
	}

	rpc := spanByName(t, spans, "cb.lookup.rpc")
	bspans := blendExp.GetSpans()
	if len(bspans) != 1 {
		t.Fatalf("blend exported %d spans", len(bspans))
	}
	bl := bspans[0]
	if bl.SpanContext.TraceID() != srv.SpanContext.TraceID() || bl.Parent.SpanID() != rpc.SpanContext.SpanID() || !bl.Parent.IsRemote() {
		t.Errorf("cb.lookup trace %s parent %v, want trace %s parent %s",
			bl.SpanContext.TraceID(), bl.Parent, srv.SpanContext.TraceID(), rpc.SpanContext.SpanID())
	}
	if v, _ := attrOf(bl.Resource.Attributes(), "service.name"); v.AsString() != "cb-blend" {
		t.Errorf("blend resource service.name %q", v.AsString())
	}
	if engine.ExportedSpans() != 6 || engine.DroppedSpans() != 0 || engine.FailedSpans() != 0 {
		t.Errorf("counters exported=%d dropped=%d failed=%d", engine.ExportedSpans(), engine.DroppedSpans(), engine.FailedSpans())
	}
}

func TestResource(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	p := newProvider(t, Config{
		ServiceName:        "cb-worker",
		ServiceVersion:     "1.2.3",
		ResourceAttributes: []attribute.KeyValue{attribute.String("service.name", "env-name"), attribute.String("deployment.environment", "dev")},
		Enabled:            true,
	}, WithSpanProcessor(rec))
	_, sp := p.Spans("s").Start(context.Background(), "x")
	sp.End()
	attrs := rec.Ended()[0].Resource().Attributes()
	for k, want := range map[attribute.Key]string{"service.name": "cb-worker", "service.version": "1.2.3", "deployment.environment": "dev"} {
		if v, _ := attrOf(attrs, k); v.AsString() != want {
			t.Errorf("%s = %q, want %q", k, v.AsString(), want)
		}
	}
	if v, ok := attrOf(attrs, "service.instance.id"); !ok || len(v.AsString()) != 36 {
		t.Errorf("service.instance.id %q", v.AsString())
	}
	if v, ok := attrOf(attrs, "process.pid"); !ok || v.AsInt64() <= 0 {
		t.Errorf("process.pid %v", v)
	}
	if p.Config().InstanceID == "" {
		t.Error("effective config lacks the instance id")
	}
}

// collector is an httptest OTLP/HTTP receiver.
type collector struct {
	mu   sync.Mutex
	reqs []capturedRequest
}

type capturedRequest struct {
	method, path, contentType string
	body                      []byte
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	c.reqs = append(c.reqs, capturedRequest{r.Method, r.URL.Path, r.Header.Get("Content-Type"), body})
	c.mu.Unlock()
	ct := r.Header.Get("Content-Type")
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	if ct == "application/json" {
		_, _ = w.Write([]byte("{}"))
	}
}

func (c *collector) requests() []capturedRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]capturedRequest(nil), c.reqs...)
}

func findSpan(t *testing.T, td ptrace.Traces, name string) (ptrace.Span, string) {
	t.Helper()
	rss := td.ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		rs := rss.At(i)
		svc, _ := rs.Resource().Attributes().Get("service.name")
		sss := rs.ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			ss := sss.At(j).Spans()
			for k := 0; k < ss.Len(); k++ {
				if ss.At(k).Name() == name {
					return ss.At(k), svc.AsString()
				}
			}
		}
	}
	t.Fatalf("span %q not in the export", name)
	return ptrace.Span{}, ""
}

func TestOTLPHTTPExport(t *testing.T) {
	tests := []struct {
		protocol    string
		contentType string
		unmarshal   ptrace.Unmarshaler
	}{
		{ProtocolHTTPJSON, "application/json", &ptrace.JSONUnmarshaler{}},
		{ProtocolHTTPProtobuf, "application/x-protobuf", &ptrace.ProtoUnmarshaler{}},
	}
	for _, tc := range tests {
		t.Run(tc.protocol, func(t *testing.T) {
			col := &collector{}
			srv := httptest.NewServer(col)
			defer srv.Close()

			// Through the environment, as a process starts: the generic
			// endpoint gets /v1/traces appended.
			cfg, err := ConfigFromEnv(envMap(map[string]string{
				"OTEL_SERVICE_NAME":           "cb-engine",
				"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL,
				"OTEL_EXPORTER_OTLP_PROTOCOL": tc.protocol,
				"OTEL_BSP_SCHEDULE_DELAY":     "3600000",
			}))
			if err != nil {
				t.Fatal(err)
			}
			p, err := New(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !p.Enabled() {
				t.Fatal("tracing off with an endpoint")
			}
			ctx, sp := p.Spans("cacheblend/engine").Start(context.Background(), "otlp.test",
				trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attribute.Int64("n_prompt_tokens", 1<<40)))
			_, child := p.Spans("cacheblend/engine").Start(ctx, "otlp.child")
			child.End()
			sp.SetError("internal", errors.New("boom"))
			sp.End()
			if err := p.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}

			reqs := col.requests()
			if len(reqs) != 1 {
				t.Fatalf("collector got %d requests, want 1", len(reqs))
			}
			r := reqs[0]
			if r.method != http.MethodPost || r.path != "/v1/traces" || r.contentType != tc.contentType {
				t.Fatalf("got %s %s (%s)", r.method, r.path, r.contentType)
			}
			td, err := tc.unmarshal.UnmarshalTraces(r.body)
			if err != nil {
				t.Fatalf("collector cannot decode the body: %v", err)
			}
			if td.SpanCount() != 2 {
				t.Fatalf("%d spans in the export", td.SpanCount())
			}
			got, svc := findSpan(t, td, "otlp.test")
			if svc != "cb-engine" {
				t.Errorf("service.name %q", svc)
			}
			if got.TraceID().String() != sp.SpanContext().TraceID().String() || got.SpanID().String() != sp.SpanContext().SpanID().String() {
				t.Errorf("ids %s/%s", got.TraceID(), got.SpanID())
			}
			if !got.ParentSpanID().IsEmpty() {
				t.Errorf("root has parent %s", got.ParentSpanID())
			}
			if got.Kind() != ptrace.SpanKindServer || got.Status().Code() != ptrace.StatusCodeError {
				t.Errorf("kind %v status %v", got.Kind(), got.Status().Code())
			}
			if v, ok := got.Attributes().Get("n_prompt_tokens"); !ok || v.Int() != 1<<40 {
				t.Errorf("int attribute %v", v.AsString())
			}
			ch, _ := findSpan(t, td, "otlp.child")
			if ch.ParentSpanID() != got.SpanID() {
				t.Errorf("child parent %s", ch.ParentSpanID())
			}
			if tc.protocol == ProtocolHTTPJSON {
				// OTLP/JSON: hex ids (the OTLP spec makes them
				// case-insensitive; the SDK writes upper case), 64-bit ints as
				// strings, kind and status code as numbers.
				body := string(r.body)
				m := regexp.MustCompile(`"traceId":"([0-9A-Fa-f]{32})"`).FindStringSubmatch(body)
				if m == nil || !strings.EqualFold(m[1], sp.SpanContext().TraceID().String()) {
					t.Errorf("JSON body lacks the hex trace id: %s", body)
				}
				for _, want := range []string{`"intValue":"1099511627776"`, `"kind":2`, `"code":2`} {
					if !strings.Contains(body, want) {
						t.Errorf("JSON body lacks %s: %s", want, body)
					}
				}
			}
			if p.ExportedSpans() != 2 || p.ExportErrors() != 0 {
				t.Errorf("exported %d, errors %d", p.ExportedSpans(), p.ExportErrors())
			}
		})
	}
}

type grpcCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu   sync.Mutex
	reqs [][]byte
}

func (c *grpcCollector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.reqs = append(c.reqs, b)
	c.mu.Unlock()
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func TestOTLPGRPCExport(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &grpcCollector{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, col)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Stop()
		<-served
	}()

	p := newProvider(t, Config{ServiceName: "cb-worker", Endpoint: "http://" + ln.Addr().String(), Protocol: ProtocolGRPC, BatchTimeout: time.Hour})
	_, sp := p.Spans("cacheblend/worker").Start(context.Background(), "cb.execute")
	sp.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.reqs) != 1 {
		t.Fatalf("collector got %d exports", len(col.reqs))
	}
	td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(col.reqs[0])
	if err != nil {
		t.Fatal(err)
	}
	got, svc := findSpan(t, td, "cb.execute")
	if svc != "cb-worker" || got.SpanID().String() != sp.SpanContext().SpanID().String() {
		t.Fatalf("service %q span %s", svc, got.SpanID())
	}
}

// hangingCollector accepts TCP connections and never answers.
type hangingCollector struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

func newHangingCollector(t *testing.T) *hangingCollector {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hangingCollector{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-h.done
		h.mu.Lock()
		for _, c := range h.conns {
			_ = c.Close()
		}
		h.mu.Unlock()
	})
	return h
}

func deadEndpoint(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func TestUnreachableCollectorNeverBlocks(t *testing.T) {
	const (
		timeout = 300 * time.Millisecond
		nSpans  = 1000
		queue   = 100
	)
	type target struct {
		name     string
		endpoint func(t *testing.T) string
		protocol string
	}
	targets := []target{
		{"dead http", func(t *testing.T) string { return "http://" + deadEndpoint(t) + "/v1/traces" }, ProtocolHTTPProtobuf},
		{"hanging http", func(t *testing.T) string { return "http://" + newHangingCollector(t).ln.Addr().String() + "/v1/traces" }, ProtocolHTTPJSON},
		{"dead grpc", func(t *testing.T) string { return "http://" + deadEndpoint(t) }, ProtocolGRPC},
		{"hanging grpc", func(t *testing.T) string { return "http://" + newHangingCollector(t).ln.Addr().String() }, ProtocolGRPC},
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			p, err := New(context.Background(), Config{
				ServiceName:   "cb-engine",
				Endpoint:      tg.endpoint(t),
				Protocol:      tg.protocol,
				ExportTimeout: timeout,
				MaxQueueSize:  queue,
				BatchTimeout:  20 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			spans := p.Spans("s")
			begin := time.Now()
			for range nSpans {
				_, sp := spans.Start(context.Background(), "work")
				sp.End()
			}
			// Blocking on the collector would cost a timeout per span.
			if d := time.Since(begin); d > 10*timeout {
				t.Fatalf("ending %d spans took %v", nSpans, d)
			}
			begin = time.Now()
			err = p.Shutdown(context.Background())
			if d := time.Since(begin); d > 10*timeout {
				t.Fatalf("Shutdown took %v with export timeout %v", d, timeout)
			}
			t.Logf("shutdown: %v (err %v) queue dropped=%d failed=%d exportErrors=%d",
				time.Since(begin), err, p.QueueDroppedSpans(), p.FailedSpans(), p.ExportErrors())
			if p.ExportedSpans() != 0 {
				t.Fatalf("exported %d spans to a dead collector", p.ExportedSpans())
			}
			if p.FailedSpans() == 0 || p.ExportErrors() == 0 {
				t.Fatalf("failed=%d exportErrors=%d, want > 0", p.FailedSpans(), p.ExportErrors())
			}
			if got := p.QueueDroppedSpans() + p.FailedSpans(); got != nSpans || p.DroppedSpans() != got {
				t.Fatalf("queue dropped %d + failed %d = %d (DroppedSpans %d), want every one of %d spans accounted for",
					p.QueueDroppedSpans(), p.FailedSpans(), got, p.DroppedSpans(), nSpans)
			}
		})
	}
}

func TestShutdownHonoursContext(t *testing.T) {
	h := newHangingCollector(t)
	p, err := New(context.Background(), Config{
		Endpoint:      "http://" + h.ln.Addr().String() + "/v1/traces",
		ExportTimeout: time.Minute, // only the context can stop it
		BatchTimeout:  time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, sp := p.Spans("s").Start(context.Background(), "x")
	sp.End()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = p.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want a deadline error", err)
	}
	if p.FailedSpans()+p.QueueDroppedSpans() != 1 || p.DroppedSpans() != 1 {
		t.Fatalf("failed %d queue dropped %d lost %d", p.FailedSpans(), p.QueueDroppedSpans(), p.DroppedSpans())
	}
	if again := p.Shutdown(context.Background()); !errors.Is(again, context.DeadlineExceeded) {
		t.Fatalf("second Shutdown = %v", again)
	}
}

// blockingExporter blocks every export until released.
type blockingExporter struct {
	release chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (b *blockingExporter) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	b.once.Do(func() { close(b.entered) })
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (*blockingExporter) Shutdown(context.Context) error { return nil }

func TestQueueFullDropsAreCounted(t *testing.T) {
	be := &blockingExporter{release: make(chan struct{}), entered: make(chan struct{})}
	p := newProvider(t, Config{Enabled: true, MaxQueueSize: 10, MaxExportBatchSize: 1, BatchTimeout: time.Hour, ExportTimeout: time.Minute},
		WithSpanExporter(be))
	s := p.Spans("s")
	_, first := s.Start(context.Background(), "first")
	first.End() // a full batch of one: exported at once, and blocks
	<-be.entered
	for range 50 {
		_, sp := s.Start(context.Background(), "x")
		sp.End()
	}
	if got, lost := p.QueueDroppedSpans(), p.DroppedSpans(); got != 40 || lost != 40 {
		t.Fatalf("queue dropped %d, lost %d, want 40 (10 queued behind the blocked export)", got, lost)
	}
	close(be.release)
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p.ExportedSpans() != 11 || p.FailedSpans() != 0 {
		t.Fatalf("exported %d failed %d", p.ExportedSpans(), p.FailedSpans())
	}
}

func TestSampling(t *testing.T) {
	unsampledParent := "00-" + exTrace + "-" + exSpan + "-00"
	tests := []struct {
		name      string
		sampler   string
		arg       string
		parent    string
		wantSpans int
	}{
		{"always_off", SamplerAlwaysOff, "", "", 0},
		{"always_off ignores a sampled parent", SamplerAlwaysOff, "", w3cExample, 0},
		{"parentbased sampled-out remote parent", SamplerParentBasedAlwaysOn, "", unsampledParent, 0},
		{"default sampler is parentbased_always_on", "", "", unsampledParent, 0},
		{"parentbased sampled remote parent", SamplerParentBasedAlwaysOn, "", w3cExample, 2},
		{"parentbased root", SamplerParentBasedAlwaysOn, "", "", 2},
		{"parentbased_always_off root", SamplerParentBasedAlwaysOff, "", "", 0},
		{"parentbased_always_off sampled parent", SamplerParentBasedAlwaysOff, "", w3cExample, 2},
		{"traceidratio 0", SamplerTraceIDRatio, "0", "", 0},
		{"traceidratio 1", SamplerTraceIDRatio, "1", "", 2},
		{"always_on ignores a sampled-out parent", SamplerAlwaysOn, "", unsampledParent, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			p := newProvider(t, Config{Enabled: true, Sampler: tc.sampler, SamplerArg: tc.arg}, WithSpanProcessor(rec))
			ctx := telemetry.ExtractString(context.Background(), tc.parent)
			ctx, sp := p.Spans("s").Start(ctx, "root", trace.WithSpanKind(trace.SpanKindServer))
			_, child := p.Spans("s").Start(ctx, "child")
			child.End()
			sp.End()
			if got := len(rec.Ended()); got != tc.wantSpans {
				t.Fatalf("recorded %d spans, want %d", got, tc.wantSpans)
			}
			// The decision travels: the downstream trace_context carries it.
			if tp := telemetry.InjectString(ctx); tp != "" {
				sc, err := telemetry.ParseTraceparent(tp)
				if err != nil {
					t.Fatal(err)
				}
				if sc.IsSampled() != (tc.wantSpans > 0) {
					t.Fatalf("propagated %s with %d spans recorded", tp, tc.wantSpans)
				}
			}
		})
	}
}

// TestSampledOutRequestRecordsNothingDownstream: a sampled-out request
// records nothing in the next process either.
func TestSampledOutRequestRecordsNothingDownstream(t *testing.T) {
	recEngine, recBlend := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
	engine := newProvider(t, Config{Enabled: true, Sampler: SamplerTraceIDRatio, SamplerArg: "0"}, WithSpanProcessor(recEngine))
	blend := newProvider(t, Config{Enabled: true}, WithSpanProcessor(recBlend))
	ctx, sp := engine.Spans("e").Start(context.Background(), "cb.request")
	tc := telemetry.InjectString(ctx)
	if tc == "" {
		t.Fatal("a sampled-out span still has a span context to propagate")
	}
	_, lookup := blend.Spans("b").Start(telemetry.ExtractString(context.Background(), tc), "cb.lookup")
	lookup.End()
	sp.End()
	if len(recEngine.Ended())+len(recBlend.Ended()) != 0 {
		t.Fatalf("recorded %d + %d spans", len(recEngine.Ended()), len(recBlend.Ended()))
	}
}

func TestTracingSwitch(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		enabled bool
	}{
		{"no endpoint and no CB_TRACING", nil, false},
		{"OTEL_SDK_DISABLED wins over an endpoint", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, false},
		{"OTEL_SDK_DISABLED wins over CB_TRACING", map[string]string{"OTEL_SDK_DISABLED": "true", "CB_TRACING": "1"}, false},
		{"CB_TRACING=1 without endpoint", map[string]string{"CB_TRACING": "1"}, true},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ConfigFromEnv(envMap(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			rec := tracetest.NewSpanRecorder()
			p, err := New(context.Background(), cfg, WithSpanProcessor(rec))
			if err != nil {
				t.Fatal(err)
			}
			if p.Enabled() != tc.enabled {
				t.Fatalf("Enabled() = %v", p.Enabled())
			}
			_, sp := p.TracerProvider().Tracer("t").Start(context.Background(), "x")
			if sp.IsRecording() != tc.enabled {
				t.Fatalf("span recording = %v", sp.IsRecording())
			}
			sp.End()
			if got := len(rec.Ended()); got != map[bool]int{false: 0, true: 1}[tc.enabled] {
				t.Fatalf("recorded %d spans", got)
			}
			// A span to an unreachable endpoint must not fail Shutdown for
			// longer than the export timeout; discard its error here.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = p.Shutdown(ctx)
		})
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Endpoint: "localhost:4318"},
		{Protocol: "thrift"},
		{Sampler: "sometimes"},
		{Sampler: SamplerTraceIDRatio, SamplerArg: "2"},
		{ExportTimeout: -time.Second},
	} {
		if _, err := New(context.Background(), cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

func TestContextWithTraceID(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	p := newProvider(t, Config{Enabled: true}, WithSpanProcessor(rec))
	want := telemetry.TraceIDFromRequestID("req-42")
	ctx := telemetry.ContextWithTraceID(context.Background(), want)
	ctx, root := p.Spans("blend").Start(ctx, "cb.request")
	_, child := p.Spans("blend").Start(ctx, "cb.scatter")
	child.End()
	root.End()
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() != want {
			t.Fatalf("%s: trace id %s, want %s", s.Name(), s.SpanContext().TraceID(), want)
		}
	}
	if rec.Ended()[1].Parent().IsValid() {
		t.Fatal("the option-B root has a parent")
	}
	// A real parent wins over the forced id.
	pctx, _ := exampleContext(t)
	_, sp := p.Spans("blend").Start(telemetry.ContextWithTraceID(pctx, want), "cb.lookup")
	sp.End()
	if got := sp.SpanContext().TraceID().String(); got != exTrace {
		t.Fatalf("child of a remote parent got trace id %s", got)
	}
}

// seqIDs is a deterministic id generator.
type seqIDs struct {
	mu sync.Mutex
	n  byte
}

func (g *seqIDs) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	g.mu.Lock()
	g.n++
	n := g.n
	g.mu.Unlock()
	return trace.TraceID{15: n}, g.NewSpanID(ctx, trace.TraceID{})
}

func (g *seqIDs) NewSpanID(context.Context, trace.TraceID) trace.SpanID {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n++
	return trace.SpanID{7: g.n}
}

func TestSeededIDs(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	p := newProvider(t, Config{Enabled: true}, WithSpanProcessor(rec), WithIDGenerator(&seqIDs{}))
	ctx, root := p.Spans("s").Start(context.Background(), "root")
	_, child := p.Spans("s").Start(ctx, "child")
	child.End()
	root.End()
	if got := telemetry.InjectString(ctx); got != "00-00000000000000000000000000000001-0000000000000002-01" {
		t.Fatalf("root traceparent %s", got)
	}
	if got := child.SpanContext().SpanID().String(); got != "0000000000000003" {
		t.Fatalf("child span id %s", got)
	}
}

func TestNewIDGeneratorHonoursForcedTraceID(t *testing.T) {
	g := NewIDGenerator(nil)
	want := telemetry.TraceIDFromRequestID("abc")
	tid, sid := g.NewIDs(telemetry.ContextWithTraceID(context.Background(), want))
	if tid != want || !sid.IsValid() {
		t.Errorf("NewIDs with forced id = %s %s", tid, sid)
	}
	tid2, _ := g.NewIDs(context.Background())
	if !tid2.IsValid() || tid2 == want {
		t.Errorf("NewIDs without forced id = %s", tid2)
	}
	if ctx := telemetry.ContextWithTraceID(context.Background(), trace.TraceID{}); ctx != context.Background() {
		t.Error("zero trace id was stored")
	}
}

// failingExporter fails every export after its first ok ones.
type failingExporter struct {
	ok    int
	calls atomic.Int64
}

func (f *failingExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	if f.calls.Add(1) <= int64(f.ok) {
		return nil
	}
	return errors.New("collector refused the batch")
}

func (*failingExporter) Shutdown(context.Context) error { return nil }

// TestFailedExportsCountAsDropped: the spans of a failed export are lost and
// counted in DroppedSpans (cb_trace_spans_dropped_total), next to the queue's
// drops; a successful export counts none.
func TestFailedExportsCountAsDropped(t *testing.T) {
	for _, tc := range []struct {
		name                             string
		okCalls, spans, batch            int
		wantExported, wantLost, wantErrs uint64
	}{
		{"every export fails", 0, 7, 1, 0, 7, 7},
		{"first batch ok, then failures", 1, 9, 3, 3, 6, 2},
		{"no failure", 100, 5, 5, 5, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fe := &failingExporter{ok: tc.okCalls}
			p, err := New(context.Background(), Config{Enabled: true, MaxExportBatchSize: tc.batch, BatchTimeout: time.Hour},
				WithSpanExporter(fe))
			if err != nil {
				t.Fatal(err)
			}
			s := p.Spans("s")
			for range tc.spans {
				_, sp := s.Start(context.Background(), "x")
				sp.End()
			}
			_ = p.Shutdown(context.Background()) // exports what is queued
			reg := prometheus.NewRegistry()
			// The process metrics as service.New wires them.
			pm, err := metrics.NewProcessMetrics(reg, metrics.BuildInfo{Service: "cb-engine", Version: "test"}, func() metrics.TraceTotals {
				return metrics.TraceTotals{SpansDropped: p.DroppedSpans(), ExportErrors: p.ExportErrors()}
			})
			if err != nil {
				t.Fatal(err)
			}
			pm.Refresh() // the before-scrape hook
			got := counterValue(t, reg, "cb_trace_spans_dropped_total")
			if p.ExportedSpans() != tc.wantExported || p.DroppedSpans() != tc.wantLost || p.FailedSpans() != tc.wantLost ||
				p.QueueDroppedSpans() != 0 || p.ExportErrors() != tc.wantErrs || got != float64(tc.wantLost) {
				t.Fatalf("exported %d, lost %d (failed %d, queue %d), export errors %d, cb_trace_spans_dropped_total %v; want exported %d, lost %d, errors %d",
					p.ExportedSpans(), p.DroppedSpans(), p.FailedSpans(), p.QueueDroppedSpans(), p.ExportErrors(), got,
					tc.wantExported, tc.wantLost, tc.wantErrs)
			}
		})
	}
}

// counterValue gathers reg and returns the value of the unlabelled counter
// name.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}
