package engine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/internal/enginetest"
	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/httpserve"
	"github.com/cacheblend/cacheblend/internal/fdlimit"
)

// slowBodyRequest is a chat request whose headers promise a body that never
// fully arrives.
const slowBodyRequest = "POST /v1/chat/completions HTTP/1.1\r\nHost: cb\r\nContent-Type: application/json\r\n" +
	"Content-Length: 1000\r\n\r\n{\"model\":"

// openFDs counts the process's open file descriptors (-1 when unknown).
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// normalChat sends one small chat request on a new connection and returns
// its latency.
func normalChat(t *testing.T, base string) time.Duration {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	t0 := time.Now()
	resp, err := c.Post(base+api.RouteChat, "application/json",
		strings.NewReader(`{"model":"cb-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`))
	if err != nil {
		t.Fatalf("normal request under attack: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	d := time.Since(t0)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("normal request under attack: %d %s", resp.StatusCode, body)
	}
	return d
}

// TestSlowBodyAttack holds 5,000 connections that send headers and part of a
// body, then stall, against the engine with its default connection cap: a
// normal request still answers within 1 s, the server holds at most MaxConns
// connections (goroutines and descriptors bounded), and when ReadTimeout
// passes the held ones get 408 and are closed.
func TestSlowBodyAttack(t *testing.T) {
	const attackers = 5000
	raiseFileLimit(t, 2*attackers+1000) // both ends of every connection are in this process
	const readTimeout = 6 * time.Second
	ev := newEnv(t, envOpts{cfg: Config{Settings: httpfront.Settings{Limits: httpserve.Limits{ReadTimeout: readTimeout}}}})
	maxConns := ev.e.ConnStats().MaxConns
	if maxConns != httpfront.DefaultMaxConns {
		t.Logf("MaxConns lowered to %d by the open-file limit", maxConns)
	}
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	g0, fd0 := runtime.NumGoroutine(), openFDs()

	// Dial the attackers from 8 goroutines.
	conns := make([]net.Conn, attackers)
	var wg sync.WaitGroup
	var dialErr error
	var mu sync.Mutex
	addr := ev.e.Addr()
	tAttack := time.Now()
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < attackers; i += 8 {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err == nil {
					_, err = io.WriteString(c, slowBodyRequest)
				}
				if err != nil {
					mu.Lock()
					dialErr = err
					mu.Unlock()
					return
				}
				conns[i] = c
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	if dialErr != nil {
		t.Fatalf("attacker dial: %v", dialErr)
	}
	dialTime := time.Since(tAttack)
	// Every attacker is accepted (the oldest evicted at the cap).
	waitFor(t, "attackers accepted", func() bool { return ev.e.ConnStats().Accepted >= attackers })

	// Normal requests during the attack, each on a new connection.
	var lat []time.Duration
	for range 10 {
		lat = append(lat, normalChat(t, ev.base))
	}
	slices.Sort(lat)
	if lat[len(lat)-1] > time.Second {
		t.Errorf("normal request latencies under attack %v, want each < 1 s", lat)
	}
	st := ev.e.ConnStats()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	g1, fd1 := runtime.NumGoroutine(), openFDs()
	t.Logf("%d slow-body connections dialled in %v; normal chat request p50 %v max %v (10 requests)",
		attackers, dialTime.Round(time.Millisecond), lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond))
	t.Logf("server: %d connections held (cap %d), %d accepted, %d evicted, %d refused; goroutines %d -> %d; "+
		"open fds %d -> %d (the test's %d client sockets included); heap in use %.1f -> %.1f MB, stacks %.1f -> %.1f MB",
		st.Open, st.MaxConns, st.Accepted, st.Evicted, st.Refused, g0, g1, fd0, fd1, attackers,
		float64(m0.HeapInuse)/1e6, float64(m1.HeapInuse)/1e6, float64(m0.StackInuse)/1e6, float64(m1.StackInuse)/1e6)
	if st.Open > maxConns {
		t.Errorf("%d connections held, cap %d", st.Open, maxConns)
	}
	if g1-g0 > maxConns+100 {
		t.Errorf("goroutines grew by %d with a cap of %d connections", g1-g0, maxConns)
	}
	if fd0 >= 0 && fd1-fd0 > attackers+maxConns+100 {
		t.Errorf("open fds grew by %d: more than the clients' %d and the cap %d", fd1-fd0, attackers, maxConns)
	}
	if want := uint64(attackers - maxConns); st.Evicted < want {
		t.Errorf("evicted %d, want at least %d", st.Evicted, want)
	}

	// The newest attacker is still held; ReadTimeout gives it a 408.
	last := conns[attackers-1]
	_ = last.SetReadDeadline(time.Now().Add(readTimeout + 10*time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(last), nil)
	if err != nil {
		t.Fatalf("held slow-body connection: %v, want a 408", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("held slow-body connection answered %d, want 408", resp.StatusCode)
	}
	waitFor(t, "held connections closed", func() bool { return ev.e.ConnStats().Open == 0 })
	t.Logf("all slow-body connections answered 408 or closed %v after the attack began", time.Since(tAttack).Round(100*time.Millisecond))
}

func TestSlowBodyGets408(t *testing.T) {
	ev := newEnv(t, envOpts{cfg: Config{Settings: httpfront.Settings{Limits: httpserve.Limits{ReadTimeout: 300 * time.Millisecond}}}})
	c, err := net.Dial("tcp", ev.e.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t0 := time.Now()
	if _, err := io.WriteString(c, slowBodyRequest); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkErrorBody(t, resp, http.StatusRequestTimeout, "invalid_request_error")
	_ = resp.Body.Close()
	if d := time.Since(t0); d < 250*time.Millisecond || d > 5*time.Second {
		t.Fatalf("408 after %v, want about the ReadTimeout", d)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("connection after the 408: %v, want closed", err)
	}
}

func TestIdleConnectionsClosed(t *testing.T) {
	ev := newEnv(t, envOpts{cfg: Config{Settings: httpfront.Settings{Limits: httpserve.Limits{IdleTimeout: 200 * time.Millisecond, ReadHeaderTimeout: 200 * time.Millisecond}}}})
	idle, err := net.Dial("tcp", ev.e.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	silent, err := net.Dial("tcp", ev.e.Addr()) // never sends a byte
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	fmt.Fprintf(idle, "GET /health HTTP/1.1\r\nHost: cb\r\n\r\n")
	br := bufio.NewReader(idle)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	t0 := time.Now()
	for _, r := range []io.Reader{br, silent} {
		_ = idle.SetReadDeadline(time.Now().Add(10 * time.Second))
		_ = silent.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := r.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("read on an idle connection: %v, want EOF", err)
		}
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("idle connections closed after %v", d)
	}
	waitFor(t, "no connection held", func() bool { return ev.e.ConnStats().Open == 0 })
}

// TestStreamOutlivesHTTPTimeouts: a stream lasting several times ReadTimeout
// and WriteTimeout is delivered whole (the write deadline is renewed before
// each event).
func TestStreamOutlivesHTTPTimeouts(t *testing.T) {
	w := enginetest.NewWorker(64, 16, 2048)
	ev := newEnv(t, envOpts{worker: w, cfg: Config{Settings: httpfront.Settings{Limits: httpserve.Limits{ReadTimeout: 150 * time.Millisecond, WriteTimeout: 150 * time.Millisecond}}}})
	gate := w.Gate()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(60 * time.Millisecond):
			}
			select {
			case gate <- struct{}{}:
			case <-stop:
				return
			}
		}
	}()
	t0 := time.Now()
	stream := ev.client().Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "cb-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}, MaxTokens: openai.Int(12)})
	var sb strings.Builder
	for stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			sb.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream cut: %v", err)
	}
	_ = stream.Close()
	if d := time.Since(t0); d < 600*time.Millisecond {
		t.Fatalf("stream took %v: not longer than the timeouts", d)
	}
	if want := expectedText(chatPrompt("x"), 12); sb.String() != want {
		t.Fatalf("streamed %q, want %q", sb.String(), want)
	}
}

// raiseFileLimit makes room for need open files in this process (and the
// processes it starts), or fails the test.
func raiseFileLimit(t *testing.T, need uint64) {
	t.Helper()
	if _, err := fdlimit.Raise(need); err != nil {
		t.Fatal(err)
	}
}
