package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/stack"
	"github.com/cacheblend/cacheblend/tracestore"
)

// upPD starts the collector and `cb up --prefill-nodes 1 --decode-nodes 1` (stack.Up) with
// extra gateway and engine flags; it returns the env and the endpoints.
func upPD(t *testing.T, gatewayArgs, engineArgs []string) (*env, stack.Endpoints) {
	t.Helper()
	e := &env{t: t, logs: &syncWriter{}}
	col, err := tracestore.New(tracestore.Config{OTLPAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0"}, component.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := col.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.col, e.queryURL = col, "http://"+col.QueryAddr()
	st, err := stack.Up(context.Background(), stack.UpConfig{
		Exe: cbBin, APIAddr: "127.0.0.1:0", PrefillNodes: 1, DecodeNodes: 1,
		WorkerArgs: smallModel, EngineArgs: engineArgs, GatewayArgs: gatewayArgs, BlendArgs: []string{"--coordinator-timeout=2s"},
		Env:          []string{"OTEL_BSP_SCHEDULE_DELAY=100"},
		OTLPEndpoint: "http://" + col.OTLPAddr() + "/v1/traces", OTLPProtocol: "http/protobuf",
		Supervisor: stack.Config{Logs: e.logs, ReadyTimeout: 120 * time.Second},
	})
	if err != nil {
		col.Shutdown(context.Background())
		t.Fatalf("stack up: %v\nlogs:\n%s", err, tail(e.logs.String(), 60))
	}
	e.stack = st
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Errorf("stack shutdown: %v", err)
		}
		col.Shutdown(ctx)
		if t.Failed() {
			t.Logf("process logs:\n%s", tail(e.logs.String(), 80))
		}
	})
	return e, st.Endpoints()
}

