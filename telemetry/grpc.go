package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// MetadataCarrier adapts gRPC metadata to propagation.TextMapCarrier and
// propagation.ValuesGetter, so that [Propagator] sees duplicated traceparent
// entries. Keys are lower-cased as gRPC requires. It is not safe for
// concurrent use (neither is metadata.MD).
type MetadataCarrier metadata.MD

var (
	_ propagation.TextMapCarrier = MetadataCarrier{}
	_ propagation.ValuesGetter   = MetadataCarrier{}
)

// Get returns the first value of key, or "".
func (c MetadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key with value.
func (c MetadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

// Keys returns the keys present in the metadata.
func (c MetadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Values returns every value of key.
func (c MetadataCarrier) Values(key string) []string { return metadata.MD(c).Get(key) }

// InjectGRPC returns ctx with the span context of ctx added to its outgoing
// gRPC metadata (traceparent, tracestate), replacing any trace context
// already there. ctx is returned unchanged when it holds no valid span
// context. It is safe for concurrent use.
func InjectGRPC(ctx context.Context) context.Context {
	tp := InjectString(ctx)
	if tp == "" {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	w3c{}.Inject(ctx, MetadataCarrier(md))
	return metadata.NewOutgoingContext(ctx, md)
}

// ExtractGRPC returns ctx with the remote span context carried by the
// incoming gRPC metadata of ctx, or ctx unchanged when there is none that is
// valid. It is safe for concurrent use.
func ExtractGRPC(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ctx
	}
	return w3c{}.Extract(ctx, MetadataCarrier(md))
}

// UnaryClientInterceptor returns a gRPC client interceptor that injects the
// caller's span context into the outgoing metadata. It creates no spans. It
// is safe for concurrent use.
func UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(InjectGRPC(ctx), method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor is the streaming counterpart of
// [UnaryClientInterceptor]. It creates no spans.
func StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(InjectGRPC(ctx), desc, cc, method, opts...)
	}
}

// UnaryServerInterceptor returns a gRPC server interceptor that extracts the
// caller's span context from the incoming metadata into the handler's
// context (as a remote parent). It creates no spans; an invalid or duplicated
// traceparent is ignored. It is safe for concurrent use.
func UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return handler(ExtractGRPC(ctx), req)
	}
}

// StreamServerInterceptor is the streaming counterpart of
// [UnaryServerInterceptor]: the stream's Context carries the extracted
// remote span context. It creates no spans.
func StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &ctxStream{ServerStream: ss, ctx: ExtractGRPC(ss.Context())})
	}
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }
