package telemetry

import (
	"context"
	"net"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
)

func exampleContext(t *testing.T) (context.Context, trace.SpanContext) {
	t.Helper()
	sc, err := ParseTraceparent(w3cExample)
	if err != nil {
		t.Fatal(err)
	}
	return trace.ContextWithRemoteSpanContext(context.Background(), sc), sc
}

func TestHTTPInjectExtract(t *testing.T) {
	ctx, sc := exampleContext(t)
	ts, err := trace.ParseTraceState("vendor=abc,other=1")
	if err != nil {
		t.Fatal(err)
	}
	ctx = trace.ContextWithRemoteSpanContext(ctx, sc.WithTraceState(ts))

	h := http.Header{}
	InjectHTTP(ctx, h)
	if got := h.Get("traceparent"); got != w3cExample {
		t.Fatalf("traceparent %q", got)
	}
	if got := h.Get("tracestate"); got != "vendor=abc,other=1" {
		t.Fatalf("tracestate %q", got)
	}
	got := trace.SpanContextFromContext(ExtractHTTP(context.Background(), h))
	if !got.Equal(sc.WithTraceState(ts)) {
		t.Fatalf("extracted %v", got)
	}

	// No span context: nothing injected.
	h2 := http.Header{}
	InjectHTTP(context.Background(), h2)
	if len(h2) != 0 {
		t.Fatalf("injected %v without a span context", h2)
	}
}

func TestExtractRejects(t *testing.T) {
	tests := []struct {
		name    string
		headers http.Header
		// sdkAccepts: the SDK's TraceContext takes the first value.
		sdkAccepts bool
	}{
		{"no header", http.Header{}, false},
		{"invalid", http.Header{"Traceparent": {"00-" + exTrace + "-" + exSpan + "-1"}}, false},
		{"duplicated header", http.Header{"Traceparent": {w3cExample, "00-" + exTrace + "-" + exSpan + "-00"}}, true},
		{"duplicated identical header", http.Header{"Traceparent": {w3cExample, w3cExample}}, true},
		{"comma-joined header", http.Header{"Traceparent": {w3cExample + "," + w3cExample}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := context.WithValue(context.Background(), struct{}{}, 1)
			ctx := ExtractHTTP(base, tc.headers)
			if ctx != base {
				t.Fatalf("context changed: %v", trace.SpanContextFromContext(ctx))
			}
			sdk := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(tc.headers)))
			if sdk.IsValid() != tc.sdkAccepts {
				t.Fatalf("SDK accepts=%v, want %v", sdk.IsValid(), tc.sdkAccepts)
			}
		})
	}
}

func TestInvalidTracestateKeepsTraceparent(t *testing.T) {
	h := http.Header{"Traceparent": {w3cExample}, "Tracestate": {"not a valid=state=x"}}
	sc := trace.SpanContextFromContext(ExtractHTTP(context.Background(), h))
	if !sc.IsValid() || sc.TraceState().Len() != 0 {
		t.Fatalf("got %v", sc)
	}
}

func TestStringInjectExtract(t *testing.T) {
	if got := InjectString(context.Background()); got != "" {
		t.Fatalf("no span: %q", got)
	}
	ctx, sc := exampleContext(t)
	if got := InjectString(ctx); got != w3cExample {
		t.Fatalf("got %q", got)
	}
	base := context.Background()
	for _, bad := range []string{"", "garbage", "00-" + exTrace + "-0000000000000000-01"} {
		if ExtractString(base, bad) != base {
			t.Fatalf("%q changed the context", bad)
		}
	}
	got := trace.SpanContextFromContext(ExtractString(base, w3cExample))
	if !got.Equal(sc) || !got.IsRemote() {
		t.Fatalf("extracted %v", got)
	}
}

// TestStringsCarryTracestate: the payload pair (trace_context, trace_state) carries the
// caller's vendor entries; an invalid tracestate is dropped, traceparent kept.
func TestStringsCarryTracestate(t *testing.T) {
	if tp, ts := InjectStrings(context.Background()); tp != "" || ts != "" {
		t.Fatalf("no span: %q %q", tp, ts)
	}
	const vendor = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
	h := http.Header{"Traceparent": {w3cExample}, "Tracestate": {vendor}}
	ctx := ExtractHTTP(context.Background(), h)
	tp, ts := InjectStrings(ctx)
	if tp != w3cExample || ts != vendor {
		t.Fatalf("InjectStrings = %q, %q", tp, ts)
	}
	got := trace.SpanContextFromContext(ExtractStrings(context.Background(), tp, ts))
	if !got.IsValid() || !got.IsRemote() || got.TraceState().String() != vendor || got.TraceState().Get("congo") != "t61rcWkgMzE" {
		t.Fatalf("extracted %v (tracestate %q)", got, got.TraceState())
	}
	// A child keeps its parent's tracestate: what the payload pair carries further.
	if _, ts := InjectStrings(trace.ContextWithSpanContext(context.Background(), got)); ts != vendor {
		t.Fatalf("re-injected tracestate %q", ts)
	}
	got = trace.SpanContextFromContext(ExtractStrings(context.Background(), tp, "not a valid=state=x"))
	if !got.IsValid() || got.TraceState().Len() != 0 {
		t.Fatalf("invalid tracestate: %v", got)
	}
	base := context.Background()
	if ExtractStrings(base, "", vendor) != base || ExtractStrings(base, "garbage", vendor) != base {
		t.Fatal("a tracestate without a valid traceparent changed the context")
	}
	if _, ok := SpanContextFromStrings("", vendor); ok {
		t.Fatal("SpanContextFromStrings without traceparent")
	}
}

