package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func TestDrainClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type ev = clockEvent
	for _, tc := range []struct {
		name   string
		events []ev
		now    int
		want   float64
		ok     bool
	}{
		{"cold: nothing freed", []ev{{0, 'b'}}, 500, 0, false},
		{"steady: 20 freed over 1 s busy", append([]ev{{0, 'b'}}, releases(50, 1000, 50)...), 1000, 20, true},
		{"idle time does not dilute", append(append([]ev{{0, 'b'}}, releases(50, 1000, 50)...), ev{1000, 'i'}, ev{60000, 'b'}),
			60000, 20, true},
		{"a few right after the queue filled: over 0.1 s at least", []ev{{0, 'b'}, {10, 'r'}, {20, 'r'}}, 20, 20, true},
		{"one release is no rate yet", []ev{{0, 'b'}, {10, 'r'}}, 20, 0, false},
		{"old busy time ages out", append(append([]ev{{0, 'b'}}, releases(50, 1000, 50)...), ev{11500, 'r'}, ev{12000, 'r'}), 12000, 0.2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d drainClock
			for _, e := range tc.events {
				switch e.kind {
				case 'b':
					d.busy(true, at(e.ms))
				case 'i':
					d.busy(false, at(e.ms))
				case 'r':
					d.released(at(e.ms))
				}
			}
			got, ok := d.rate(at(tc.now))
			if ok != tc.ok || (ok && (got < tc.want*0.999 || got > tc.want*1.001)) {
				t.Fatalf("rate %v %v, want %v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// clockEvent is an event of a drainClock test at ms: 'b' busy, 'i' idle, 'r' released.
type clockEvent struct {
	ms   int
	kind byte
}

// releases lists a release every step ms from from to to (inclusive).
func releases(from, to, step int) []clockEvent {
	var out []clockEvent
	for ms := from; ms <= to; ms += step {
		out = append(out, clockEvent{ms, 'r'})
	}
	return out
}

// TestReservations: refused requests are given consecutive slots at the drain rate (1 s before
// anything was measured); a due slot keeps a new request out and is claimed by a retry; slots
// nobody claims expire; waits are capped.
func TestReservations(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := &pool{maxQueue: 2}
	for i := range 3 {
		if got := p.reserve(t0, true); got != coldRetryAfter {
			t.Fatalf("cold refusal %d: wait %v, want %v", i, got, coldRetryAfter)
		}
	}
	// Measured: 100 slots freed per second of busy time: one slot after the three promised
	// for 1 s.
	measured := func(p *pool) {
		p.drain.busy(true, t0.Add(-time.Second))
		for i := range 100 {
			p.drain.released(t0.Add(-time.Second + time.Duration(i+1)*10*time.Millisecond))
		}
	}
	measured(p)
	if got := p.reserve(t0, false); got != 1010*time.Millisecond {
		t.Fatalf("measured refusal after three promised slots: wait %v, want 1.01s", got)
	}
	if got := p.reserve(t0, true); got != 1010*time.Millisecond {
		t.Fatalf("measured refusal, held: wait %v, want 1.01s (the unheld one promised nothing)", got)
	}
	if got := p.reserve(t0, true); got != 1020*time.Millisecond {
		t.Fatalf("next held refusal: wait %v, want 1.02s", got)
	}
	if d := p.resv.due(t0.Add(time.Second)); d != 3 {
		t.Fatalf("%d due at 1 s, want 3", d)
	}
	for i := range 3 {
		if !p.resv.claim(t0.Add(1005 * time.Millisecond)) {
			t.Fatalf("claim %d at 1.005 s refused", i)
		}
	}
	if p.resv.claim(t0.Add(1005 * time.Millisecond)) {
		t.Fatal("a slot due at 1.01 s claimed at 1.005 s")
	}
	// The others expire after their whole seconds plus the grace, unclaimed.
	p.resv.expire(t0.Add(2999 * time.Millisecond))
	if n := len(p.resv.held); n != 2 {
		t.Fatalf("%d held before expiry, want 2", n)
	}
	p.resv.expire(t0.Add(3001 * time.Millisecond))
	if n := len(p.resv.held); n != 0 {
		t.Fatalf("%d held after expiry, want 0", n)
	}
	// Kept promises queued beyond MaxQueue: room frees once they are dispatched.
	over := &pool{maxQueue: 8}
	measured(over)
	for range 12 {
		over.waiters.PushBack(&waiter{})
	}
	if got := over.reserve(t0, false); got != 60*time.Millisecond {
		t.Fatalf("12 waiting in a queue of 8: wait %v, want 60ms", got)
	}
	// A slow drain (two slots in 10 s of busy time) behind ten promised slots: capped.
	slow := &pool{maxQueue: 2}
	slow.drain.busy(true, t0.Add(-10*time.Second))
	slow.drain.released(t0.Add(-5 * time.Second))
	slow.drain.released(t0.Add(-time.Second))
	for range 10 {
		slow.resv.held = append(slow.resv.held, reservation{due: t0.Add(time.Hour), expires: t0.Add(2 * time.Hour)})
	}
	if got := slow.reserve(t0, false); got != maxRetryAfter {
		t.Fatalf("capped wait %v, want %v", got, maxRetryAfter)
	}
}

func TestRetryAfterHeaders(t *testing.T) {
	for _, tc := range []struct {
		wait     time.Duration
		secs, ms string
	}{
		{0, "1", "1"},
		{250 * time.Millisecond, "1", "250"},
		{1001 * time.Millisecond, "2", "1001"},
		{1500*time.Millisecond + time.Microsecond, "2", "1501"},
	} {
		h := http.Header{}
		retryAfterHeaders(h, tc.wait)
		if h.Get("Retry-After") != tc.secs || h.Get("Retry-After-Ms") != tc.ms {
			t.Errorf("%v: %v, want %s s %s ms", tc.wait, h, tc.secs, tc.ms)
		}
	}
}

func TestNewTicket(t *testing.T) {
	for _, tc := range []struct {
		hdr          string
		holds, retry bool
	}{{"", false, false}, {"0", true, false}, {"2", true, true}, {"x", false, false}, {"-1", false, false}} {
		h := http.Header{}
		if tc.hdr != "" {
			h.Set(HeaderRetryCount, tc.hdr)
		}
		if tk := newTicket(h); tk.holds != tc.holds || tk.retry != tc.retry {
			t.Errorf("%q: %+v", tc.hdr, tk)
		}
	}
}

// slowEngine is an engine that answers every chat request after delay, with no limit of its
// own: the gateway's slots and queue are the bottleneck.
func slowEngine(t *testing.T, delay time.Duration) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/metrics":
			io.WriteString(w, "cb_engine_requests_waiting 0\ncb_engine_requests_running 0\n")
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"cb-llama","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestBurstServedWithSDKRetries: 300 requests at 64 concurrent through a gateway whose engines
// and queue hold 16 (2 engines × 4 in flight + 8 waiting), each sent by openai-go with its
// defaults (2 retries, following Retry-After-Ms / Retry-After): every request is served. The
// refused ones are told when a queue slot will be theirs (one after the other at the
// measured drain rate) and that slot is held for their retry.
func TestBurstServedWithSDKRetries(t *testing.T) {
	const (
		requests    = 300
		concurrency = 64
		delay       = 40 * time.Millisecond
	)
	a, b := slowEngine(t, delay), slowEngine(t, delay)
	cfg := Config{Engines: []string{a.URL, b.URL}, Addr: "127.0.0.1:0", HealthInterval: 50 * time.Millisecond,
		MaxInFlight: 4, MaxQueue: 8}
	tg := startGateway(t, cfg)
	tr := &http.Transport{MaxIdleConnsPerHost: concurrency}
	defer tr.CloseIdleConnections()
	var refused, attempts atomic.Int64
	t0 := time.Now()
	var mu sync.Mutex
	waits := map[string]int{}
	count := func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		attempts.Add(1)
		resp, err := next(req)
		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
			refused.Add(1)
			mu.Lock()
			waits[resp.Header.Get("Retry-After")]++
			mu.Unlock()
		}
		return resp, err
	}
	c := openai.NewClient(option.WithBaseURL(tg.url+"/v1/"), option.WithAPIKey("unused"),
		option.WithHTTPClient(&http.Client{Transport: tr}), option.WithMiddleware(count)) // retries: the SDK's default
	var served, failed atomic.Int64
	var firstErr atomic.Value
	next := make(chan int)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for i := range next {
				_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "cb-llama",
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("request %d", i))}})
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				served.Add(1)
			}
		})
	}
	for i := range requests {
		next <- i
	}
	close(next)
	wg.Wait()
	took := time.Since(t0)
	t.Logf("%d/%d served in %v; %d attempts, %d answers 429 (Retry-After seconds: %v)",
		served.Load(), requests, took.Round(time.Millisecond), attempts.Load(), refused.Load(), waits)
	if served.Load() != requests {
		t.Fatalf("%d of %d failed after the SDK's retries (first: %v)", failed.Load(), requests, firstErr.Load())
	}
	if refused.Load() == 0 {
		t.Fatal("no 429: the burst did not fill the queue")
	}
	for ra := range waits {
		if n, err := strconv.Atoi(ra); err != nil || n < 1 || n > 59 {
			t.Errorf("Retry-After %q", ra)
		}
	}
	if !strings.Contains(strings.Join(tg.metric(t, "cb_gateway_rejections_total", `reason="queue_full"`), ""), "queue_full") {
		t.Errorf("rejections not counted")
	}
}
