package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/api"
)

// healthOK reads the gateway's /health: status code and body.
func (tg *testGateway) health(t *testing.T) (int, healthBody) {
	t.Helper()
	resp, err := http.Get(tg.url + api.RouteHealth)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b healthBody
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// attempts returns the ended gateway.attempt spans, oldest first.
func (tg *testGateway) attempts() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tg.spans.Ended() {
		if s.Name() == spanname.GatewayAttempt {
			out = append(out, s)
		}
	}
	return out
}

func abandoned(s sdktrace.ReadOnlySpan) bool {
	for _, a := range s.Attributes() {
		if string(a.Key) == AttrAbandoned {
			return a.Value.AsBool()
		}
	}
	return false
}

// TestDecodeDownServedWhole: with every decode engine down (health failing) or failing its
// hand-overs, generations are served whole by the prefill engine (no X-CB-Decode-Engine) and
// /health is 200 "degraded", listing the decode engines; when a decode engine is back, the
// hand-over resumes and /health is "ok".
func TestDecodeDownServedWhole(t *testing.T) {
	for _, tc := range []struct {
		name string
		down func(d *fakeEngine, p *fakeEngine)
		// degraded: /health says so (the decode engines fail their health checks).
		degraded bool
	}{
		{"decode health failing", func(d, _ *fakeEngine) { d.set(func(f *fakeEngine) { f.health = 503 }) }, true},
		{"decode unreachable", func(d, _ *fakeEngine) { d.srv.CloseClientConnections(); d.srv.Close() }, true},
		{"every hand-over fails", func(_, p *fakeEngine) { p.set(func(f *fakeEngine) { f.badDecode = "*" }) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, d := newFakeEngine(t), newFakeEngine(t)
			tg := startGateway(t, Config{Prefill: []string{p.srv.URL}, Decode: []string{d.srv.URL},
				HealthInterval: 20 * time.Millisecond, HealthFailures: 2})
			if st, b := tg.health(t); st != 200 || b.Status != "ok" || len(b.DecodeEngines) != 1 {
				t.Fatalf("health %d %+v", st, b)
			}
			tc.down(d, p)
			deadline := time.Now().Add(5 * time.Second)
			for tc.degraded {
				if st, b := tg.health(t); st == 200 && b.Status == "degraded" && len(b.DecodeEngines) == 1 && !b.DecodeEngines[0].Up &&
					b.DecodeEngines[0].URL == d.srv.URL && len(b.Engines) == 1 && b.Engines[0].Up {
					break
				}
				if time.Now().After(deadline) {
					st, b := tg.health(t)
					t.Fatalf("health never degraded: %d %+v", st, b)
				}
				time.Sleep(10 * time.Millisecond)
			}
			for i, stream := range []bool{false, true, false} {
				st, h, body := tg.post(t, api.RouteChat, chatBody(fmt.Sprint("hi ", i), stream), nil)
				if st != 200 || h.Get(HeaderEngine) != p.name || strings.Contains(body, "error") {
					t.Fatalf("request %d: %d %s", i, st, body)
				}
			}
			p.mu.Lock()
			hdrs := p.decodeHdr
			p.mu.Unlock()
			if last := hdrs[len(hdrs)-1]; last != "" {
				t.Fatalf("the last request still named decode engine %q (all: %q)", last, hdrs)
			}
		})
	}
}

// TestDecodeBackAfterFallback: a decode engine that comes back takes the hand-overs again.
func TestDecodeBackAfterFallback(t *testing.T) {
	p, d := newFakeEngine(t), newFakeEngine(t)
	d.set(func(f *fakeEngine) { f.health = 503 })
	tg := startGateway(t, Config{Prefill: []string{p.srv.URL}, Decode: []string{d.srv.URL}, HealthInterval: 20 * time.Millisecond})
	if st, b := tg.health(t); st != 200 || b.Status != "degraded" {
		t.Fatalf("health %d %+v", st, b)
	}
	d.set(func(f *fakeEngine) { f.health = 200 })
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, b := tg.health(t); b.Status == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never ok again")
		}
		time.Sleep(10 * time.Millisecond)
	}
	tg.post(t, api.RouteChat, chatBody("x", false), nil)
	p.mu.Lock()
	hdrs := p.decodeHdr
	p.mu.Unlock()
	if hdrs[len(hdrs)-1] != d.srv.URL {
		t.Fatalf("decode headers %q", hdrs)
	}
}

