package blend

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	cbservice "github.com/cacheblend/cacheblend/service"
)

// TestStuckLookupWorkerMarksUnhealthy occupies one of the two lookup
// workers past LookupStuckAfter: the gRPC health service turns NOT_SERVING
// and the process's /health 503 with the reason, lookups still run on the
// other worker, and both recover when the worker returns.
func TestStuckLookupWorkerMarksUnhealthy(t *testing.T) {
	const stuckAfter = 150 * time.Millisecond
	e := newEnv(t, Config{LookupWorkers: 2, LookupStuckAfter: stuckAfter})
	conn, err := grpc.NewClient(e.s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	rt, err := cbservice.New(context.Background(), cbservice.Options{ServiceName: "cb-blend", Getenv: func(string) string { return "" }, LogOutput: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(context.Background())
	rt.AddHealthCheck("blend", e.s.Health)
	maddr, err := rt.ServeMetrics("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	httpHealth := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + maddr.String() + "/health")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitStatus := func(want healthpb.HealthCheckResponse_ServingStatus) time.Duration {
		t.Helper()
		t0 := time.Now()
		for {
			ok := true
			for _, svc := range []string{"", cbv1.BlendService_ServiceDesc.ServiceName} {
				resp, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: svc})
				if err != nil {
					t.Fatal(err)
				}
				ok = ok && resp.GetStatus() == want
			}
			if ok {
				return time.Since(t0)
			}
			if time.Since(t0) > 10*time.Second {
				t.Fatalf("gRPC health never became %v", want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitStatus(healthpb.HealthCheckResponse_SERVING)
	if err := e.s.Health(); err != nil {
		t.Fatalf("health at start: %v", err)
	}
	if code, _ := httpHealth(); code != http.StatusOK {
		t.Fatalf("/health at start: %d", code)
	}

	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	blockQueue(t, e.s.lookups.queue, release) // one worker blocked, as in open() of a FIFO
	d := waitStatus(healthpb.HealthCheckResponse_NOT_SERVING)
	t.Logf("NOT_SERVING %v after the lookup began (limit %v)", d.Round(time.Millisecond), stuckAfter)
	err = e.s.Health()
	if err == nil || !strings.Contains(err.Error(), "1 of 2 lookup workers stuck") {
		t.Fatalf("Health with a stuck worker: %v", err)
	}
	if code, body := httpHealth(); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "unavailable: blend: 1 of 2 lookup workers stuck") {
		t.Fatalf("/health with a stuck worker: %d %q", code, body)
	}
	if st := e.s.Stats(); st.LookupsStuck != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The other worker still serves lookups.
	if res := e.lookup(&cbv1.LookupRequest{RequestId: "ok", Tokens: []int32{1, 2, 3}}); res.GetRequestedTokens() != 3 {
		t.Fatalf("lookup on the free worker: %+v", res)
	}

	free()
	waitStatus(healthpb.HealthCheckResponse_SERVING)
	if err := e.s.Health(); err != nil {
		t.Fatalf("health after the worker returned: %v", err)
	}
	if code, body := httpHealth(); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/health after the worker returned: %d %q", code, body)
	}
}

func TestHealthLifecycle(t *testing.T) {
	s, err := New(Config{}, component.Deps{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Health(); err == nil || !strings.Contains(err.Error(), "not started") {
		t.Fatalf("before Start: %v", err)
	}
	if s.cfg.LookupStuckAfter != DefaultLookupStuckAfter || watchInterval(DefaultLookupStuckAfter) != time.Second {
		t.Fatalf("default %v", s.cfg.LookupStuckAfter)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Health(); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("after Shutdown: %v", err)
	}
}
