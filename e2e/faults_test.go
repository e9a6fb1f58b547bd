package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/internal/freeport"
	"github.com/cacheblend/cacheblend/tracestore"
)

// TestBlendKilledRequestsStillServedThenReuseResumes kills cb blend: the
// stack keeps serving (full prefill, the lookup failure recorded on the
// span), cb up restarts it, the worker re-registers its KV memory and
// reuse comes back.
func TestBlendKilledRequestsStillServedThenReuseResumes(t *testing.T) {
	e := startEnv(t, options{})
	sup := e.stack.Supervisor()
	// The worker registers its KV memory after it announced itself ready:
	// the kill must end a registration, not race it.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(e.logs.String(), "registered KV memory with the blend server"); {
		if time.Now().After(deadline) {
			t.Fatal("the worker never registered its KV memory")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := sup.Signal("cb-blend", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Served while the blend server is down (or restarting): a full prefill
	// whose trace still meets the contract, cb.request saying why there was
	// no lookup result.
	e.chat("00-2bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ragPrompt(1, 2), 2)
	down := e.settledTrace("2bf92f3577b34da6a3ce929d0e0e4736", "chat cb-llama", spanname.CBRequest, spanname.CBExecute, spanname.EngineDecode)
	checkContract(t, down)
	lookup := strAttr(down, spanname.CBRequest, "lookup")
	t.Logf("request served while the blend server was down: lookup %q", lookup)
	if !slices.Contains([]string{"unavailable", "timeout", "error", "done"}, lookup) {
		t.Errorf("cb.request lookup %q during the outage", lookup)
	}

	// cb up restarted it.
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := sup.Status()
		restarted := false
		for _, s := range st {
			if s.Name == "cb-blend" && s.Restarts >= 1 && s.Ready {
				restarted = true
			}
		}
		if restarted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cb-blend not restarted: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(e.logs.String(), "process died; restarting") {
		t.Error("cb up did not report the crash")
	}
	// Reuse resumes: once the worker has re-registered (within its 1 s
	// interval) a stored prompt is found again and its KV loaded (the
	// lookup alone works before that: a retrieve needs the registration).
	e.ingest()
	loaded := 0
	for i := 0; i < 20 && loaded == 0; i++ {
		tp := fmt.Sprintf("00-3bf92f3577b34da6a3ce929d0e00%04x-00f067aa0ba902b7-01", i)
		e.chat(tp, ragPrompt(3, 0), 2)
		tr := e.settledTrace(tp[3:35], spanname.CBRequest, spanname.CBExecute, spanname.EngineDecode)
		checkContract(t, tr)
		for _, s := range tr.Spans {
			if s.Name == spanname.CBStartLoadKV {
				n, _ := attrInt(&s, "scattered_tokens")
				loaded += n
			}
		}
		if loaded == 0 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	if loaded == 0 {
		t.Fatal("reuse did not resume after the blend server restarted: no KV loaded")
	}
	// Over the KV socket: the worker's registration ended with the killed
	// server's connection and its memfd was handed to the new one.
	logs := e.logs.String()
	if !strings.Contains(logs, "the blend server ended the KV registration") ||
		strings.Count(logs, "registered KV memory with the blend server") < 2 {
		t.Error("the worker did not register its KV memory again over the socket")
	}
}

// TestWorkerKilledFailsFastThenRecovers kills cb worker under a request in
// flight: it fails fast with 503 and its error type, new requests get 503
// until cb up has restarted the worker, then requests succeed again.
func TestWorkerKilledFailsFastThenRecovers(t *testing.T) {
	e := startEnv(t, options{})
	type answer struct {
		code int
		body string
		took time.Duration
	}
	done := make(chan answer, 1)
	go func() {
		start := time.Now()
		code, body := e.rawChat(`{"model":"cb-llama","max_tokens":4000,"ignore_eos":true,"messages":[{"role":"user","content":"count"}]}`)
		done <- answer{code, body, time.Since(start)}
	}()
	time.Sleep(1500 * time.Millisecond) // decoding by now
	killed := time.Now()
	if err := e.stack.Supervisor().Signal("cb-worker", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var a answer
	select {
	case a = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the in-flight request hangs after the worker died")
	}
	if a.code != 503 || !strings.Contains(a.body, `"type"`) {
		t.Fatalf("in-flight request: %d %s", a.code, a.body)
	}
	t.Logf("in-flight request failed %v after the kill", time.Since(killed).Round(time.Millisecond))
	// New requests fail with 503 until the worker is back, then succeed.
	saw503, ok := false, false
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) && !ok {
		code, body := e.rawChat(`{"model":"cb-llama","max_tokens":2,"messages":[{"role":"user","content":"hello"}]}`)
		switch code {
		case 503:
			saw503 = true
			time.Sleep(100 * time.Millisecond)
		case 200:
			ok = true
		default:
			t.Fatalf("unexpected %d %s", code, body)
		}
	}
	if !ok {
		t.Fatal("requests did not succeed again after the worker restarted")
	}
	if !saw503 {
		t.Log("the worker came back before the first new request (no 503 observed)")
	}
	// The engine's metrics recorded the failure with its error_type.
	resp, err := http.Get(e.api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `error_type="worker_unavailable"`) {
		t.Fatalf("no worker_unavailable request recorded in /metrics")
	}
}

// hangingServer accepts connections and never answers.
func hangingServer(t *testing.T, addr string) (stop func()) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}
}

func p99(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*0.99))]
}

