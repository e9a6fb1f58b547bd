package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cacheblend/cacheblend/component"
)

// Ways a fake engine answers a generation.
const (
	answerOK            = iota
	answer503           // 503 worker_unavailable
	answer429           // 429 queue_full
	answerDieBeforeText // stream: the role event, then the connection is cut
	answerDieAfterText  // stream: the role event and one content event, then the cut
	answerErrorEvent    // stream: headers, then an error event of an unavailable worker
	answerDecode503     // 503 decode_unavailable (set by fakeEngine.badDecode)
	answerStallBefore   // stream: the role event, then silence until the request ends
	answerStallAfter    // stream: the role event and one content event, then silence
	answerSlowText      // stream: the role event, then content events fakeEngine.gap apart
	answerPingThenText  // stream: the role event, ": ping" comments every 20 ms for fakeEngine.gap, then content
)

// fakeEngine is an httptest server speaking the engine's API: /health, /metrics with the load
// gauges, chat and completions (streamed or not), documents and models.
type fakeEngine struct {
	srv  *httptest.Server
	name string

	mu          sync.Mutex
	health      int
	answer      int
	waiting     int
	running     int
	hold        chan struct{} // non-nil: generations wait until it is closed
	requests    int
	documents   int
	traceparent []string
	auth        []string
	decodeHdr   []string        // X-CB-Decode-Engine of each generation
	badDecode   string          // a generation handed over to this decode URL ("*": any) gets 503 decode_unavailable
	healthDelay time.Duration   // /health answers after this
	gap         time.Duration   // answerSlowText, answerPingThenText
	cached      map[uint64]bool // prefix cache: the chained hashes of every 16-byte block seen
}

// cache records body in the fake's prefix cache: one block per 16 bytes (a byte per token,
// as the built-in tokenizer), keyed by the hash of the body up to the block's end, so that
// bodies sharing a prefix share its blocks (f.mu held).
func (f *fakeEngine) cache(body []byte) {
	if f.cached == nil {
		f.cached = map[uint64]bool{}
	}
	h := fnv.New64a()
	for i := 0; i+16 <= len(body); i += 16 {
		h.Write(body[i : i+16])
		f.cached[h.Sum64()] = true
	}
}

func newFakeEngine(t *testing.T) *fakeEngine {
	t.Helper()
	f := &fakeEngine{health: http.StatusOK}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	f.name = strings.TrimPrefix(f.srv.URL, "http://")
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) set(fn func(f *fakeEngine)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeEngine) count() (requests, documents int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests, f.documents
}

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	health, answer, waiting, running, hold, cached := f.health, f.answer, f.waiting, f.running, f.hold, len(f.cached)
	healthDelay, gap := f.healthDelay, f.gap
	f.mu.Unlock()
	switch r.URL.Path {
	case "/health":
		select {
		case <-time.After(healthDelay):
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(health)
		return
	case "/metrics":
		fmt.Fprintf(w, "cb_engine_requests_waiting %d\ncb_engine_requests_running %d\n"+
			"cb_engine_kv_blocks{state=\"free\"} 96\ncb_engine_kv_blocks{state=\"used\"} 32\ncb_engine_kv_blocks{state=\"cached\"} %d\n"+
			"cb_engine_kv_pool_blocks 128\n", waiting, running, cached)
		return
	case "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"cb-llama","object":"model"}]}`)
		return
	case "/v1/documents":
		f.mu.Lock()
		f.documents++
		f.traceparent = append(f.traceparent, r.Header.Get("Traceparent"))
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[]}`)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	f.mu.Lock()
	f.cache(body)
	f.requests++
	f.traceparent = append(f.traceparent, r.Header.Get("Traceparent"))
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	dh := r.Header.Get("X-Cb-Decode-Engine")
	f.decodeHdr = append(f.decodeHdr, dh)
	if dh != "" && (dh == f.badDecode || f.badDecode == "*") {
		answer = answerDecode503
	}
	f.mu.Unlock()
	w.Header().Set("X-Request-Id", "chatcmpl-"+f.name)
	switch answer {
	case answer503:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"The model worker is unavailable","type":"server_error","param":null,"code":"worker_unavailable"}}`)
		return
	case answerDecode503:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"The decode engine is unavailable","type":"server_error","param":null,"code":"decode_unavailable"}}`)
		return
	case answer429:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"message":"queue full","type":"rate_limit_error","param":null,"code":"queue_full"}}`)
		return
	}
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	if !req.Stream {
		if answer == answerDieBeforeText || answer == answerDieAfterText {
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","model":"cb-llama","choices":[{"index":0,"message":{"role":"assistant","content":"hello from %s"},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`, f.name)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	send := func(s string) { io.WriteString(w, "data: "+s+"\n\n"); fl.Flush() }
	if answer == answerErrorEvent {
		send(`{"error":{"message":"The model worker is unavailable: a step failed","type":"server_error","param":null,"code":"worker_unavailable"}}`)
		send("[DONE]")
		return
	}
	send(`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)
	sleep := func(d time.Duration) bool {
		select {
		case <-time.After(d):
			return true
		case <-r.Context().Done():
			return false
		}
	}
	switch answer {
	case answerStallBefore:
		<-r.Context().Done()
		return
	case answerPingThenText:
		for end := time.Now().Add(gap); time.Now().Before(end); {
			io.WriteString(w, ": ping\n\n")
			fl.Flush()
			if !sleep(20 * time.Millisecond) {
				return
			}
		}
	}
	if answer == answerDieBeforeText {
		time.Sleep(10 * time.Millisecond)
		panic(http.ErrAbortHandler)
	}
	for i := range 3 {
		send(fmt.Sprintf(`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"t%d"},"finish_reason":null}]}`, i))
		if answer == answerDieAfterText {
			time.Sleep(10 * time.Millisecond)
			panic(http.ErrAbortHandler)
		}
		if answer == answerStallAfter {
			<-r.Context().Done()
			return
		}
		if answer == answerSlowText && !sleep(gap) {
			return
		}
	}
	send(`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`)
	send(`{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`)
	send("[DONE]")
}

// testGateway is a started gateway over fake engines, with its spans recorded.
type testGateway struct {
	*Gateway
	url   string
	spans *tracetest.SpanRecorder
	reg   *prometheus.Registry
}

func startGateway(t *testing.T, cfg Config, engines ...*fakeEngine) *testGateway {
	t.Helper()
	for _, e := range engines {
		cfg.Engines = append(cfg.Engines, e.srv.URL)
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.HealthInterval == 0 {
		cfg.HealthInterval = 50 * time.Millisecond
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reg := prometheus.NewRegistry()
	g, err := New(cfg, Deps{Deps: component.Deps{TracerProvider: tp, Registerer: reg, Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := g.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return &testGateway{Gateway: g, url: "http://" + g.Addr(), spans: rec, reg: reg}
}

// post sends a chat request through the gateway and returns status, headers and body.
func (tg *testGateway) post(t *testing.T, path, body string, hdr map[string]string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, tg.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func chatBody(content string, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": "cb-llama", "max_tokens": 3, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

// metric returns the text exposition lines of the gateway's /metrics containing all of subs.
func (tg *testGateway) metric(t *testing.T, subs ...string) []string {
	t.Helper()
	resp, err := http.Get(tg.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		ok := !strings.HasPrefix(l, "#")
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}
