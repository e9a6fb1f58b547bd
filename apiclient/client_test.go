package apiclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
)

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-01$`)

func TestNewTraceparent(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tp, tid := NewTraceparent()
		m := traceparentRE.FindStringSubmatch(tp)
		if m == nil || m[1] != tid {
			t.Fatalf("traceparent %q, trace id %q", tp, tid)
		}
		if m[1] == strings.Repeat("0", 32) || m[2] == strings.Repeat("0", 16) {
			t.Fatalf("all-zero id in %q", tp)
		}
		if seen[tid] {
			t.Fatalf("trace id %s repeated", tid)
		}
		seen[tid] = true
	}
}

// seen is one request as the test server received it.
type seen struct {
	path, auth, traceparent, accept string
	// chat is the chat request as the engine's own decoder reads it; body is its JSON.
	chat *api.Generation
	body string
}

// server is a test engine whose chat answer is the handler the test sets. Request bodies
// are decoded with the engine's decoders (package engine/api), so the tests also check
// that the engine accepts what the client sends.
type server struct {
	srv    *httptest.Server
	mu     sync.Mutex
	reqs   []seen
	health atomic.Int64 // GET /health answers 503 while > 0, counting down
	answer func(w http.ResponseWriter, r *http.Request)
	docs   string
	conns  atomic.Int32 // connections accepted
}

func newServer(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *server {
	t.Helper()
	s := &server{answer: answer}
	mux := http.NewServeMux()
	// record appends r to s.reqs and returns its index.
	record := func(r *http.Request) int {
		q := seen{path: r.URL.Path, auth: r.Header.Get("Authorization"), traceparent: r.Header.Get("traceparent"), accept: r.Header.Get("Accept")}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.reqs = append(s.reqs, q)
		return len(s.reqs) - 1
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		if s.health.Add(-1) >= 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, `{"status":"ok"}`)
	})
	mux.HandleFunc("POST /v1/documents", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.docs = string(b)
		s.mu.Unlock()
		d, e := api.DecodeDocuments(b)
		if e != nil {
			e.Write(w)
			return
		}
		fmt.Fprintf(w, `{"documents":%d}`, len(d.Docs))
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		fmt.Fprint(w, "up 1\n")
	})
	mux.HandleFunc("GET /other/metrics", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		http.Error(w, "nope", http.StatusNotFound)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		i := record(r)
		b, _ := io.ReadAll(r.Body)
		g, e := api.DecodeChat(b)
		if e != nil {
			e.Write(w)
			return
		}
		s.mu.Lock()
		s.reqs[i].chat, s.reqs[i].body = g, string(b)
		s.mu.Unlock()
		s.answer(w, r)
	})
	s.srv = httptest.NewUnstartedServer(mux)
	s.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *server) last() seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs[len(s.reqs)-1]
}

// sse writes the events, then flushes.
func sse(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range events {
		fmt.Fprintf(w, "data: %s\n\n", e)
	}
	_ = http.NewResponseController(w).Flush()
}

const (
	roleChunk  = `{"id":"chatcmpl-7","choices":[{"delta":{"role":"assistant","content":""}}]}`
	tokChunk   = `{"id":"chatcmpl-7","choices":[{"delta":{"content":"tok "}}]}`
	usageChunk = `{"id":"chatcmpl-7","choices":[],"usage":{"prompt_tokens":42,"completion_tokens":3}}`
)

func TestChatStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
		// want
		kind             string // "" = success
		status           int
		msg              string
		requestID        string
		prompt, output   int
		usage, ttft, e2e bool
		deltas           int // content deltas ("tok ")
	}{
		{"full stream with header id", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("X-Request-Id", "hdr-1")
			sse(w, roleChunk, tokChunk, tokChunk, tokChunk, usageChunk, "[DONE]")
		}, "", 200, "", "hdr-1", 42, 3, true, true, true, 3},
		{"chunk id without header, no usage", func(w http.ResponseWriter, _ *http.Request) {
			sse(w, roleChunk, tokChunk, tokChunk, "[DONE]")
		}, "", 200, "", "chatcmpl-7", 0, 2, false, true, true, 2},
		{"HTTP error with OpenAI body", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("X-Request-Id", "hdr-2")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"error":{"message":"The queue is full.","type":"queue_full"}}`)
		}, KindHTTP(503), 503, "http_503: HTTP 503: The queue is full.", "hdr-2", 0, 0, false, false, true, 0},
		{"HTTP error with plain body", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "teapot", http.StatusTeapot)
		}, "http_418", 418, "http_418: HTTP 418: teapot", "", 0, 0, false, false, true, 0},
		{"error event", func(w http.ResponseWriter, _ *http.Request) {
			sse(w, tokChunk, `{"error":{"message":"worker lost","type":"worker_unavailable"}}`)
		}, KindStream, 200, "stream_error: error event: worker lost (worker_unavailable)", "chatcmpl-7", 0, 1, false, true, true, 1},
		{"bad event", func(w http.ResponseWriter, _ *http.Request) { sse(w, "{oops") },
			KindBadStream, 200, "bad_stream: bad event", "", 0, 0, false, false, true, 0},
		{"truncated", func(w http.ResponseWriter, _ *http.Request) { sse(w, roleChunk, tokChunk) },
			KindTruncated, 200, "truncated: the stream ended before data: [DONE]", "chatcmpl-7", 0, 1, false, true, true, 1},
		{"no content", func(w http.ResponseWriter, _ *http.Request) { sse(w, roleChunk, usageChunk, "[DONE]") },
			KindNoTokens, 200, "no_tokens: the stream carried no content", "chatcmpl-7", 42, 3, true, false, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, tc.answer)
			c := New(s.srv.URL+"/", Config{APIKey: "k3y"})
			q := ChatRequest{Model: "cb-llama", Content: "hello", MaxTokens: 3, IgnoreEOS: true}
			res, err := c.ChatStream(context.Background(), q)
			if tc.kind == "" {
				if err != nil {
					t.Fatalf("error %v", err)
				}
			} else {
				var e *Error
				if !errors.As(err, &e) || e.Kind != tc.kind || e.Status != tc.status || !strings.HasPrefix(err.Error(), tc.msg) {
					t.Fatalf("error %v, want kind %s status %d message %q", err, tc.kind, tc.status, tc.msg)
				}
			}
			if res.Status != tc.status || res.RequestID != tc.requestID || res.PromptTokens != tc.prompt ||
				res.OutputTokens != tc.output || res.Usage != tc.usage || res.HasTTFT != tc.ttft || (res.E2E > 0) != tc.e2e {
				t.Errorf("result %+v", res)
			}
			if len(res.Deltas) != tc.deltas || res.Text() != strings.Repeat("tok ", tc.deltas) {
				t.Errorf("deltas %q, text %q; want %d of %q", res.Deltas, res.Text(), tc.deltas, "tok ")
			}
			if res.HasTTFT && (res.TTFT <= 0 || res.TTFT > res.E2E) {
				t.Errorf("TTFT %v, E2E %v", res.TTFT, res.E2E)
			}
			got := s.last()
			if m := traceparentRE.FindStringSubmatch(got.traceparent); m == nil || m[1] != res.TraceID {
				t.Errorf("traceparent %q, result trace id %q", got.traceparent, res.TraceID)
			}
			if got.path != "/v1/chat/completions" || got.auth != "Bearer k3y" || got.accept != "text/event-stream" {
				t.Errorf("request %+v", got)
			}
			g := got.chat
			if g == nil || g.Model != "cb-llama" || len(g.Messages) != 1 || g.Messages[0] != (api.Message{Role: "user", Content: "hello"}) ||
				g.MaxTokens != 3 || g.Temperature != 0 || !g.Stream || !g.IncludeUsage || !g.IgnoreEOS || g.NoReuse {
				t.Errorf("request as the engine reads it: %+v", g)
			}
		})
	}
}

