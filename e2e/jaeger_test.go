package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/internal/freeport"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// The Jaeger under test: github.com/jaegertracing/jaeger/cmd/jaeger, pinned
// as a tool of the tools module (../tools/go.mod).
const jaegerVersion = "v1.76.0"

// jaegerBuild resolves the Jaeger binary once per test binary.
var jaegerBuild struct {
	once sync.Once
	path string
	took time.Duration
	err  error
}

// jaegerBinary returns the Jaeger binary: $CB_JAEGER_BIN when set, else the
// tools module's `go tool -n jaeger`, which builds Jaeger into the Go build
// cache the first time (minutes) and afterwards only prints the cached
// executable's path (seconds).
func jaegerBinary(t *testing.T) string {
	t.Helper()
	jaegerBuild.once.Do(func() {
		start := time.Now()
		defer func() { jaegerBuild.took = time.Since(start) }()
		if p := os.Getenv("CB_JAEGER_BIN"); p != "" {
			if _, err := os.Stat(p); err != nil {
				jaegerBuild.err = fmt.Errorf("CB_JAEGER_BIN: %w", err)
				return
			}
			jaegerBuild.path = p
			return
		}
		cmd := exec.Command("go", "tool", "-n", "jaeger")
		cmd.Dir = filepath.Join("..", "tools")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			jaegerBuild.err = fmt.Errorf("go tool -n jaeger (in tools/): %w\n%s", err, stderr.String())
			return
		}
		p := strings.TrimSpace(string(out))
		if _, err := os.Stat(p); err != nil {
			jaegerBuild.err = fmt.Errorf("go tool -n jaeger printed %q: %w", p, err)
			return
		}
		jaegerBuild.path = p
	})
	if jaegerBuild.err != nil {
		t.Fatalf("jaeger %s: %v", jaegerVersion, jaegerBuild.err)
	}
	t.Logf("jaeger %s: %s (resolved in %s)", jaegerVersion, jaegerBuild.path, jaegerBuild.took.Round(time.Millisecond))
	return jaegerBuild.path
}

// jaegerConfig is a Jaeger v2 (OpenTelemetry Collector) configuration: OTLP
// gRPC and HTTP receivers, memory storage, the query service (HTTP API + UI,
// and its gRPC API) — everything on loopback, no other listener (internal
// metrics off, no health check, no sampling endpoints, no self-tracing).
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memstore
    enable_tracing: false
    max_clock_skew_adjust: 0s
    http:
      endpoint: 127.0.0.1:%[3]d
    grpc:
      endpoint: 127.0.0.1:%[4]d
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%[1]d
      http:
        endpoint: 127.0.0.1:%[2]d
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// jaegerServer is a running Jaeger process.
type jaegerServer struct {
	otlpGRPC, otlpHTTP string // host:port
	queryURL           string // http://host:port
	logs               *syncWriter
}

// startJaeger runs Jaeger on free loopback ports and waits until its OTLP
// receivers and query API answer; it is stopped when the test ends.
func startJaeger(t *testing.T, bin string) *jaegerServer {
	t.Helper()
	ports, err := freeport.Ports(4)
	if err != nil {
		t.Fatal(err)
	}
	j := &jaegerServer{
		otlpGRPC: fmt.Sprintf("127.0.0.1:%d", ports[0]),
		otlpHTTP: fmt.Sprintf("127.0.0.1:%d", ports[1]),
		queryURL: fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
		logs:     &syncWriter{},
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, jaegerConfig, ports[0], ports[1], ports[2], ports[3]), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = j.logs, j.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	for _, kv := range os.Environ() { // keep the test's OTEL_* settings away from Jaeger's own SDK
		if !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start jaeger: %v", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("jaeger did not stop on SIGTERM within 10s; killing its process group")
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("jaeger log:\n%s", tail(j.logs.String(), 40))
		}
	})

	// Ready: the query API answers and both receivers accept connections.
	hc := &http.Client{Timeout: 2 * time.Second}
	ready := func() bool {
		for _, addr := range []string{j.otlpGRPC, j.otlpHTTP} {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return false
			}
			c.Close()
		}
		resp, err := hc.Get(j.queryURL + "/api/services")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	start := time.Now()
	for deadline := start.Add(60 * time.Second); !ready(); {
		select {
		case <-exited:
			t.Fatalf("jaeger exited before it was ready (%v); log:\n%s", waitErr, tail(j.logs.String(), 40))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger not ready after 60s; log:\n%s", tail(j.logs.String(), 40))
		}
	}
	hc.CloseIdleConnections()
	t.Logf("jaeger ready in %s: otlp grpc %s, otlp http %s, query %s", time.Since(start).Round(time.Millisecond), j.otlpGRPC, j.otlpHTTP, j.queryURL)
	return j
}

