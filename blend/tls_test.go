package blend

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/mtls"
	"github.com/cacheblend/cacheblend/rpc/mtls/mtlstest"
)

// TestGRPCServerOptions: the blend server serves its gRPC port with the
// options of component.Deps (here mutual TLS admitting engine and worker).
func TestGRPCServerOptions(t *testing.T) {
	load := mtlstest.Identities(t)
	s, err := New(Config{L1Bytes: 1 << 20}, component.Deps{
		Registerer:        prometheus.NewRegistry(),
		GRPCServerOptions: load(mtls.Blend).ServerOptions(mtls.BlendCallers...),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	for _, tc := range []struct {
		name string
		opts []grpc.DialOption
		want codes.Code
	}{
		{"plaintext", nil, codes.Unavailable},
		{"blend's certificate", []grpc.DialOption{load(mtls.Blend).DialOption(mtls.Blend)}, codes.PermissionDenied},
		{"engine's certificate", []grpc.DialOption{load(mtls.Engine).DialOption(mtls.Blend)}, codes.OK},
		{"worker's certificate", []grpc.DialOption{load(mtls.Worker).DialOption(mtls.Blend)}, codes.OK},
	} {
		conn, err := rpc.Dial(s.Addr(), tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = cbv1.NewBlendServiceClient(conn).Lookup(ctx, &cbv1.LookupRequest{RequestId: "r", Tokens: []int32{1, 2, 3}, WorldSize: 1})
		cancel()
		conn.Close()
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: %v (%v), want %v", tc.name, got, err, tc.want)
		}
	}
}
