package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNormalizeEndpoint(t *testing.T) {
	tests := []struct {
		name, in, proto, want string
		wantErr               bool
	}{
		{"empty", "", "", "", false},
		{"host port http", "127.0.0.1:4318", "", "http://127.0.0.1:4318/v1/traces", false},
		{"url without path", "http://collector:4318", "http/json", "http://collector:4318/v1/traces", false},
		{"url with path kept", "http://c:4318/custom", "http/protobuf", "http://c:4318/custom", false},
		{"grpc no path added", "127.0.0.1:4317", "grpc", "http://127.0.0.1:4317", false},
		{"bad scheme", "ftp://x:1", "", "", true},
		{"no host", "http://", "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NormalizeEndpoint(tc.in, tc.proto)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRuntimeServesMetricsAndLogs(t *testing.T) {
	var logs bytes.Buffer
	env := map[string]string{}
	rt, err := New(context.Background(), Options{ServiceName: "cb-blend", Getenv: func(k string) string { return env[k] }, LogOutput: &logs})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(context.Background())
	if rt.Telemetry.Enabled() {
		t.Fatal("tracing on without endpoint or CB_TRACING")
	}
	addr, err := rt.ServeMetrics("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`cb_build_info{service="cb-blend"`, "cb_trace_spans_dropped_total 0", "go_goroutines"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	rt.Logger.Info("hello")
	if !strings.Contains(logs.String(), `"service":"cb-blend"`) {
		t.Fatalf("log line lacks service: %s", logs.String())
	}
}

// Deps hands the runtime's collaborators to a component; with CB_PROFILE
// off the profile is unset once defaults are applied.
func TestRuntimeDeps(t *testing.T) {
	rt, err := New(context.Background(), Options{ServiceName: "cb-worker", Getenv: func(string) string { return "" }, LogOutput: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(context.Background())
	d := rt.Deps()
	if d.TracerProvider != rt.TracerProvider() || d.Registerer != rt.Registry || d.Logger != rt.Logger {
		t.Fatalf("Deps = %+v", d)
	}
	if p := d.WithDefaults().Profile; p != nil {
		t.Fatalf("profile %#v with CB_PROFILE off", p)
	}
	if d.Spans("x").Profiling() {
		t.Fatal("span helper profiles with CB_PROFILE off")
	}
}

// TestInstanceID: a process's service.instance.id is its listen address when
// that is specific to the host; an address every host may bind alike
// (unspecified, loopback) becomes host name, port and a random per-process
// suffix, so two hosts (or two namespaces sharing a host name) never merge;
// OTEL_RESOURCE_ATTRIBUTES overrides it.
func TestInstanceID(t *testing.T) {
	host, _ := os.Hostname()
	suffix := instanceSuffix()
	if !regexp.MustCompile(`^[0-9a-f]{8}$`).MatchString(suffix) {
		t.Fatalf("instance suffix %q, want 8 hex digits", suffix)
	}
	for _, tc := range []struct{ name, addr, want string }{
		{"routable address", "10.1.2.3:8001", "10.1.2.3:8001"},
		{"routable IPv6", "[fd00::2]:8001", "[fd00::2]:8001"},
		{"empty host", ":8001", net.JoinHostPort(host, "8001") + "/" + suffix},
		{"unspecified IPv4", "0.0.0.0:8001", net.JoinHostPort(host, "8001") + "/" + suffix},
		{"unspecified IPv6", "[::]:8001", net.JoinHostPort(host, "8001") + "/" + suffix},
		{"loopback", "127.0.0.1:8001", net.JoinHostPort(host, "8001") + "/" + suffix},
		{"loopback IPv6", "[::1]:8001", net.JoinHostPort(host, "8001") + "/" + suffix},
		{"localhost", "localhost:8001", net.JoinHostPort(host, "8001") + "/" + suffix},
		{"port at listen time", "10.1.2.3:0", fmt.Sprintf("10.1.2.3:pid%d", os.Getpid())},
		{"loopback, port at listen time", "127.0.0.1:0", net.JoinHostPort(host, fmt.Sprintf("pid%d", os.Getpid())) + "/" + suffix},
		{"not host:port", "nonsense", ""},
	} {
		if got := InstanceID(tc.addr); got != tc.want {
			t.Errorf("%s: InstanceID(%q) = %q, want %q", tc.name, tc.addr, got, tc.want)
		}
	}
	for env, want := range map[string]string{
		"":                               "127.0.0.1:8001",
		"service.instance.id=node-1,a=b": "node-1",
		"deployment.environment=dev,x=y": "127.0.0.1:8001",
	} {
		getenv := func(k string) string {
			if k == "OTEL_RESOURCE_ATTRIBUTES" {
				return env
			}
			return ""
		}
		rt, err := New(context.Background(), Options{ServiceName: "cb-engine", InstanceID: "127.0.0.1:8001", Getenv: getenv, LogOutput: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		cfg := rt.Telemetry.Config()
		rt.Shutdown(context.Background())
		got := cfg.InstanceID
		if got == "" {
			for _, kv := range cfg.ResourceAttributes {
				if kv.Key == "service.instance.id" {
					got = kv.Value.AsString()
				}
			}
		}
		if got != want {
			t.Errorf("OTEL_RESOURCE_ATTRIBUTES=%q: service.instance.id = %q, want %q", env, got, want)
		}
	}
}
