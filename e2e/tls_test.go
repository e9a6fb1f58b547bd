package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/mtls"
)

// TestUpMutualTLS runs `cb up` (mutual TLS on by default): the stack
// serves requests with reuse over its authenticated hops, while on the
// worker's and the blend server's gRPC ports a plaintext client and a TLS
// client without a certificate are refused at the handshake and a client
// with the wrong role's certificate is refused by the role check; at exit
// the certificates are gone.
func TestUpMutualTLS(t *testing.T) {
	dir := t.TempDir()
	epsPath := filepath.Join(dir, "endpoints.json")
	cmd := exec.Command(cbBin, "up", "--api", "127.0.0.1:0", "--ui-addr", "127.0.0.1:0", "--endpoints-file", epsPath, "--state-dir", filepath.Join(dir, "state"))
	cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=")
	var out syncWriter
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited, done := waitCmd(cmd)
	defer func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("cb up output:\n%s", tail(out.String(), 60))
		}
	}()
	var b []byte
	deadline := time.Now().Add(90 * time.Second)
	for {
		var err error
		if b, err = os.ReadFile(epsPath); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no endpoints file")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var eps struct {
		Engine, Worker, Blend struct {
			API, GRPC, Metrics string
			PID                int
		}
		MutualTLS bool `json:"mutual_tls"`
	}
	if err := json.Unmarshal(b, &eps); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if !eps.MutualTLS {
		t.Fatalf("endpoints file says no mutual TLS: %s", b)
	}

	// The stack serves normally: documents stored (worker → blend Store),
	// a RAG request looked up (engine → blend), its KV retrieved (worker →
	// blend), executed (engine → worker).
	e := &env{t: t, api: eps.Engine.API}
	e.ingest()
	if got := e.chat("", ragPrompt(2, 0), 2); got["choices"] == nil {
		t.Fatalf("chat answer %v", got)
	}
	blendMetrics, err := httpGet(eps.Blend.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"lmcache_blend_store_requests_total", "lmcache_blend_lookup_requests_total",
		"lmcache_blend_retrieve_requests_total", "lmcache_blend_scattered_tokens_total"} {
		if metricValue(blendMetrics, m) <= 0 {
			t.Errorf("%s is 0: a hop did not work over mutual TLS\n%s", m, grepLines(blendMetrics, "lmcache_blend_"))
		}
	}

	// The certificates cb up handed the worker: a private directory.
	tlsDir := certDirOf(t, eps.Worker.PID)
	if fi, err := os.Stat(tlsDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("certificate directory %s: %v %v", tlsDir, fi, err)
	}
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(tlsDir, mtls.CAFile))
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA: %v", err)
	}
	identity := func(r mtls.Role) *mtls.Identity {
		id, err := mtls.Load(mtls.DirFiles(tlsDir, r), r)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	plaintext := grpc.WithTransportCredentials(insecure.NewCredentials())
	noCert := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}))

	worker := func(opt grpc.DialOption) error {
		return call(t, eps.Worker.GRPC, opt, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := cbv1.NewWorkerServiceClient(cc).Info(ctx, &cbv1.InfoRequest{})
			return err
		})
	}
	blendLookup := func(opt grpc.DialOption) error {
		return call(t, eps.Blend.GRPC, opt, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := cbv1.NewBlendServiceClient(cc).Lookup(ctx, &cbv1.LookupRequest{RequestId: "tls-probe", Tokens: []int32{1, 2, 3}, WorldSize: 1})
			return err
		})
	}
	blendHealth := func(opt grpc.DialOption) error {
		return call(t, eps.Blend.GRPC, opt, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			return err
		})
	}
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"worker, plaintext", worker(plaintext), codes.Unavailable},
		{"worker, TLS without a certificate", worker(noCert), codes.Unavailable},
		{"worker, the blend server's certificate", worker(identity(mtls.Blend).DialOption(mtls.Worker)), codes.PermissionDenied},
		{"worker, the engine's certificate", worker(identity(mtls.Engine).DialOption(mtls.Worker)), codes.OK},
		{"blend, plaintext", blendLookup(plaintext), codes.Unavailable},
		{"blend, TLS without a certificate", blendLookup(noCert), codes.Unavailable},
		{"blend, the blend server's certificate", blendLookup(identity(mtls.Blend).DialOption(mtls.Blend)), codes.PermissionDenied},
		{"blend health, plaintext", blendHealth(plaintext), codes.Unavailable},
		{"blend health, the worker's certificate", blendHealth(identity(mtls.Worker).DialOption(mtls.Blend)), codes.OK},
		{"blend, the engine's certificate", blendLookup(identity(mtls.Engine).DialOption(mtls.Blend)), codes.OK},
	} {
		if got := status.Code(tc.err); got != tc.want {
			t.Errorf("%s: %v (%v), want %v", tc.name, got, tc.err, tc.want)
		}
		t.Logf("%s: %v", tc.name, tc.err)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("cb up exited with %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("cb up did not stop on SIGINT")
	}
	if _, err := os.Stat(tlsDir); !os.IsNotExist(err) {
		t.Errorf("certificates left after cb up stopped: %v", err)
	}
}

// call dials addr with opt and runs f with a 10 s deadline.
func call(t *testing.T, addr string, opt grpc.DialOption, f func(context.Context, *grpc.ClientConn) error) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f(ctx, cc)
}

// certDirOf returns the directory of the --tls-ca file on process pid's
// command line.
func certDirOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		t.Fatalf("no /proc (the stack is Linux only): %v", err)
	}
	args := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	for i := 0; i+1 < len(args); i++ {
		if string(args[i]) == "--tls-ca" {
			return filepath.Dir(string(args[i+1]))
		}
	}
	t.Fatalf("no --tls-ca among %q", args)
	return ""
}
