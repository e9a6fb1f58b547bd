package mtls_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/mtls"
)

// pki is a CA's directory written by WriteDir.
type pki struct{ dir string }

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tls")
	if err := mtls.WriteDir(dir, mtls.DefaultHosts, time.Hour); err != nil {
		t.Fatal(err)
	}
	return pki{dir}
}

func (p pki) identity(t *testing.T, r mtls.Role) *mtls.Identity {
	t.Helper()
	id, err := mtls.Load(mtls.DirFiles(p.dir, r), r)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (p pki) pool(t *testing.T) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.dir, mtls.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	return pool
}

// server is a real gRPC server (rpc.NewServer) on 127.0.0.1:0 serving the
// health service with id's mutual TLS, accepting allowed; handled counts
// the calls that got past authorization.
type server struct {
	addr    string
	handled atomic.Int64
}

func startServer(t *testing.T, id *mtls.Identity, allowed ...mtls.Role) *server {
	t.Helper()
	s := &server{}
	count := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		s.handled.Add(1)
		return h(ctx, req)
	})
	countStream := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		s.handled.Add(1)
		return h(srv, ss)
	})
	srv := rpc.NewServer(append(id.ServerOptions(allowed...), count, countStream)...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	s.addr = ln.Addr().String()
	return s
}

// check calls Health.Check on addr through a connection dialled with opts
// and returns the call's status code.
func check(t *testing.T, addr string, opts ...grpc.DialOption) (codes.Code, error) {
	t.Helper()
	conn, err := rpc.Dial(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return status.Code(err), err
}

// TestServerAuthorization: a server with the worker's certificate that
// admits only the engine, called by every kind of client.
func TestServerAuthorization(t *testing.T) {
	p := newPKI(t)
	other := newPKI(t)
	srv := startServer(t, p.identity(t, mtls.Worker), mtls.WorkerCallers...)
	tests := []struct {
		name    string
		opt     func() []grpc.DialOption
		want    codes.Code
		handled bool
	}{
		{"plaintext", func() []grpc.DialOption { return nil }, codes.Unavailable, false},
		{"TLS without a client certificate", func() []grpc.DialOption {
			return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: p.pool(t), MinVersion: tls.VersionTLS13}))}
		}, codes.Unavailable, false},
		{"client certificate of another CA", func() []grpc.DialOption {
			c := other.identity(t, mtls.Engine).ClientTLS(mtls.Worker)
			c.RootCAs = p.pool(t) // trusts the server; the server does not trust it
			return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(c))}
		}, codes.Unavailable, false},
		{"TLS 1.2 with the right certificate", func() []grpc.DialOption {
			c := p.identity(t, mtls.Engine).ClientTLS(mtls.Worker)
			c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
			return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(c))}
		}, codes.Unavailable, false},
		{"wrong role (blend)", func() []grpc.DialOption {
			return []grpc.DialOption{p.identity(t, mtls.Blend).DialOption(mtls.Worker)}
		}, codes.PermissionDenied, false},
		{"wrong role (worker)", func() []grpc.DialOption {
			return []grpc.DialOption{p.identity(t, mtls.Worker).DialOption(mtls.Worker)}
		}, codes.PermissionDenied, false},
		{"right role (engine)", func() []grpc.DialOption {
			return []grpc.DialOption{p.identity(t, mtls.Engine).DialOption(mtls.Worker)}
		}, codes.OK, true},
		{"engine expecting another server role", func() []grpc.DialOption {
			return []grpc.DialOption{p.identity(t, mtls.Engine).DialOption(mtls.Blend)}
		}, codes.Unavailable, false},
		{"engine trusting another CA", func() []grpc.DialOption {
			c := p.identity(t, mtls.Engine).ClientTLS(mtls.Worker)
			c.RootCAs = other.pool(t)
			return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(c))}
		}, codes.Unavailable, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := srv.handled.Load()
			got, err := check(t, srv.addr, tc.opt()...)
			if got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
			if handled := srv.handled.Load() > before; handled != tc.handled {
				t.Errorf("handler reached: %v, want %v", handled, tc.handled)
			}
			t.Logf("%v", err)
		})
	}
}

// TestBlendCallers: the blend server admits the engine and the worker, not
// another blend server.
func TestBlendCallers(t *testing.T) {
	p := newPKI(t)
	srv := startServer(t, p.identity(t, mtls.Blend), mtls.BlendCallers...)
	for _, tc := range []struct {
		role mtls.Role
		want codes.Code
	}{{mtls.Engine, codes.OK}, {mtls.Worker, codes.OK}, {mtls.Blend, codes.PermissionDenied}} {
		if got, err := check(t, srv.addr, p.identity(t, tc.role).DialOption(mtls.Blend)); got != tc.want {
			t.Errorf("%s: code %v (%v), want %v", tc.role, got, err, tc.want)
		}
	}
	// localhost is in the certificate's SANs too.
	_, port, _ := net.SplitHostPort(srv.addr)
	if got, err := check(t, net.JoinHostPort("localhost", port), p.identity(t, mtls.Worker).DialOption(mtls.Blend)); got != codes.OK {
		t.Errorf("via localhost: %v (%v)", got, err)
	}
}

// TestStreamAuthorization: streaming methods are checked too.
func TestStreamAuthorization(t *testing.T) {
	p := newPKI(t)
	srv := startServer(t, p.identity(t, mtls.Worker), mtls.WorkerCallers...)
	for _, tc := range []struct {
		role mtls.Role
		want codes.Code
	}{{mtls.Engine, codes.OK}, {mtls.Blend, codes.PermissionDenied}} {
		conn, err := rpc.Dial(srv.addr, p.identity(t, tc.role).DialOption(mtls.Worker))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: Watch: %v (%v), want %v", tc.role, got, err, tc.want)
		}
		cancel()
		conn.Close()
	}
}

// TestPeerRoleWithoutTLS: the interceptor refuses a plaintext connection
// as unauthenticated (a server misconfigured with the interceptor but no
// TLS credentials admits nobody).
func TestPeerRoleWithoutTLS(t *testing.T) {
	srv := rpc.NewServer(grpc.ChainUnaryInterceptor(mtls.UnaryServerInterceptor(mtls.Engine)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	if got, err := check(t, ln.Addr().String()); got != codes.Unauthenticated {
		t.Errorf("code %v (%v), want Unauthenticated", got, err)
	}
	if _, err := mtls.PeerRole(context.Background()); status.Code(err) != codes.Unauthenticated {
		t.Errorf("PeerRole without a peer: %v", err)
	}
}