func TestPropagatorFields(t *testing.T) {
	p := Propagator()
	if f := p.Fields(); len(f) != 2 || f[0] != "traceparent" || f[1] != "tracestate" {
		t.Fatalf("fields %v", f)
	}
	ctx, sc := exampleContext(t)
	mc := propagation.MapCarrier{}
	p.Inject(ctx, mc)
	got := trace.SpanContextFromContext(p.Extract(context.Background(), mc))
	if !got.Equal(sc) {
		t.Fatalf("map carrier round trip %v", got)
	}
}

func TestMetadataCarrierDuplicates(t *testing.T) {
	md := metadata.Pairs("traceparent", w3cExample, "traceparent", w3cExample)
	base := context.Background()
	if Propagator().Extract(base, MetadataCarrier(md)) != base {
		t.Fatal("duplicated traceparent in metadata accepted")
	}
	md = metadata.Pairs("Traceparent", w3cExample)
	c := MetadataCarrier(md)
	if c.Get("TRACEPARENT") != w3cExample || len(c.Keys()) != 1 {
		t.Fatalf("carrier %v", md)
	}
}

// TestGRPCInterceptors runs a real gRPC server (bufconn) with our server
// interceptor followed by one that records the handler's context.
func TestGRPCInterceptors(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	var seen context.Context
	capture := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		seen = ctx
		return handler(ctx, req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(UnaryServerInterceptor(), capture))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		<-served
	}()

	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(UnaryClientInterceptor()),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)

	t.Run("context propagated", func(t *testing.T) {
		ctx, sc := exampleContext(t)
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		got := trace.SpanContextFromContext(seen)
		if !got.Equal(sc) || !got.IsRemote() {
			t.Fatalf("server saw %v, want %v", got, sc)
		}
	})
	t.Run("no context", func(t *testing.T) {
		if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		if sc := trace.SpanContextFromContext(seen); sc.IsValid() {
			t.Fatalf("server saw %v", sc)
		}
	})
	t.Run("stale caller metadata replaced", func(t *testing.T) {
		ctx, sc := exampleContext(t)
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+exTrace+"-1111111111111111-01")
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		if got := trace.SpanContextFromContext(seen); !got.Equal(sc) {
			t.Fatalf("server saw %v", got)
		}
	})
	t.Run("duplicated header from a foreign client", func(t *testing.T) {
		ctx := metadata.AppendToOutgoingContext(context.Background(),
			"traceparent", w3cExample, "traceparent", w3cExample)
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		if sc := trace.SpanContextFromContext(seen); sc.IsValid() {
			t.Fatalf("server trusted a duplicated traceparent: %v", sc)
		}
	})
}

type fakeServerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f fakeServerStream) Context() context.Context { return f.ctx }

func TestStreamInterceptors(t *testing.T) {
	ctx, sc := exampleContext(t)
	var sent metadata.MD
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		sent, _ = metadata.FromOutgoingContext(ctx)
		return nil, nil
	}
	if _, err := StreamClientInterceptor()(ctx, &grpc.StreamDesc{}, nil, "/x/Y", streamer); err != nil {
		t.Fatal(err)
	}
	if got := sent.Get("traceparent"); len(got) != 1 || got[0] != w3cExample {
		t.Fatalf("client sent %v", sent)
	}

	in := metadata.NewIncomingContext(context.Background(), sent)
	var seen context.Context
	handler := func(_ any, ss grpc.ServerStream) error { seen = ss.Context(); return nil }
	if err := StreamServerInterceptor()(nil, fakeServerStream{ctx: in}, &grpc.StreamServerInfo{}, handler); err != nil {
		t.Fatal(err)
	}
	if got := trace.SpanContextFromContext(seen); !got.Equal(sc) {
		t.Fatalf("server stream saw %v", got)
	}
}

func TestTraceIDFromContext(t *testing.T) {
	if _, ok := TraceIDFromContext(context.Background()); ok {
		t.Fatal("trace id in an empty context")
	}
	want := TraceIDFromRequestID("req-7")
	if got, ok := TraceIDFromContext(ContextWithTraceID(context.Background(), want)); !ok || got != want {
		t.Fatalf("TraceIDFromContext = %s %v, want %s", got, ok, want)
	}
	if _, ok := TraceIDFromContext(ContextWithTraceID(context.Background(), trace.TraceID{})); ok {
		t.Fatal("zero trace id was stored")
	}
}