// otlpProxy forwards OTLP/HTTP requests to Jaeger and counts them by
// method, path and Content-Type.
type otlpProxy struct {
	url  string
	mu   sync.Mutex
	seen map[string]int
}

func newOTLPProxy(t *testing.T, target string) *otlpProxy {
	t.Helper()
	p := &otlpProxy{seen: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: target})
	tr := &http.Transport{}
	rp.Transport = tr
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		p.mu.Lock()
		p.seen[r.Method+" "+r.URL.Path+" "+ct]++
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	p.url = srv.URL
	return p
}

func (p *otlpProxy) requests() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.seen)
}

// waitHealthy waits until the engine's /health answers 200: the engine
// announces READY before its worker has answered, and until then requests
// fail with 503 worker_unavailable.
func waitHealthy(t *testing.T, e *env) {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := hc.Get(e.api + "/health")
		if err != nil {
			last = err.Error()
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		last = resp.Status
	}
	t.Fatalf("engine not healthy after 30s: %s", last)
}

// endpoint returns the OTLP traces endpoint of Jaeger for a protocol, in the
// form telemetry expects (full URL with /v1/traces for HTTP).
func (j *jaegerServer) endpoint(protocol string) string {
	if protocol == "grpc" {
		return "http://" + j.otlpGRPC
	}
	return "http://" + j.otlpHTTP + "/v1/traces"
}

// jaegerTagType is the Jaeger tag type an attribute of a contract type must
// keep through Jaeger.
var jaegerTagType = map[contract.AttrType]string{
	contract.AttrString: jaeger.TypeString,
	contract.AttrInt:    jaeger.TypeInt64,
	contract.AttrDouble: jaeger.TypeFloat64,
	contract.AttrBool:   jaeger.TypeBool,
}

// TestJaeger exports the stack's traces to a real Jaeger with each OTLP
// protocol and checks Jaeger's copy of a RAG request's trace against the
// contract.
func TestJaeger(t *testing.T) {
	bin := jaegerBinary(t)
	j := startJaeger(t, bin)
	spec, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		protocol string
		traceID  string
	}{
		{"grpc", "4bf92f3577b34da6a3ce929d0e0e4701"},
		{"http/protobuf", "4bf92f3577b34da6a3ce929d0e0e4702"},
		{"http/json", "4bf92f3577b34da6a3ce929d0e0e4703"},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.protocol, "/", "_"), func(t *testing.T) {
			start := time.Now()
			endpoint := j.endpoint(tc.protocol)
			var proxy *otlpProxy
			if tc.protocol != "grpc" {
				// Through a proxy that records what the exporters send, to
				// see that each HTTP protocol is the one on the wire.
				proxy = newOTLPProxy(t, j.otlpHTTP)
				endpoint = proxy.url + "/v1/traces"
			}
			e := startEnv(t, options{otlpEndpoint: endpoint, otlpProtocol: tc.protocol, queryURL: j.queryURL})
			waitHealthy(t, e)
			e.ingest()
			e.chat("00-"+tc.traceID+"-00f067aa0ba902b7-01", ragPrompt(4, 1, 6), 4)
			// Stop the processes: each flushes its spans to Jaeger on the way
			// out, so the trace read below is complete. (The cleanup's second
			// Shutdown is a no-op.)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := e.stack.Shutdown(ctx)
			cancel()
			if err != nil {
				t.Fatalf("stack shutdown: %v", err)
			}
			e.trace(tc.traceID, "chat cb-llama", spanname.EngineQueue, spanname.EnginePrefill, spanname.EngineDecode,
				spanname.CBRequest, spanname.CBSchedule, spanname.CBLookupRPC, spanname.CBBuildMeta, spanname.CBLookup, spanname.MPLookupPrefetch,
				spanname.CBFingerprintMatch, spanname.CBSparsePrefetch, spanname.CBClassify, spanname.CBExecute, spanname.CBStartLoadKV,
				spanname.CBRetrieve, spanname.CBScatter, spanname.CBModelForward, spanname.CBFullRecomp, spanname.CBCheck, spanname.CBPartial)

			// Jaeger's copy, read once more after it is complete: exactly
			// what is checked below.
			jc, err := jaeger.NewClient(j.queryURL, jaeger.ClientConfig{HTTPClient: &http.Client{Timeout: 10 * time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			raw, err := jc.Trace(context.Background(), tc.traceID)
			if err != nil {
				t.Fatal(err)
			}
			trs, err := tracecheck.FromJaeger(raw)
			if err != nil {
				t.Fatal(err)
			}
			if len(trs) != 1 || trs[0].TraceID != tc.traceID {
				t.Fatalf("Jaeger returned %d traces for %s", len(trs), tc.traceID)
			}
			tr := &trs[0]
			if rep := tracecheck.Check(trs, spec); !rep.OK() {
				t.Fatalf("contract check of Jaeger's copy failed:\n%s", rep.String())
			}
			if proxy != nil {
				want := map[string]string{"http/protobuf": "application/x-protobuf", "http/json": "application/json"}[tc.protocol]
				seen := proxy.requests()
				if len(seen) != 1 || seen["POST /v1/traces "+want] == 0 {
					t.Errorf("OTLP requests %v, want only POST /v1/traces %s", seen, want)
				}
			}
			checkJaegerTrace(t, tr)
			checkJaegerTagTypes(t, raw, spec)
			t.Logf("%s: %d spans from %d processes in Jaeger; subtest took %s",
				tc.protocol, len(tr.Spans), len(raw.Processes), time.Since(start).Round(time.Millisecond))
		})
	}
}

