package loadgen

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheblend/cacheblend/metrics"
)

// testEngine is an in-test HTTP server speaking the engine's streamed chat API. Every
// request is recorded through the real metrics.EngineMetrics, just after the stream's last
// byte (as the engine does), and /metrics serves it through metrics.Handler, so the
// cross-check runs against the real metrics code.
type testEngine struct {
	t   *testing.T
	m   *metrics.EngineMetrics
	srv *httptest.Server

	// ttft is the server-side delay before request i's first token (by arrival order).
	ttft func(i int) time.Duration
	// itl is the delay between tokens.
	itl time.Duration
	// fail makes request i answer 503 (recorded with error_type queue_full).
	fail func(i int) bool
	// unrecorded makes request i skip the metrics (a server that loses requests).
	unrecorded func(i int) bool
	// unhealthy makes /health answer 503.
	unhealthy bool
	// blend, when set, gives request i's usage.cacheblend extension.
	blend func(i int) map[string]any

	arrivals              atomic.Int64
	inflight, maxInflight atomic.Int64

	mu       sync.Mutex
	requests []seenRequest
	docs     []Document
}

// seenRequest is one chat request as the server received it.
type seenRequest struct {
	traceparent string
	body        chatBody
	arrival     time.Time
}

type chatBody struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	MaxTokens     int  `json:"max_tokens"`
	Stream        bool `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	IgnoreEOS  bool `json:"ignore_eos"`
	Cacheblend *struct {
		Reuse *bool `json:"reuse"`
	} `json:"cacheblend"`
}

func newTestEngine(t *testing.T, configure func(*testEngine)) *testEngine {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.NewEngineMetrics(reg, metrics.WithOnRefused(func(err error) { t.Errorf("RecordRequest refused: %v", err) }))
	if err != nil {
		t.Fatal(err)
	}
	e := &testEngine{t: t, m: m, ttft: func(int) time.Duration { return 5 * time.Millisecond }}
	if configure != nil {
		configure(e)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", e.chat)
	mux.HandleFunc("POST /v1/documents", e.documents)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		if e.unhealthy {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, `{"status":"ok"}`)
	})
	mux.Handle("GET /metrics", metrics.Handler(reg, nil))
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *testEngine) URL() string { return e.srv.URL }

func (e *testEngine) seen() []seenRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]seenRequest(nil), e.requests...)
}

func (e *testEngine) documents(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Documents []struct {
			ID   string `json:"id"`
			Text string `json:"text"`
		} `json:"documents"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	for _, d := range body.Documents {
		e.docs = append(e.docs, Document{ID: d.ID, Text: d.Text})
	}
	e.mu.Unlock()
	fmt.Fprintf(w, `{"documents":%d}`, len(body.Documents))
}

func (e *testEngine) chat(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	i := int(e.arrivals.Add(1) - 1)
	// release ends the request's in-flight interval just before its last byte is written, so
	// the count never includes a request the client already saw end.
	cur := e.inflight.Add(1)
	var once sync.Once
	release := func() { once.Do(func() { e.inflight.Add(-1) }) }
	defer release()
	for {
		m := e.maxInflight.Load()
		if cur <= m || e.maxInflight.CompareAndSwap(m, cur) {
			break
		}
	}
	var body chatBody
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.requests = append(e.requests, seenRequest{traceparent: r.Header.Get("traceparent"), body: body, arrival: t0})
	e.mu.Unlock()
	content := ""
	if len(body.Messages) > 0 {
		content = body.Messages[0].Content
	}
	rec := metrics.RequestRecord{Operation: "chat", Model: body.Model, PromptTokens: len(content)}
	defer func() {
		rec.E2E = time.Since(t0)
		if e.unrecorded != nil && e.unrecorded(i) {
			return
		}
		e.m.RecordRequest(r.Context(), rec)
	}()
	id := fmt.Sprintf("chatcmpl-%d", i)
	w.Header().Set("X-Request-Id", id)
	if e.fail != nil && e.fail(i) {
		rec.ErrorType = "queue_full"
		release()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":{"message":"The queue is full.","type":"queue_full"}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		_ = rc.Flush()
	}
	type delta struct {
		Role    string  `json:"role,omitempty"`
		Content *string `json:"content,omitempty"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Delta        delta   `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	}
	chunk := func(d delta, reason *string) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "model": body.Model,
			"choices": []choice{{Delta: d, FinishReason: reason}}}
	}
	empty := ""
	send(chunk(delta{Role: "assistant", Content: &empty}, nil))
	wait := func(d time.Duration) bool {
		if d <= 0 {
			return true
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-r.Context().Done():
			rec.ErrorType = "canceled"
			return false
		case <-t.C:
			return true
		}
	}
	if !wait(e.ttft(i)) {
		return
	}
	for k := range body.MaxTokens {
		if k == 0 {
			rec.TTFT, rec.HasTTFT = time.Since(t0), true
		}
		tok := fmt.Sprintf("t%d ", k)
		send(chunk(delta{Content: &tok}, nil))
		rec.OutputTokens++
		if k < body.MaxTokens-1 && !wait(e.itl) {
			return
		}
	}
	stop := "length"
	send(chunk(delta{}, &stop))
	if body.StreamOptions.IncludeUsage {
		usage := map[string]any{"prompt_tokens": len(content), "completion_tokens": rec.OutputTokens,
			"total_tokens": len(content) + rec.OutputTokens}
		if e.blend != nil {
			usage["cacheblend"] = e.blend(i)
		}
		send(map[string]any{"id": id, "object": "chat.completion.chunk", "model": body.Model, "choices": []choice{},
			"usage": usage})
	}
	release()
	fmt.Fprint(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}