// TestHealthNeedsConsecutiveFailures: an engine goes out of routing after HealthFailures
// failed probes in a row, a probe slower than the interval but within ProbeTimeout passes,
// and one passing probe resets the count.
func TestHealthNeedsConsecutiveFailures(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int
		probes   []int // /health status per probe (0: 200 after a delay of 150 ms)
		wantUp   []bool
	}{
		{"default three", 0, []int{503, 503, 503, 200}, []bool{true, true, false, true}},
		{"reset by a pass", 3, []int{503, 503, 200, 503, 503}, []bool{true, true, true, true, true}},
		{"one", 1, []int{503, 200}, []bool{false, true}},
		{"slow probe within the probe timeout", 1, []int{0, 0}, []bool{true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEngine(t)
			tg := startGateway(t, Config{HealthInterval: time.Hour, HealthFailures: tc.failures, ProbeTimeout: time.Second}, e)
			for i, st := range tc.probes {
				e.set(func(f *fakeEngine) {
					f.health, f.healthDelay = st, 0
					if st == 0 {
						f.health, f.healthDelay = 200, 150*time.Millisecond
					}
				})
				tg.checkAll(t.Context())
				if up := tg.pool.snapshot()[0].up; up != tc.wantUp[i] {
					t.Fatalf("after probe %d (%d): up %v, want %v", i, st, up, tc.wantUp[i])
				}
			}
		})
	}
	// A probe beyond ProbeTimeout fails.
	e := newFakeEngine(t)
	tg := startGateway(t, Config{HealthInterval: time.Hour, HealthFailures: 1, ProbeTimeout: 50 * time.Millisecond}, e)
	e.set(func(f *fakeEngine) { f.healthDelay = 300 * time.Millisecond })
	tg.checkAll(t.Context())
	if s := tg.pool.snapshot()[0]; s.up || !strings.Contains(s.reason, "Timeout") && !strings.Contains(s.reason, "deadline") {
		t.Fatalf("slow probe: %+v", s)
	}
}

// TestEngineDownKeepsProgressingAttempts: an engine taken out of routing cuts (fails over)
// only the attempts that received no byte within the stall window; an attempt whose engine
// keeps sending goes on to the end on it.
func TestEngineDownKeepsProgressingAttempts(t *testing.T) {
	for _, tc := range []struct {
		name       string
		answer     int
		wantEngine func(slow, good *fakeEngine) string
		attempts   int
	}{
		{"progressing", answerPingThenText, func(slow, _ *fakeEngine) string { return slow.name }, 1},
		{"stalled", answerStallBefore, func(_, good *fakeEngine) string { return good.name }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slow, good := newFakeEngine(t), newFakeEngine(t)
			slow.set(func(f *fakeEngine) { f.answer, f.gap = tc.answer, 700*time.Millisecond })
			// Stall window: max(2×50 ms, 100 ms) = 100 ms; comments come every 20 ms.
			tg := startGateway(t, Config{Policy: PolicyRoundRobin, HealthInterval: 50 * time.Millisecond,
				HealthFailures: 2, ProbeTimeout: 100 * time.Millisecond}, slow, good)
			done := make(chan string, 1)
			go func() {
				st, h, body := tg.post(t, api.RouteChat, chatBody("x", true), nil)
				done <- fmt.Sprint(st, " ", h.Get(HeaderEngine), " ", strings.Contains(body, "[DONE]"))
			}()
			time.Sleep(150 * time.Millisecond)
			slow.set(func(f *fakeEngine) { f.health = 503 })
			select {
			case got := <-done:
				if want := fmt.Sprint("200 ", tc.wantEngine(slow, good), " true"); got != want {
					t.Fatalf("got %s, want %s", got, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the request hangs")
			}
			if up := tg.pool.snapshot()[0].up; up {
				t.Fatal("the slow engine was not taken out of routing")
			}
			atts := tg.attempts()
			if len(atts) != tc.attempts || abandoned(atts[len(atts)-1]) || tc.attempts == 2 && !abandoned(atts[0]) {
				t.Fatalf("%d attempts (want %d), abandoned %v", len(atts), tc.attempts, func() (a []bool) {
					for _, s := range atts {
						a = append(a, abandoned(s))
					}
					return a
				}())
			}
		})
	}
}

// readStream posts a streamed chat request and returns the lines of the answer with the
// time each arrived (since the request was sent).
func readStream(t *testing.T, tg *testGateway) (status int, lines []string, at []time.Duration) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, tg.url+api.RouteChat, strings.NewReader(chatBody("x", true)))
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() != "" {
			lines, at = append(lines, sc.Text()), append(at, time.Since(t0))
		}
	}
	return resp.StatusCode, lines, at
}