func TestChatStreamOptionalFields(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, _ *http.Request) { sse(w, tokChunk, "[DONE]") })
	c := New(s.srv.URL, Config{})
	if _, err := c.ChatStream(context.Background(), ChatRequest{Model: "m", Content: "x", MaxTokens: 1, NoReuse: true}); err != nil {
		t.Fatal(err)
	}
	got := s.last()
	if got.auth != "" || got.chat == nil || got.chat.IgnoreEOS || !got.chat.NoReuse {
		t.Errorf("auth %q, request as the engine reads it: %+v", got.auth, got.chat)
	}
}

// The messages and the "cacheblend" extension are sent as the engine reads them, and no
// extension is sent when nothing is set.
func TestChatStreamMessagesAndCacheBlend(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, _ *http.Request) { sse(w, tokChunk, "[DONE]") })
	c := New(s.srv.URL, Config{})
	ratio := 0.0
	sys := []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}
	tests := []struct {
		name     string
		q        ChatRequest
		ext      string // the "cacheblend" JSON sent; "" for none
		messages []api.Message
		noReuse  bool
		blend    api.BlendOptions
	}{
		{name: "no extension", q: ChatRequest{Content: "x"}, messages: []api.Message{{Role: "user", Content: "x"}}},
		{name: "zero options send none", q: ChatRequest{Content: "x", CacheBlend: &CacheBlendOptions{}}, messages: []api.Message{{Role: "user", Content: "x"}}},
		{name: "messages win over content", q: ChatRequest{Messages: sys, Content: "ignored"}, messages: []api.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}},
		{name: "ratio 0 and selection", q: ChatRequest{Messages: sys, CacheBlend: &CacheBlendOptions{RecomputeRatio: &ratio, Selection: "random"}},
			ext: `{"recompute_ratio":0,"selection":"random"}`, messages: []api.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}},
			blend: api.BlendOptions{RecomputeRatio: &ratio, Selection: api.SelectionRandom}},
		{name: "quality check", q: ChatRequest{Content: "x", CacheBlend: &CacheBlendOptions{QualityCheck: true}},
			ext: `{"quality_check":true}`, messages: []api.Message{{Role: "user", Content: "x"}}, blend: api.BlendOptions{QualityCheck: true}},
		{name: "no reuse via options", q: ChatRequest{Content: "x", CacheBlend: &CacheBlendOptions{Reuse: new(false)}},
			ext: `{"reuse":false}`, messages: []api.Message{{Role: "user", Content: "x"}}, noReuse: true},
		{name: "NoReuse with options", q: ChatRequest{Content: "x", NoReuse: true, CacheBlend: &CacheBlendOptions{Reuse: new(true), QualityCheck: true}},
			ext: `{"reuse":false,"quality_check":true}`, messages: []api.Message{{Role: "user", Content: "x"}}, noReuse: true, blend: api.BlendOptions{QualityCheck: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.q.Model, tc.q.MaxTokens = "m", 1
			opts := tc.q.CacheBlend
			var before CacheBlendOptions
			if opts != nil {
				before = *opts
			}
			res, err := c.ChatStream(context.Background(), tc.q)
			if err != nil || res.Text() != "tok " {
				t.Fatalf("%+v, %v", res, err)
			}
			if opts != nil && *opts != before {
				t.Errorf("the caller's options changed: %+v", *opts)
			}
			got := s.last()
			ext := ""
			if _, after, ok := strings.Cut(got.body, `"cacheblend":`); ok {
				ext = after[:strings.Index(after, "}")+1]
			}
			g := got.chat
			if ext != tc.ext || g == nil || fmt.Sprint(g.Messages) != fmt.Sprint(tc.messages) || g.NoReuse != tc.noReuse ||
				fmt.Sprint(g.Blend.Selection, g.Blend.QualityCheck) != fmt.Sprint(tc.blend.Selection, tc.blend.QualityCheck) ||
				(g.Blend.RecomputeRatio == nil) != (tc.blend.RecomputeRatio == nil) ||
				g.Blend.RecomputeRatio != nil && *g.Blend.RecomputeRatio != *tc.blend.RecomputeRatio {
				t.Errorf("sent %s (extension %s), the engine reads %+v", got.body, ext, g)
			}
		})
	}
}

