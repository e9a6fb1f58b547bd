package rpc

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestRedialerDue(t *testing.T) {
	t0 := time.Unix(100, 0)
	for _, tc := range []struct {
		name  string
		calls []time.Duration // after t0
		want  []bool
	}{
		{"first is due", []time.Duration{0}, []bool{true}},
		{"burst: one reset", []time.Duration{0, time.Millisecond, 50 * time.Millisecond}, []bool{true, false, false}},
		{"spaced: every one", []time.Duration{0, RedialEvery, 2 * RedialEvery}, []bool{true, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var now time.Time
			r := &redialer{now: func() time.Time { return now }}
			for i, d := range tc.calls {
				now = t0.Add(d)
				if got := r.due(); got != tc.want[i] {
					t.Fatalf("call %d at %v: due %v, want %v", i, d, got, tc.want[i])
				}
			}
		})
	}
}

// serveHealth serves the gRPC health service on addr ("127.0.0.1:0" picks
// a port) until the returned stop.
func serveHealth(t *testing.T, addr string) (string, func()) {
	t.Helper()
	var lis net.Listener
	var err error
	for range 50 { // the port of a stopped server may take a moment to free
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	return lis.Addr().String(), srv.Stop
}

// TestDialReconnectsToRestartedPeer: a peer down through many failed calls
// (which would grow gRPC's default backoff to tens of seconds) is reached
// again once it listens, by a call that does not wait for readiness: the
// failed calls keep resetting the backoff (redialer), and the bounded
// backoff caps the wait.
func TestDialReconnectsToRestartedPeer(t *testing.T) {
	addr, stop := serveHealth(t, "127.0.0.1:0")
	conn, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	check := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(); err != nil {
		t.Fatal(err)
	}
	stop()
	for i := range 20 { // the peer is down: every call fails, none hangs
		if err := check(); status.Code(err) != codes.Unavailable {
			t.Fatalf("call %d with the peer down: %v", i, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, stop = serveHealth(t, addr)
	defer stop()
	// Probing like the engine does (a fail-fast call every 100 ms) reaches
	// it again; the bound is generous (the backoff alone caps it near
	// ConnectMaxDelay), it only rules out gRPC's default backoff.
	deadline := time.Now().Add(10 * time.Second)
	for check() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the restarted peer was not reached")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDialConnectsBeforeFirstCall: a dialled connection is READY without any
// call (the first request does not pay the handshakes), and stays so.
func TestDialConnectsBeforeFirstCall(t *testing.T) {
	addr, stop := serveHealth(t, "127.0.0.1:0")
	defer stop()
	conn, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("no call made: connection stayed %v, want READY", s)
		}
	}
}