// checkJaegerTrace checks the services and the cross-process parent
// references (docs/design.md §6) of the trace as Jaeger returned it.
func checkJaegerTrace(t *testing.T, tr *tracecheck.Trace) {
	t.Helper()
	services := map[string]bool{}
	for _, s := range tr.Spans {
		services[s.Service] = true
	}
	if len(services) != 3 || !services["cb-engine"] || !services["cb-worker"] || !services["cb-blend"] {
		t.Errorf("services %v, want cb-engine, cb-worker, cb-blend", services)
	}
	spans := byName(tr)
	root := spans["chat cb-llama"]
	if len(root) != 1 || root[0].ParentSpanID != "00f067aa0ba902b7" || root[0].Service != "cb-engine" {
		t.Errorf("server span %+v, want one cb-engine span, child of the caller's 00f067aa0ba902b7", root)
	}
	remote := []struct{ child, parent, childSvc, parentSvc string }{
		{spanname.CBLookup, spanname.CBLookupRPC, "cb-blend", "cb-engine"},
		{spanname.CBRetrieve, spanname.CBStartLoadKV, "cb-blend", "cb-worker"},
		{spanname.CBExecute, spanname.CBRequest, "cb-worker", "cb-engine"},
	}
	for _, r := range remote {
		if len(spans[r.child]) == 0 {
			t.Errorf("no %s span", r.child)
		}
		for _, s := range spans[r.child] {
			p := spanByID(tr, s.ParentSpanID)
			if p == nil || p.Name != r.parent || s.Service != r.childSvc || p.Service != r.parentSvc {
				t.Errorf("%s (%s) has parent %+v, want %s of %s", r.child, s.Service, p, r.parent, r.parentSvc)
			}
		}
	}
}

// checkJaegerTagTypes checks that every attribute the contract types kept its
// type in Jaeger (int as int64, double as float64, bool as bool), and that
// each of those types was seen at least once.
func checkJaegerTagTypes(t *testing.T, raw jaeger.Trace, spec *contract.SpanSet) {
	t.Helper()
	seen := map[string]int{}
	for _, s := range raw.Spans {
		cs, ok := spec.Match(s.OperationName)
		if !ok {
			continue
		}
		for _, kv := range s.Tags {
			at, ok := cs.AttributeType(kv.Key)
			if !ok {
				continue
			}
			want := jaegerTagType[at]
			if kv.Type != want {
				t.Errorf("%s: tag %s is %s %v in Jaeger, want %s (contract: %s)", s.OperationName, kv.Key, kv.Type, kv.Value, want, at)
				continue
			}
			if want == jaeger.TypeInt64 { // an int64 beyond 2^53 comes as a decimal string
				if _, err := strconv.ParseInt(kv.AsString(), 10, 64); err != nil {
					t.Errorf("%s: int64 tag %s = %v: %v", s.OperationName, kv.Key, kv.Value, err)
				}
			}
			seen[want]++
		}
	}
	var missing []error
	for _, ty := range []string{jaeger.TypeInt64, jaeger.TypeFloat64, jaeger.TypeBool, jaeger.TypeString} {
		if seen[ty] == 0 {
			missing = append(missing, fmt.Errorf("no %s tag", ty))
		}
	}
	if err := errors.Join(missing...); err != nil {
		t.Errorf("typed attributes in Jaeger: %v (seen %v)", err, seen)
	}
	t.Logf("contract attributes with their types kept in Jaeger: %v", seen)
}