// TestCollectorHangingDoesNotSlowRequests points every process at a
// collector that accepts connections and never answers: requests are not
// slower (p99 compared with a run against a working collector in the same
// test), failed exports are counted on /metrics, and export resumes when a
// working collector comes back on the same address.
func TestCollectorHangingDoesNotSlowRequests(t *testing.T) {
	ports, err := freeport.Ports(2)
	if err != nil {
		t.Fatal(err)
	}
	otlpAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	queryAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	stopHang := hangingServer(t, otlpAddr)
	e := startEnv(t, options{
		otlpEndpoint: "http://" + otlpAddr + "/v1/traces", otlpProtocol: "http/protobuf", queryURL: "http://" + queryAddr,
		extraEnv: []string{"OTEL_EXPORTER_OTLP_TIMEOUT=500"},
	})
	const n = 30
	run := func(prefix string) []time.Duration {
		var ds []time.Duration
		for i := range n {
			start := time.Now()
			e.chat(fmt.Sprintf("00-%s%04x-00f067aa0ba902b7-01", prefix, i), "short prompt", 2)
			ds = append(ds, time.Since(start))
		}
		return ds
	}
	run("5bf92f3577b34da6a3ce929d0e00") // warm up
	hanging := run("6bf92f3577b34da6a3ce929d0e00")
	// Exports fail (time out) and are counted.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(e.metricsText(), "cb_trace_export_errors_total") || metricValue(e.metricsText(), "cb_trace_export_errors_total") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no export error counted:\n%s", grepLines(e.metricsText(), "cb_trace_"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The collector comes back on the same address: export resumes.
	stopHang()
	col, err := tracestore.New(tracestore.Config{OTLPAddr: otlpAddr, QueryAddr: queryAddr}, component.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := col.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer col.Shutdown(context.Background())
	up := run("7bf92f3577b34da6a3ce929d0e00")
	// The requests served once the collector is back are traced in full.
	checkContract(t, e.settledTrace("7bf92f3577b34da6a3ce929d0e00"+fmt.Sprintf("%04x", n-1), "chat cb-llama", spanname.CBRequest,
		spanname.CBExecute, spanname.EngineDecode))
	ph, pu := p99(hanging), p99(up)
	t.Logf("p99 with the collector hanging %v, with it up %v (n=%d each)", ph, pu, n)
	// A few milliseconds of noise on a loaded 2-core machine; a blocked
	// export would add the 500 ms export timeout.
	if ph > pu+200*time.Millisecond {
		t.Fatalf("requests slower with the collector hanging: p99 %v vs %v", ph, pu)
	}
}

func (e *env) metricsText() string {
	resp, err := http.Get(e.api + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// metricValue returns the value of an unlabelled sample (0 when absent).
func metricValue(text, name string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

func pidOf(t *testing.T, e *env, name string) (pid, restarts int) {
	for _, s := range e.stack.Supervisor().Status() {
		if s.Name == name {
			return s.PID, s.Restarts
		}
	}
	t.Fatalf("no process %s", name)
	return 0, 0
}

// waitRestart waits until name runs again under a new pid.
func waitRestart(t *testing.T, e *env, name string, oldPID int) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range e.stack.Supervisor().Status() {
			if s.Name == name && s.PID != oldPID && s.Ready {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s not restarted", name)
}

// holdsMemfd reports whether process pid has the KV memfd open.
func holdsMemfd(t *testing.T, pid int) bool {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("no %s (the stack is Linux only): %v", dir, err)
	}
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "/memfd:cb-kv") {
			return true
		}
	}
	return false
}

// TestSIGTERMUnderLoad sends SIGTERM to the worker, the blend server and
// the engine while requests are in flight: every request finishes or fails cleanly (an
// OpenAI-shaped error, never a broken connection or a hang), the worker's
// KV memory is a memfd that leaves no file behind, and the engine flushes
// its spans.
func TestSIGTERMUnderLoad(t *testing.T) {
	e := startEnv(t, options{})
	// Every request served during a fault carries a traceparent; their traces
	// are checked against the contract at the end (failed requests need not
	// have every span, but what they have must be true).
	var faultTraces []string // read on this goroutine only
	traceparent := func(phase, i int) string {
		tp := fmt.Sprintf("00-c%dbf92f3577b34da6a3ce929d0e00%03x-00f067aa0ba902b7-01", phase, i)
		faultTraces = append(faultTraces, tp[3:35])
		return tp
	}
	phase := 0
	inflight := func(n int) chan string {
		out := make(chan string, n)
		phase++
		for i := range n {
			tp := traceparent(phase, i)
			go func() {
				code, body := e.rawChatTraced(tp, fmt.Sprintf(`{"model":"cb-llama","max_tokens":60,"ignore_eos":true,"messages":[{"role":"user","content":"request %d"}]}`, i))
				switch {
				case code == 200:
					out <- "ok"
				case code >= 400 && strings.Contains(body, `"error"`):
					out <- fmt.Sprintf("failed cleanly: %d", code)
				default:
					out <- fmt.Sprintf("BROKEN: %d %s", code, body)
				}
			}()
		}
		return out
	}
	collect := func(ch chan string, n int) []string {
		var got []string
		for range n {
			select {
			case r := <-ch:
				got = append(got, r)
			case <-time.After(90 * time.Second):
				t.Fatal("a request hangs")
			}
		}
		for _, r := range got {
			if strings.HasPrefix(r, "BROKEN") {
				t.Errorf("request did not end cleanly: %s", r)
			}
		}
		return got
	}

	// The worker.
	wpid, _ := pidOf(t, e, "cb-worker")
	// The KV memory is a memfd: the worker holds it, nothing names it.
	if !holdsMemfd(t, wpid) {
		t.Fatalf("worker %d holds no memfd:cb-kv", wpid)
	}
	if shm, _ := filepath.Glob(fmt.Sprintf("/dev/shm/cb-kv-%d-*", wpid)); len(shm) != 0 {
		t.Fatalf("worker %d has shared-memory files: %v", wpid, shm)
	}
	ch := inflight(4)
	time.Sleep(700 * time.Millisecond)
	if err := e.stack.Supervisor().Signal("cb-worker", syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	t.Logf("worker SIGTERM: %v", collect(ch, 4))
	waitRestart(t, e, "cb-worker", wpid)
	if shm, _ := filepath.Glob(fmt.Sprintf("/dev/shm/cb-kv-%d-*", wpid)); len(shm) != 0 {
		t.Fatalf("the worker left shared-memory files: %v", shm)
	}

	// The blend server: requests in flight lose their reuse at worst and
	// are computed in full; every one succeeds.
	e.ingest()
	bpid, _ := pidOf(t, e, "cb-blend")
	ch = make(chan string, 3)
	phase++
	for i := range 3 {
		tp := traceparent(phase, i)
		go func() {
			code, body := e.rawChatTraced(tp, fmt.Sprintf(`{"model":"cb-llama","max_tokens":20,"ignore_eos":true,"messages":[{"role":"user","content":%q}]}`, ragPrompt(i, i+2)))
			if code == 200 {
				ch <- "ok"
			} else {
				ch <- fmt.Sprintf("BROKEN: %d %s", code, body)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if err := e.stack.Supervisor().Signal("cb-blend", syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	t.Logf("blend SIGTERM: %v", collect(ch, 3))
	waitRestart(t, e, "cb-blend", bpid)

	// The engine: its spans of the requests it finished are flushed on
	// the way out.
	epid, _ := pidOf(t, e, "cb-engine")
	traced := "00-8bf92f3577b34da6a3ce929d0e000001-00f067aa0ba902b7-01"
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequest(http.MethodPost, e.api+"/v1/chat/completions",
			strings.NewReader(`{"model":"cb-llama","max_tokens":30,"ignore_eos":true,"messages":[{"role":"user","content":"traced"}]}`))
		req.Header.Set("traceparent", traced)
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	ch = inflight(3)
	time.Sleep(500 * time.Millisecond)
	if err := e.stack.Supervisor().Signal("cb-engine", syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	t.Logf("engine SIGTERM: %v", collect(ch, 3))
	<-done
	waitRestart(t, e, "cb-engine", epid)
	checkContract(t, e.settledTrace("8bf92f3577b34da6a3ce929d0e000001", "chat cb-llama"))
	for _, id := range faultTraces {
		tr := e.settledTrace(id, "chat cb-llama", spanname.CBRequest)
		checkContract(t, tr)
		t.Logf("trace %s: %d spans, lookup %q", id, len(tr.Spans), strAttr(tr, spanname.CBRequest, "lookup"))
	}
}

// TestCollectorDownRequestsServed exports to a port nobody listens on:
// every request is served and the failed exports are counted.
func TestCollectorDownRequestsServed(t *testing.T) {
	ports, err := freeport.Ports(1)
	if err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, options{
		otlpEndpoint: fmt.Sprintf("http://127.0.0.1:%d/v1/traces", ports[0]), otlpProtocol: "http/protobuf",
		queryURL: "http://127.0.0.1:1", extraEnv: []string{"OTEL_EXPORTER_OTLP_TIMEOUT=500"},
	})
	for i := range 10 {
		e.chat(fmt.Sprintf("00-9bf92f3577b34da6a3ce929d0e00%04x-00f067aa0ba902b7-01", i), "short prompt", 2)
	}
	deadline := time.Now().Add(30 * time.Second)
	for metricValue(e.metricsText(), "cb_trace_export_errors_total") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no export error counted:\n%s", grepLines(e.metricsText(), "cb_trace_"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestFullEventBusDropsWithoutBlocking runs the blend server with a
// one-slot event bus: lookups and retrieves never wait for it (every
// request is served), and the dropped events are counted.
func TestFullEventBusDropsWithoutBlocking(t *testing.T) {
	e := startEnv(t, options{blendArgs: []string{"--event-queue=1"}})
	e.ingest()
	for i := range 4 {
		e.chat("", ragPrompt(i, i+1), 2)
	}
	body, err := httpGet(e.stack.Endpoints().Blend.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	dropped := metricValue(body, "lmcache_blend_event_bus_dropped_total")
	published := metricValue(body, "lmcache_blend_event_bus_published_total")
	t.Logf("event bus: %v published, %v dropped", published, dropped)
	if dropped == 0 {
		t.Fatalf("a one-slot bus dropped nothing:\n%s", grepLines(body, "event_bus"))
	}
}

// TestLookupTimeoutServedInFull gives the engine a lookup timeout no lookup can meet: every
// request is served by a full prefill and its trace meets the contract, cb.request saying
// lookup=timeout with zero hit statistics, cb.lookup.rpc carrying the error, and no lookup
// subtree required (the blend server sees only expired calls and does no work for them).
func TestLookupTimeoutServedInFull(t *testing.T) {
	e := startEnv(t, options{engineArgs: []string{"--lookup-timeout=1ns"}})
	e.ingest()
	for i := range 3 {
		tp := fmt.Sprintf("00-abf92f3577b34da6a3ce929d0e00%04x-00f067aa0ba902b7-01", i)
		e.chat(tp, ragPrompt(i, i+3), 2)
		tr := e.settledTrace(tp[3:35], "chat cb-llama", spanname.CBRequest, spanname.CBLookupRPC, spanname.CBExecute, spanname.EngineDecode)
		checkContract(t, tr)
		if o := strAttr(tr, spanname.CBRequest, "lookup"); o != "timeout" {
			t.Errorf("request %d: lookup %q, want timeout", i, o)
		}
		if et := strAttr(tr, spanname.CBLookupRPC, "error.type"); et != "timeout" {
			t.Errorf("request %d: cb.lookup.rpc error.type %q", i, et)
		}
		if n := len(byName(tr)[spanname.CBLookup]); n != 0 {
			t.Errorf("request %d: the blend server worked for an expired call (%d cb.lookup)", i, n)
		}
	}
}
