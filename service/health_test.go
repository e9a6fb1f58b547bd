package service

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/httpserve"
)

func TestHealthChecks(t *testing.T) {
	rt, err := New(context.Background(), Options{ServiceName: "cb-blend", Getenv: func(string) string { return "" }, LogOutput: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(context.Background())
	var stuck atomic.Bool
	rt.AddHealthCheck("lookup workers", func() error {
		if stuck.Load() {
			return errors.New("worker 0 busy for 31s")
		}
		return nil
	})
	addr, err := rt.ServeMetrics("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	health := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr.String() + "/health")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := health(); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("healthy: %d %q", code, body)
	}
	stuck.Store(true)
	if code, body := health(); code != http.StatusServiceUnavailable || body != "unavailable: lookup workers: worker 0 busy for 31s\n" {
		t.Fatalf("stuck: %d %q", code, body)
	}
	stuck.Store(false)
	if code, _ := health(); code != http.StatusOK {
		t.Fatalf("recovered: %d", code)
	}
	var detail atomic.Value
	detail.Store("")
	rt.AddHealthDetail("blend", func() string { return detail.Load().(string) })
	if code, body := health(); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("empty detail: %d %q", code, body)
	}
	detail.Store("off: gate failed\nsecond line")
	if code, body := health(); code != http.StatusOK || body != "ok\nblend: off: gate failed; second line\n" {
		t.Fatalf("with a detail: %d %q", code, body)
	}
}

func TestServeLimits(t *testing.T) {
	rt, err := New(context.Background(), Options{ServiceName: "cb-worker", Getenv: func(string) string { return "" }, LogOutput: io.Discard,
		HTTP: httpserve.Limits{ReadHeaderTimeout: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(context.Background())
	if l := rt.httpLimits; l.MaxConns != DefaultMaxConns || l.ReadTimeout != httpserve.DefaultReadTimeout || l.ReadHeaderTimeout != 100*time.Millisecond {
		t.Fatalf("limits %+v", l)
	}
	addr, err := rt.ServeMetrics("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /health HTTP/1.1\r\n") // and never the rest
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	t0 := time.Now()
	b, err := io.ReadAll(c)
	if err != nil || time.Since(t0) > 5*time.Second || (len(b) != 0 && !strings.Contains(string(b), "408")) {
		t.Fatalf("slow headers: %q, %v after %v; want the connection closed", b, err, time.Since(t0))
	}
}