// stopProcess SIGSTOPs pid (a process this test's stack started) and returns the function
// that resumes it (also run at cleanup, before the stack stops).
func stopProcess(t *testing.T, pid int) (resume func()) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// gatewayHealth reads the gateway's /health: status code, status and the decode engines'
// up flags.
func gatewayHealth(t *testing.T, api string) (int, string, []bool) {
	t.Helper()
	resp, err := http.Get(api + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b struct {
		Status        string `json:"status"`
		DecodeEngines []struct {
			Up bool `json:"up"`
		} `json:"decode_engines"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&b)
	var up []bool
	for _, d := range b.DecodeEngines {
		up = append(up, d.Up)
	}
	return resp.StatusCode, b.Status, up
}

// TestGatewayDecodeDownFallback: `cb up --prefill-nodes 1 --decode-nodes 1`; the decode engine
// is frozen (SIGSTOP: its host accepts connections, nothing answers) under load. Every request
// is answered 200 — the first ones by a hand-over cut at --handoff-idle-timeout and served
// whole on the prefill engine, the rest served whole at once once the gateway's health checks
// took the decode engine out — none longer than its bound; /health says "degraded" with the
// decode engine down while it lasts, and "ok" (hand-overs again) once it is resumed.
func TestGatewayDecodeDownFallback(t *testing.T) {
	const handoffIdle = 2 * time.Second
	e, eps := upPD(t, []string{"--health-interval=200ms", "--probe-timeout=300ms", "--health-failures=3"},
		[]string{"--handoff-idle-timeout=" + handoffIdle.String()})
	gw, decode := eps.Gateway.API, eps.Nodes[1].Engine
	_ = e
	body := func(i int, stream bool) []byte {
		return chatBody("Question "+strings.Repeat("x", i%7)+": what is paged attention?", 8, stream, nil)
	}
	if a := send(gw, nil, body(0, false)); a.status != 200 || a.header.Get("X-Cb-Kv-Blocks-Sent") == "" {
		t.Fatalf("hand-over before the fault: %d %v %s", a.status, a.header, a.body)
	}
	if st, status, up := gatewayHealth(t, gw); st != 200 || status != "ok" || len(up) != 1 || !up[0] {
		t.Fatalf("health before: %d %s %v", st, status, up)
	}
	resume := stopProcess(t, decode.PID)
	t0 := time.Now()
	const clients, perClient = 4, 8
	type result struct {
		status int
		took   time.Duration
		errEv  bool
	}
	results := make(chan result, clients*perClient)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perClient {
				a := send(gw, nil, body(c*perClient+i, i%2 == 1))
				results <- result{a.status, a.took, strings.Contains(a.text, "<error") || strings.Contains(a.body, `"error"`)}
			}
		}()
	}
	degraded := false
	for done := false; !done; {
		if st, status, up := gatewayHealth(t, gw); st == 200 && status == "degraded" && len(up) == 1 && !up[0] {
			degraded = true
		}
		select {
		case <-waitChan(&wg):
			done = true
		case <-time.After(100 * time.Millisecond):
		}
	}
	close(results)
	ok, n := 0, 0
	var maxTook time.Duration
	for r := range results {
		n++
		if r.status == 200 && !r.errEv {
			ok++
		}
		maxTook = max(maxTook, r.took)
	}
	t.Logf("decode engine frozen: %d/%d answered 200 in %v, max latency %v (hand-over idle timeout %v)",
		ok, n, time.Since(t0).Round(time.Millisecond), maxTook.Round(time.Millisecond), handoffIdle)
	if ok != n || !degraded {
		t.Fatalf("%d/%d answered; /health degraded seen: %v", ok, n, degraded)
	}
	if maxTook > handoffIdle+5*time.Second {
		t.Fatalf("max latency %v beyond the hand-over idle timeout %v (+5 s)", maxTook, handoffIdle)
	}
	if st, status, _ := gatewayHealth(t, gw); st != 200 || status != "degraded" {
		t.Fatalf("health while the decode engine is frozen: %d %s", st, status)
	}
	// Resumed: the gateway hands over again.
	resume()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, status, _ := gatewayHealth(t, gw); status == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the gateway never saw the decode engine back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if a := send(gw, nil, body(1, false)); a.status != 200 || a.header.Get("X-Cb-Kv-Blocks-Sent") == "" {
		t.Fatalf("hand-over after the fault: %d %v %s", a.status, a.header, a.body)
	}
}

// waitChan closes the returned channel when wg is done.
func waitChan(wg *sync.WaitGroup) <-chan struct{} {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	return ch
}

// TestGatewayStreamIdleTimeout: two nodes behind the gateway with --upstream-idle-timeout 2s
// and --keep-alive 500ms; the engine answering a stream is frozen (SIGSTOP) after the stream's first content
// event: the client gets ": keep-alive" comments (no silent gap beyond the keep-alive period
// and some slack) and an upstream_idle_timeout error event and [DONE] within the idle timeout
// of the engine's last byte.
func TestGatewayStreamIdleTimeout(t *testing.T) {
	const idle, keepAlive = 2 * time.Second, 500 * time.Millisecond
	e := startGatewayNodes(t, 2, []string{"--upstream-idle-timeout=" + idle.String(), "--keep-alive=" + keepAlive.String()}, nil)
	eps := e.stack.Endpoints()
	if eps.Gateway == nil || len(eps.Nodes) != 2 {
		t.Fatalf("endpoints %+v", eps)
	}
	req, _ := http.NewRequest(http.MethodPost, e.api+"/v1/chat/completions", bytes.NewReader(chatBody("Tell a long story.", 4000, true, nil)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	var engine stack.Endpoint // the engine that answers (X-Cb-Engine)
	for _, n := range eps.Nodes {
		if strings.TrimPrefix(n.Engine.API, "http://") == resp.Header.Get("X-Cb-Engine") {
			engine = n.Engine
		}
	}
	if engine.PID == 0 {
		t.Fatalf("engine %q not among %+v", resp.Header.Get("X-Cb-Engine"), eps.Nodes)
	}
	sc := bufio.NewScanner(resp.Body)
	var stopped, lastData, prev time.Time
	var lines []string
	var maxGap time.Duration
	keepAlives := 0
	for sc.Scan() {
		l := sc.Text()
		if l == "" {
			continue
		}
		now := time.Now()
		if !prev.IsZero() {
			maxGap = max(maxGap, now.Sub(prev))
		}
		prev = now
		lines = append(lines, l)
		switch {
		case l == ": keep-alive":
			keepAlives++
		case strings.HasPrefix(l, "data: {") && !strings.Contains(l, `"error"`):
			lastData = now
		}
		if stopped.IsZero() && strings.Contains(l, `"content":"`) && !strings.Contains(l, `"content":""`) {
			stopProcess(t, engine.PID)
			stopped = now
		}
	}
	end := time.Now()
	n := len(lines)
	if stopped.IsZero() || n < 2 || lines[n-1] != "data: [DONE]" || !strings.Contains(lines[n-2], "upstream_idle_timeout") {
		t.Fatalf("stream (%d lines) did not end with the idle timeout error: %q", n, lines[max(0, n-4):])
	}
	t.Logf("engine frozen after the first content: %d keep-alives, error event %v after the last data event (%v after the freeze), longest silent gap %v",
		keepAlives, end.Sub(lastData).Round(time.Millisecond), end.Sub(stopped).Round(time.Millisecond), maxGap.Round(time.Millisecond))
	if keepAlives < 2 || maxGap > keepAlive+500*time.Millisecond {
		t.Fatalf("%d keep-alives, longest silent gap %v (keep-alive %v)", keepAlives, maxGap, keepAlive)
	}
	if since := end.Sub(lastData); since < idle-100*time.Millisecond || since > idle+time.Second {
		t.Fatalf("the error came %v after the last data event; idle timeout %v", since, idle)
	}
}