// TestConnectionsReused checks that every call leaves its connection
// reusable: sequential calls of each kind arrive on one connection (a body
// closed before its end would make the transport dial anew each time).
func TestConnectionsReused(t *testing.T) {
	tests := []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
		call   func(c *Client) error
	}{
		// The handler returns after the client has read [DONE], so the
		// chunked body's end arrives in a later packet, as from the engine.
		{"stream ending in [DONE]", func(w http.ResponseWriter, _ *http.Request) {
			sse(w, roleChunk, tokChunk, usageChunk, "[DONE]")
			time.Sleep(20 * time.Millisecond)
		},
			func(c *Client) error {
				_, err := c.ChatStream(context.Background(), ChatRequest{Model: "m", Content: "x", MaxTokens: 1})
				return err
			}},
		{"error answer", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"message":"busy"}}`, http.StatusTooManyRequests)
		}, func(c *Client) error {
			if _, err := c.ChatStream(context.Background(), ChatRequest{Model: "m", Content: "x", MaxTokens: 1}); err == nil {
				return errors.New("a 429 was not an error")
			}
			return nil
		}},
		{"health", nil, func(c *Client) error { return c.WaitHealthy(context.Background(), time.Second) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, tt.answer)
			c := New(s.srv.URL, Config{})
			for i := range 5 {
				if err := tt.call(c); err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			if n := s.conns.Load(); n != 1 {
				t.Errorf("5 sequential calls opened %d connections, want 1", n)
			}
		})
	}
}

func TestChatStreamTimeoutAndCancel(t *testing.T) {
	release := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, roleChunk, tokChunk) // a first token, then a stall
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	c := New(s.srv.URL, Config{})

	res, err := c.ChatStream(context.Background(), ChatRequest{Model: "m", Content: "x", MaxTokens: 2, Timeout: 100 * time.Millisecond})
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindTimeout || e.Status != 200 || !res.HasTTFT {
		t.Fatalf("timeout: %+v, %v", res, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = c.ChatStream(ctx, ChatRequest{Model: "m", Content: "x", MaxTokens: 2})
	if !errors.As(err, &e) || e.Kind != KindCanceled {
		t.Fatalf("cancel: %v", err)
	}

	// A deadline of the caller's own is a cancellation, not the request's timeout.
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = c.ChatStream(ctx, ChatRequest{Model: "m", Content: "x", MaxTokens: 2, Timeout: time.Hour})
	if !errors.As(err, &e) || e.Kind != KindCanceled {
		t.Fatalf("caller deadline: %v", err)
	}
}

// closedURL returns the URL of a port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + l.Addr().String()
	l.Close()
	return u
}

func TestChatStreamConnectionRefused(t *testing.T) {
	c := New(closedURL(t), Config{})
	res, err := c.ChatStream(context.Background(), ChatRequest{Model: "m", Content: "x", MaxTokens: 1})
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindConnection || e.Status != 0 || res.Status != 0 || res.TraceID == "" {
		t.Fatalf("%+v, %v", res, err)
	}
}

func TestWaitHealthy(t *testing.T) {
	s := newServer(t, nil)
	s.health.Store(2) // two 503s, then 200
	c := New(s.srv.URL, Config{APIKey: "k"})
	if err := c.WaitHealthy(context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	n, auth := len(s.reqs), s.reqs[0].auth
	s.mu.Unlock()
	if n != 3 || auth != "Bearer k" {
		t.Errorf("%d health calls (want 3), auth %q", n, auth)
	}

	s.health.Store(1 << 40)
	err := c.WaitHealthy(context.Background(), 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "engine not healthy after 300ms: status 503") {
		t.Errorf("unhealthy: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.WaitHealthy(ctx, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}

	if err := New(closedURL(t), Config{}).WaitHealthy(context.Background(), 0); err == nil || !strings.Contains(err.Error(), "not healthy") {
		t.Errorf("refused: %v", err)
	}
}

func TestIngest(t *testing.T) {
	s := newServer(t, nil)
	c := New(s.srv.URL, Config{APIKey: "k"})
	if err := c.Ingest(context.Background(), []Document{{ID: "a", Text: "alpha"}, {ID: "b", Text: "beta \"q\""}}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	docs := s.docs
	s.mu.Unlock()
	if want := `{"documents":[{"id":"a","text":"alpha"},{"id":"b","text":"beta \"q\""}]}`; docs != want {
		t.Errorf("body %s, want %s", docs, want)
	}
	if got := s.last(); got.path != "/v1/documents" || got.auth != "Bearer k" {
		t.Errorf("request %+v", got)
	}

	// The engine refuses an empty document; its OpenAI-style message is the error's.
	err := c.Ingest(context.Background(), []Document{{ID: "a", Text: "alpha"}, {ID: "empty"}})
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != 400 || he.Message != "Document 1 is empty." ||
		err.Error() != "ingest documents: HTTP 400: Document 1 is empty." {
		t.Errorf("error %v", err)
	}
}

func TestMetrics(t *testing.T) {
	s := newServer(t, nil)
	c := New(s.srv.URL, Config{APIKey: "k"})
	for _, tc := range []struct {
		name, url, auth string
	}{
		{"default URL", "", "Bearer k"},
		{"own metrics", s.srv.URL + "/metrics", "Bearer k"},
		{"other URL gets no key", s.srv.URL + "/metrics?x=1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := c.Metrics(context.Background(), tc.url)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || string(b) != "up 1\n" {
				t.Fatalf("body %q, %v", b, err)
			}
			if got := s.last(); got.auth != tc.auth || got.accept != "text/plain;version=0.0.4" {
				t.Errorf("request %+v, want auth %q", got, tc.auth)
			}
		})
	}
	_, err := c.Metrics(context.Background(), s.srv.URL+"/other/metrics")
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != 404 || he.Message != "nope" {
		t.Errorf("error %v", err)
	}
}
