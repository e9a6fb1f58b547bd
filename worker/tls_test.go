package worker

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

// TestGRPCServerOptions: the worker serves its gRPC port with the options
// of component.Deps (here mutual TLS admitting the engine only).
func TestGRPCServerOptions(t *testing.T) {
	load := mtlstest.Identities(t)
	w, err := New(Config{Model: smallModel, ShmDir: t.TempDir(), NumBlocks: 16}, Deps{Deps: component.Deps{
		Registerer:        prometheus.NewRegistry(),
		GRPCServerOptions: load(mtls.Worker).ServerOptions(mtls.WorkerCallers...),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Shutdown(context.Background())
	for _, tc := range []struct {
		name string
		opts []grpc.DialOption
		want codes.Code
	}{
		{"plaintext", nil, codes.Unavailable},
		{"blend's certificate", []grpc.DialOption{load(mtls.Blend).DialOption(mtls.Worker)}, codes.PermissionDenied},
		{"engine's certificate", []grpc.DialOption{load(mtls.Engine).DialOption(mtls.Worker)}, codes.OK},
	} {
		conn, err := rpc.Dial(w.Addr(), tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = cbv1.NewWorkerServiceClient(conn).Info(ctx, &cbv1.InfoRequest{})
		cancel()
		conn.Close()
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: %v (%v), want %v", tc.name, got, err, tc.want)
		}
	}
}
