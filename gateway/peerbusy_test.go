package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/tokenizer"
)

// newBusyPrefill is a fake prefill engine whose generations handed over to a decode engine
// answer 503 handoff_peer_busy with Retry-After: 7 while busy is set (everything else as
// fakeEngine); it counts those answers.
func newBusyPrefill(t *testing.T) (f *fakeEngine, busy *atomic.Bool, refused *atomic.Int64) {
	t.Helper()
	f, busy, refused = &fakeEngine{health: http.StatusOK}, &atomic.Bool{}, &atomic.Int64{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if busy.Load() && r.Header.Get(api.HeaderDecodeEngine) != "" && strings.HasPrefix(r.URL.Path, "/v1/chat") {
			_, _ = io.Copy(io.Discard, r.Body)
			refused.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "7")
			w.Header().Set(api.HeaderRequestID, "req-busy")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"message":"8 hand-overs to decode engine x are in flight (the limit)","type":"server_error","param":null,"code":"handoff_peer_busy"}}`)
			return
		}
		f.serve(w, r)
	}))
	f.name = strings.TrimPrefix(f.srv.URL, "http://")
	t.Cleanup(f.srv.Close)
	return f, busy, refused
}

// A prefill engine's 503 handoff_peer_busy (its hand-overs to that decode engine at their
// limit) does not take it out of routing: the request goes to another prefill engine, and
// with every prefill engine busy the 503 reaches the client with the engine's Retry-After.
func TestHandoffPeerBusyNotMarkedDown(t *testing.T) {
	p1, busy1, refused1 := newBusyPrefill(t)
	p2, busy2, refused2 := newBusyPrefill(t)
	d := newFakeEngine(t)
	// Health probes once, at Start: a mark-down would last.
	tg := startGateway(t, Config{Prefill: []string{p1.srv.URL, p2.srv.URL}, Decode: []string{d.srv.URL},
		StackKey: []byte("0123456789abcdef0123456789abcdef"), HealthInterval: time.Hour})
	allUp := func(when string) {
		t.Helper()
		for i, s := range tg.pool.snapshot() {
			if !s.up {
				t.Fatalf("%s: prefill engine %d marked down: %q", when, i, s.reason)
			}
		}
	}

	// One busy: every request served by the other, whichever the policy picked first.
	busy1.Store(true)
	for i := range 6 {
		st, h, body := tg.post(t, "/v1/chat/completions", chatBody("hello number "+string(rune('a'+i)), i%2 == 1), nil)
		if st != http.StatusOK || h.Get(HeaderEngine) != p2.name {
			t.Fatalf("request %d: %d engine %q %s", i, st, h.Get(HeaderEngine), body)
		}
	}
	allUp("one prefill engine busy")

	// Both busy: the engine's 503 passed through, with its Retry-After and code.
	busy2.Store(true)
	st, h, body := tg.post(t, "/v1/chat/completions", chatBody("hello busy", false), nil)
	var eb api.ErrorBody
	if st != http.StatusServiceUnavailable || h.Get("Retry-After") != "7" || json.Unmarshal([]byte(body), &eb) != nil ||
		eb.Error.Code == nil || *eb.Error.Code != failPeerBusy {
		t.Fatalf("both busy: %d Retry-After %q %s", st, h.Get("Retry-After"), body)
	}
	allUp("both prefill engines busy")
	if refused1.Load() == 0 || refused2.Load() == 0 {
		t.Fatalf("busy answers %d and %d: both engines should have been tried", refused1.Load(), refused2.Load())
	}
	// Counted as 503s (the label sets are fixed), never as an engine down.
	if got := tg.metric(t, "cb_gateway_failovers_total", `reason="unavailable"`); len(got) == 0 {
		t.Fatalf("no failover counted: %v", tg.metric(t, "cb_gateway_"))
	}
	// Not busy any more: served at once.
	busy1.Store(false)
	busy2.Store(false)
	if st, _, body := tg.post(t, "/v1/chat/completions", chatBody("hello again", false), nil); st != http.StatusOK {
		t.Fatalf("after the burst: %d %s", st, body)
	}
}

// The prompt-token estimate (what the policy weighs and route.prompt_tokens says) counts the
// request's tools, as the engine's prompt does.
func TestPromptTokensCountTools(t *testing.T) {
	tools := `[{"type":"function","function":{"name":"get_weather","description":"The weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	plain, apiErr := api.DecodeChat([]byte(`{"model":"cb-llama","messages":[{"role":"user","content":"weather in Paris?"}]}`))
	if apiErr != nil {
		t.Fatal(apiErr)
	}
	withTools, apiErr := api.DecodeChat([]byte(`{"model":"cb-llama","messages":[{"role":"user","content":"weather in Paris?"}],"tools":` + tools + `}`))
	if apiErr != nil {
		t.Fatal(apiErr)
	}
	var tok tokenizer.Tokenizer
	want := len(tok.AppendEncode([]int32{tokenizer.BOS}, api.ChatPromptTools(withTools.Messages, withTools.Tools)))
	a, b := promptTokens(nil, plain), promptTokens(nil, withTools)
	if len(b) != want || len(b) <= len(a)+len(withTools.Tools)/2 {
		t.Fatalf("prompt tokens: %d without tools, %d with (want %d, the engine's prompt)", len(a), len(b), want)
	}
}

// syncLog is a goroutine-safe log buffer.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The request log line names the request id the client got: the engine's when it answered,
// the gateway's own when it made the error itself.
func TestRequestLogNamesTheAnswersRequestID(t *testing.T) {
	e := newFakeEngine(t)
	logs := &syncLog{}
	g, err := New(Config{Addr: "127.0.0.1:0", Engines: []string{e.srv.URL}, HealthInterval: time.Hour},
		Deps{Deps: component.Deps{TracerProvider: noop.NewTracerProvider(), Registerer: prometheus.NewRegistry(),
			Logger: slog.New(slog.NewJSONHandler(logs, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
	})
	tg := &testGateway{Gateway: g, url: "http://" + g.Addr()}
	for _, tc := range []struct {
		name, body string
		status     int
		wantID     string // "" : a fresh id of the gateway's
	}{
		{"the engine's answer", chatBody("hi", false), http.StatusOK, "chatcmpl-" + e.name},
		{"the gateway's own 400", `{"model":"cb-llama","messages":"not a list"}`, http.StatusBadRequest, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, h, body := tg.post(t, "/v1/chat/completions", tc.body, nil)
			id := h.Get(api.HeaderRequestID)
			if st != tc.status || id == "" || tc.wantID != "" && id != tc.wantID || tc.wantID == "" && !strings.HasPrefix(id, "req-") {
				t.Fatalf("%d X-Request-Id %q %s", st, id, body)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				found := false
				for _, l := range strings.Split(logs.String(), "\n") {
					var line struct {
						Msg       string `json:"msg"`
						RequestID string `json:"request_id"`
						Status    int    `json:"status"`
					}
					if json.Unmarshal([]byte(l), &line) == nil && line.Msg == "request" && line.Status == st {
						if line.RequestID != id {
							t.Fatalf("log line request_id %q, the answer's %q", line.RequestID, id)
						}
						found = true
					}
				}
				if found {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no request log line with status %d:\n%s", st, logs.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