// TestIdleTimeout: an engine silent past IdleTimeout is failed over before the stream began
// (and before its headers), and ends a stream already relayed with an upstream_idle_timeout
// error event and [DONE] within the idle timeout; a slow stream within it gets ": keep-alive"
// comments in its gaps and completes.
func TestIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	t.Run("silent before the stream began fails over", func(t *testing.T) {
		for _, stream := range []bool{false, true} {
			bad, good := newFakeEngine(t), newFakeEngine(t)
			hold := make(chan struct{})
			defer close(hold)
			bad.set(func(f *fakeEngine) { f.hold, f.answer = hold, answerStallBefore })
			tg := startGateway(t, Config{Policy: PolicyRoundRobin, HealthInterval: time.Hour, IdleTimeout: idle}, bad, good)
			t0 := time.Now()
			for range 2 { // round-robin: one of them starts on the silent engine
				st, h, body := tg.post(t, api.RouteChat, chatBody("x", stream), nil)
				if st != 200 || h.Get(HeaderEngine) != good.name || strings.Contains(body, "error") {
					t.Fatalf("stream %v: %d from %s: %s", stream, st, h.Get(HeaderEngine), body)
				}
			}
			if took := time.Since(t0); took < idle || took > idle+2*time.Second {
				t.Fatalf("stream %v: took %v with an idle timeout of %v", stream, took, idle)
			}
			if atts := tg.attempts(); len(atts) != 3 || !abandoned(atts[0]) && !abandoned(atts[1]) {
				t.Fatalf("stream %v: %d attempts", stream, len(atts))
			}
			if len(tg.metric(t, "cb_gateway_failovers_total", bad.name, `reason="unreachable"`, " 1")) != 1 {
				t.Fatalf("failovers %v", tg.metric(t, "cb_gateway_failovers_total"))
			}
		}
	})
	t.Run("silent in the middle of a stream", func(t *testing.T) {
		e := newFakeEngine(t)
		e.set(func(f *fakeEngine) { f.answer = answerStallAfter })
		tg := startGateway(t, Config{IdleTimeout: idle, KeepAlive: 100 * time.Millisecond}, e)
		_, lines, at := readStream(t, tg)
		n := len(lines)
		if n < 3 || !strings.Contains(lines[n-2], CodeIdleTimeout) || lines[n-1] != "data: [DONE]" {
			t.Fatalf("lines %q", lines)
		}
		if end := at[n-1]; end < idle || end > idle+time.Second {
			t.Fatalf("the error came after %v, idle timeout %v", end, idle)
		}
		keepAlives := 0
		for i, l := range lines {
			if l == ": keep-alive" {
				keepAlives++
				if gap := at[i] - at[i-1]; gap > 250*time.Millisecond {
					t.Fatalf("a silent gap of %v before keep-alive %d", gap, keepAlives)
				}
			}
		}
		if keepAlives < 1 {
			t.Fatalf("no keep-alive in %q", lines)
		}
		if atts := tg.attempts(); len(atts) != 1 || !abandoned(atts[0]) {
			t.Fatalf("attempts %d", len(atts))
		}
		if len(tg.metric(t, "gen_ai_server_request_duration_seconds_count", `error_type="timeout"`)) != 1 {
			t.Fatalf("metrics %v", tg.metric(t, "gen_ai_server_request_duration_seconds_count"))
		}
	})
	t.Run("slow stream within the idle timeout", func(t *testing.T) {
		e := newFakeEngine(t)
		e.set(func(f *fakeEngine) { f.answer, f.gap = answerSlowText, 250*time.Millisecond })
		tg := startGateway(t, Config{IdleTimeout: idle, KeepAlive: 100 * time.Millisecond}, e)
		_, lines, at := readStream(t, tg)
		n, keepAlives, content := len(lines), 0, 0
		for i, l := range lines {
			switch {
			case l == ": keep-alive":
				keepAlives++
			case strings.Contains(l, `"content":"t`):
				content++
			}
			if i > 0 && at[i]-at[i-1] > 200*time.Millisecond {
				t.Fatalf("a silent gap of %v before line %d %q", at[i]-at[i-1], i, l)
			}
		}
		if content != 3 || keepAlives < 3 || lines[n-1] != "data: [DONE]" || strings.Contains(strings.Join(lines, "\n"), "error") {
			t.Fatalf("%d content events, %d keep-alives: %q", content, keepAlives, lines)
		}
		if atts := tg.attempts(); len(atts) != 1 || abandoned(atts[0]) {
			t.Fatal("a completed attempt marked abandoned")
		}
	})
}

// TestAbandonedAttempts: gateway.abandoned marks the attempts the gateway gave up on —
// failed over, or whose client went away — and no other.
func TestAbandonedAttempts(t *testing.T) {
	t.Run("failover", func(t *testing.T) {
		bad, good := newFakeEngine(t), newFakeEngine(t)
		bad.set(func(f *fakeEngine) { f.answer = answer503 })
		tg := startGateway(t, Config{Policy: PolicyRoundRobin, HealthInterval: time.Hour}, bad, good)
		for range 2 {
			tg.post(t, api.RouteChat, chatBody("x", false), nil)
		}
		var got []string
		for _, s := range tg.attempts() {
			got = append(got, fmt.Sprint(s.Attributes()[0].Value.AsString() == bad.name, " ", abandoned(s)))
		}
		slices.Sort(got)
		if strings.Join(got, ",") != "false false,false false,true true" {
			t.Fatalf("(on the bad engine, abandoned) per attempt: %v", got)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		e := newFakeEngine(t)
		e.set(func(f *fakeEngine) { f.answer = answerStallAfter })
		tg := startGateway(t, Config{}, e)
		req, _ := http.NewRequest(http.MethodPost, tg.url+api.RouteChat, strings.NewReader(chatBody("x", true)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		if l, err := br.ReadString('\n'); err != nil || resp.StatusCode != 200 {
			t.Fatal(resp.Status, l, err)
		}
		resp.Body.Close()
		deadline := time.Now().Add(5 * time.Second)
		for len(tg.attempts()) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the attempt never ended")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !abandoned(tg.attempts()[0]) {
			t.Fatal("the attempt of a client gone is not marked abandoned")
		}
	})
}
