package engine

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/internal/enginetest"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/worker"
)

// Attacks on the prefill/decode hand-over (issue 27, items 1 and 2),
// replayed: docs/design.md §9 "Security" and the README's reliability
// table.

// realNode is an engine on a real worker (small model).
type realNode struct {
	base string
	reg  *prometheus.Registry // the engine's
	wreg *prometheus.Registry // the worker's
	addr string               // the worker's gRPC address
}

func startRealNode(t *testing.T, cfg Config) *realNode {
	t.Helper()
	n := &realNode{reg: prometheus.NewRegistry(), wreg: prometheus.NewRegistry()}
	w, err := worker.New(worker.Config{Model: model.Config{Layers: 4, Dim: 64, Heads: 4, KVHeads: 2, FFNDim: 128, MaxPositions: 2048, Threads: 2},
		ShmDir: t.TempDir(), NumBlocks: 128}, worker.Deps{Deps: component.Deps{Registerer: n.wreg}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Shutdown(context.Background()) })
	n.addr = w.Addr()
	conn, err := rpc.Dial(w.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cfg.Addr, cfg.WorkerAdvertise = "127.0.0.1:0", w.Addr()
	e, err := New(cfg, Deps{Deps: component.Deps{Registerer: n.reg}, Worker: cbv1.NewWorkerServiceClient(conn)})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.Shutdown(ctx)
	})
	n.base = "http://" + e.Addr()
	waitFor(t, "engine healthy", func() bool {
		resp, err := http.Get(n.base + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return n
}

// refused reads cb_handoff_refused_total{reason} from reg.
func refused(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cb_handoff_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reason" && lp.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no cb_handoff_refused_total{reason=%q}", reason)
	return 0
}

// completeTokens posts a greedy completion of token ids to base with hdr
// and returns the status, the body and the answer's cached tokens.
func completeTokens(t *testing.T, base string, prompt []int32, hdr map[string]string) (int, string, int) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "cb-llama", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true})
	h := map[string]string{"Content-Type": "application/json"}
	for k, v := range hdr {
		h[k] = v
	}
	resp := send(t, http.MethodPost, base+"/v1/completions", string(b), h)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage api.Usage `json:"usage"`
	}
	cached := -1
	if json.Unmarshal(body, &out) == nil && out.Usage.PromptTokensDetails != nil {
		cached = out.Usage.PromptTokensDetails.CachedTokens
	}
	if resp.StatusCode == http.StatusOK && len(out.Choices) == 1 {
		return resp.StatusCode, out.Choices[0].Text, cached
	}
	return resp.StatusCode, string(body), cached
}

// tokensOf returns n token ids derived from seed (byte tokens).
func tokensOf(seed, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(32 + (seed*31+i*7+i*i)%90)
	}
	return out
}

// TestForgedHandOverRefused replays the cache poisoning on real
// workers. Prompt A's hand-over (id, worker, secret, signature) is
// captured by a decode engine of the allow-list that holds the call open
// (the keep stays); then victim prompt B's body is posted to the decode
// engine with A's hand-over and B's length and digest: refused (403
// handoff_unauthenticated: the signature binds A's digest). Even a
// hand-over signed with the stack key for B (a leaked key, or a prefill
// engine lying) pulling A's keep is refused by the decode worker, whose
// block hashes of B's tokens differ from the blocks A's keeper sends (503
// kv_transfer_failed, block_mismatch counted). B's cached KV is intact:
// B answers exactly as before, from the decode engine's prefix cache.
func TestForgedHandOverRefused(t *testing.T) {
	d := startRealNode(t, Config{Role: RoleDecode, StackKey: testStackKey})
	captured := make(chan string, 1)
	hold := make(chan struct{})
	capture := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		captured <- r.Header.Get(api.HeaderHandoff)
		select {
		case <-hold:
		case <-r.Context().Done():
		}
		http.Error(w, "gone", http.StatusServiceUnavailable)
	}))
	defer capture.Close()
	p := startRealNode(t, Config{Role: RolePrefill, StackKey: testStackKey, DecodeEngines: []string{d.base, capture.URL}})

	promptA, promptB := tokensOf(1, 100), tokensOf(2, 100) // 7 blocks each, the last partial
	// The victim's B, served whole by the decode engine: its prefix cache
	// holds B's blocks.
	status, wantB, _ := completeTokens(t, d.base, promptB, nil)
	if status != http.StatusOK {
		t.Fatalf("B: %d %s", status, wantB)
	}
	if _, again, cached := completeTokens(t, d.base, promptB, nil); again != wantB || cached == 0 {
		t.Fatalf("B again: %q (cached %d), want %q from the prefix cache", again, cached, wantB)
	}

	// A's hand-over, captured.
	done := make(chan struct{})
	go func() {
		defer close(done)
		completeTokens(t, p.base, promptA, via(capture.URL))
	}()
	var header string
	select {
	case header = <-captured:
	case <-time.After(20 * time.Second):
		t.Fatal("no hand-over captured")
	}
	ho, err := api.ParseHandoff(header)
	if err != nil {
		t.Fatal(err)
	}

	// 1. The replay: A's id, worker, secret (and signature), B's
	// length and digest.
	forged := ho
	forged.N, forged.Digest = len(promptB), api.PromptDigest(promptB)
	status, body, _ := completeTokens(t, d.base, promptB, map[string]string{api.HeaderHandoff: forged.String()})
	if status != http.StatusForbidden || !strings.Contains(body, CodeHandoffUnauthenticated) {
		t.Fatalf("forged hand-over: %d %s, want 403 %s", status, body, CodeHandoffUnauthenticated)
	}
	// Re-signed for the capture server, sent to the decode engine: another
	// target, refused too.
	status, body, _ = completeTokens(t, d.base, promptA, map[string]string{api.HeaderHandoff: ho.Sign(testStackKey, capture.URL).String()})
	if status != http.StatusForbidden {
		t.Fatalf("hand-over signed for another decode engine: %d %s", status, body)
	}
	// Expired.
	old := ho
	old.Expires = time.Now().Add(-time.Minute).Unix()
	status, body, _ = completeTokens(t, d.base, promptA, map[string]string{api.HeaderHandoff: old.Sign(testStackKey, d.base).String()})
	if status != http.StatusForbidden || refused(t, d.reg, "expired") != 1 {
		t.Fatalf("expired hand-over: %d %s", status, body)
	}

	// 2. Signed with the stack key for B (the key leaked): the decode
	// worker refuses A's blocks for B's tokens.
	forged.Expires = time.Now().Add(time.Minute).Unix()
	forged = forged.Sign(testStackKey, d.base)
	status, body, _ = completeTokens(t, d.base, promptB, map[string]string{api.HeaderHandoff: forged.String()})
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "kv_transfer_failed") {
		t.Fatalf("hand-over signed for B pulling A's keep: %d %s, want 503 kv_transfer_failed", status, body)
	}
	close(hold)
	<-done

	if v := refused(t, d.reg, "bad_signature"); v != 2 {
		t.Errorf("decode engine counted %v bad signatures, want 2", v)
	}
	if v := refused(t, d.wreg, "block_mismatch"); v != 1 {
		t.Errorf("decode worker counted %v block mismatches, want 1", v)
	}
	// B's cache intact: the same answer, from the prefix cache.
	status, got, cached := completeTokens(t, d.base, promptB, nil)
	if status != http.StatusOK || got != wantB || cached == 0 {
		t.Fatalf("B after the attacks: %d %q (cached %d), want %q from the cache", status, got, cached, wantB)
	}
	// And the legitimate path still works: A handed over to the decode
	// engine answers as the decode engine alone does.
	_, wantA, _ := completeTokens(t, d.base, promptA, nil)
	status, gotA, _ := completeTokens(t, p.base, promptA, via(d.base))
	if status != http.StatusOK || gotA != wantA {
		t.Fatalf("legitimate hand-over: %d %q, want %q", status, gotA, wantA)
	}
	t.Logf("forged hand-over: 403 (2 bad signatures, 1 expired); signed forgery: 503, 1 block mismatch on the decode worker; B's answer and cache intact (%d cached tokens)", cached)
}

// recorder is an allowed "decode engine" that records the requests it gets
// and answers 503 decode_unavailable-free JSON.
type recorder struct {
	srv  *httptest.Server
	hits atomic.Int64
	mu   sync.Mutex
	auth []string
}

func newRecorder(t *testing.T, h http.HandlerFunc) *recorder {
	rc := &recorder{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.hits.Add(1)
		rc.mu.Lock()
		rc.auth = append(rc.auth, r.Header.Get("Authorization"))
		rc.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","model":"cb-llama","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// TestDecodeEngineHeaderOnlyFromGateway: X-CB-Decode-Engine is honoured
// only with the gateway's proof, made with the stack key for that URL and
// not expired, and only for an engine of the allow-list; a refused header
// reaches nobody (403 with a code, counted).
func TestDecodeEngineHeaderOnlyFromGateway(t *testing.T) {
	allowed := newRecorder(t, nil)
	other := newRecorder(t, nil)
	p := newEnv(t, envOpts{cfg: prefillConfig(allowed.srv.URL)})
	otherKey := []byte("another stack's key, 32 bytes...")
	for _, tc := range []struct {
		name   string
		hdr    map[string]string
		status int
		code   string
		reason string
	}{
		{"no proof (a direct client)", map[string]string{api.HeaderDecodeEngine: allowed.srv.URL}, 403, CodeHandoffUnauthenticated, "bad_signature"},
		{"malformed proof", map[string]string{api.HeaderDecodeEngine: allowed.srv.URL, api.HeaderDecodeAuth: "v=1;exp=1"}, 403, CodeHandoffUnauthenticated, "bad_signature"},
		{"proof with another key", map[string]string{api.HeaderDecodeEngine: allowed.srv.URL,
			api.HeaderDecodeAuth: api.DecodeAuth(otherKey, allowed.srv.URL, "n", time.Now().Add(time.Minute))}, 403, CodeHandoffUnauthenticated, "bad_signature"},
		{"proof for another URL", map[string]string{api.HeaderDecodeEngine: other.srv.URL, api.HeaderDecodeAuth: proof(allowed.srv.URL)}, 403, CodeHandoffUnauthenticated, "bad_signature"},
		{"expired proof", map[string]string{api.HeaderDecodeEngine: allowed.srv.URL,
			api.HeaderDecodeAuth: api.DecodeAuth(testStackKey, allowed.srv.URL, "n", time.Now().Add(-time.Minute))}, 403, CodeHandoffUnauthenticated, "expired"},
		{"valid proof, engine outside the allow-list", via(other.srv.URL), 403, CodeDecodeEngineNotAllowed, "not_allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := series(scrape(t, p.base), "cb_handoff_refused_total", map[string]string{"reason": tc.reason}).GetCounter().GetValue()
			resp := chatVia(t, p, tc.hdr, "hello", 4, false)
			checkErrorBody2(t, resp, tc.status, tc.code)
			resp.Body.Close()
			after := series(scrape(t, p.base), "cb_handoff_refused_total", map[string]string{"reason": tc.reason}).GetCounter().GetValue()
			if after != before+1 {
				t.Errorf("cb_handoff_refused_total{reason=%q} %v -> %v", tc.reason, before, after)
			}
		})
	}
	if allowed.hits.Load() != 0 || other.hits.Load() != 0 {
		t.Fatalf("refused headers reached decode engines: %d, %d requests", allowed.hits.Load(), other.hits.Load())
	}
	// The gateway's proof: handed over.
	resp := chatVia(t, p, via(allowed.srv.URL), "hello", 4, false)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || allowed.hits.Load() != 1 {
		t.Fatalf("with the proof: %d, %d requests", resp.StatusCode, allowed.hits.Load())
	}
}

// TestHandOverFollowsNoRedirectForwardsNoAuthorization: a decode engine
// answering 302 (or 307) to another URL is not followed (503
// decode_unavailable, the other URL never asked); the client's
// Authorization never reaches the decode engine (the engine's own API key
// does, when it has one).
func TestHandOverFollowsNoRedirectForwardsNoAuthorization(t *testing.T) {
	target := newRecorder(t, nil)
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect} {
		redirect := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.srv.URL+"/api/stats", code)
		})
		p := newEnv(t, envOpts{cfg: prefillConfig(redirect.srv.URL)})
		resp := chatVia(t, p, via(redirect.srv.URL), "follow me", 4, false)
		checkErrorBody2(t, resp, http.StatusServiceUnavailable, "decode_unavailable")
		resp.Body.Close()
		if redirect.hits.Load() != 1 || target.hits.Load() != 0 {
			t.Fatalf("%d: redirect asked %d times, its target %d times (want 1, 0)", code, redirect.hits.Load(), target.hits.Load())
		}
	}

	for _, tc := range []struct {
		name, apiKey, client, want string
	}{
		{"engine without a key", "", "Bearer sk-the-clients-own-secret", ""},
		{"engine with the stack's key", "stack-credential", "Bearer stack-credential", "Bearer stack-credential"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec := newRecorder(t, nil)
			cfg := prefillConfig(dec.srv.URL)
			cfg.APIKey = tc.apiKey
			p := newEnv(t, envOpts{cfg: cfg})
			hdr := via(dec.srv.URL)
			hdr["Authorization"] = tc.client
			resp := chatVia(t, p, hdr, "secret stays", 4, false)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			dec.mu.Lock()
			defer dec.mu.Unlock()
			if len(dec.auth) != 1 || dec.auth[0] != tc.want {
				t.Fatalf("decode engine got Authorization %q, want %q", dec.auth, tc.want)
			}
		})
	}
}

// TestTarpitDecodeEngineBounded: an allowed decode engine that accepts
// connections and never answers pins at most MaxHandoffsPerPeer prompts'
// KV: of 17 requests naming it, 4 wait (each held until the hand-over's
// idle timeout), 13 are refused at once (503 handoff_peer_busy with
// Retry-After), and a legitimate hand-over to another decode engine is
// served meanwhile, although 17 prompts would not fit in the pool.
func TestTarpitDecodeEngineBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		connMu sync.Mutex
		conns  []net.Conn
	)
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			connMu.Lock()
			conns = append(conns, c) // never read, never answered
			connMu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-acceptDone
		connMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connMu.Unlock()
	})
	tarpit := "http://" + ln.Addr().String()

	const (
		idle    = 3 * time.Second
		perPeer = 4
		pool    = 96 // blocks of 16 tokens
	)
	content := strings.Repeat("tarpit ", 12)
	blocks := (len(chatPrompt(content)) + 15) / 16
	if 17*blocks <= pool || perPeer*blocks+blocks > pool {
		t.Fatalf("%d blocks per prompt: pick the pool so that 17 do not fit and %d+1 do", blocks, perPeer)
	}
	d := newEnv(t, envOpts{cfg: Config{Role: RoleDecode, StackKey: testStackKey}})
	cfg := prefillConfig(tarpit, d.base)
	cfg.MaxHandoffsPerPeer, cfg.HandoffIdleTimeout = perPeer, idle
	p := newEnv(t, envOpts{cfg: cfg, worker: enginetest.NewWorker(pool, 16, 2048)})
	d.worker.AddSource(prefillWorker, p.worker)

	type answer struct {
		status     int
		code       string
		retryAfter string
		took       time.Duration
	}
	answers := make(chan answer, 17)
	t0 := time.Now()
	for range 17 {
		go func() {
			b, _ := json.Marshal(map[string]any{"model": "cb-llama", "max_tokens": 4, "messages": []map[string]string{{"role": "user", "content": content}}})
			req, _ := http.NewRequest(http.MethodPost, p.base+"/v1/chat/completions", strings.NewReader(string(b)))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range via(tarpit) {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- answer{status: -1, code: err.Error()}
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var eb api.ErrorBody
			code := ""
			if json.Unmarshal(body, &eb) == nil && eb.Error.Code != nil {
				code = *eb.Error.Code
			}
			answers <- answer{resp.StatusCode, code, resp.Header.Get("Retry-After"), time.Since(t0)}
		}()
	}
	// The refusals come at once; then the 4 held hand-overs pin 4 prompts.
	busy := 0
	for range 17 - perPeer {
		a := <-answers
		if a.status != http.StatusServiceUnavailable || a.code != CodeHandoffPeerBusy || a.retryAfter == "" || a.took > idle/2 {
			t.Fatalf("refused tarpit request: %+v, want 503 %s with Retry-After at once", a, CodeHandoffPeerBusy)
		}
		busy++
	}
	waitFor(t, "the tarpit's hand-overs held", func() bool { return p.e.SchedulerStats().HandoffsHeld == perPeer })
	held := p.e.SchedulerStats().KVUsed
	if held > perPeer*blocks {
		t.Errorf("%d blocks held for the tarpit, want at most %d", held, perPeer*blocks)
	}
	// A legitimate request, meanwhile: served.
	tl := time.Now()
	resp := chatVia(t, p, via(d.base), "a legitimate request", 4, false)
	resp.Body.Close()
	legit := time.Since(tl)
	if resp.StatusCode != http.StatusOK || legit > idle/2 {
		t.Fatalf("legitimate hand-over while the tarpit holds %d blocks: %d after %v", held, resp.StatusCode, legit)
	}
	for range perPeer {
		a := <-answers
		if a.status != http.StatusServiceUnavailable || a.code != "decode_unavailable" || a.took > idle+3*time.Second {
			t.Fatalf("held tarpit request: %+v, want 503 decode_unavailable within the idle timeout %v", a, idle)
		}
	}
	waitFor(t, "blocks freed", func() bool { st := p.e.SchedulerStats(); return st.KVUsed == 0 && st.HandoffsHeld == 0 })
	if v := series(scrape(t, p.base), "cb_handoff_refused_total", map[string]string{"reason": "peer_busy"}).GetCounter().GetValue(); v != float64(busy) {
		t.Errorf("peer_busy counted %v, want %d", v, busy)
	}
	t.Logf("tarpit: 17 requests, %d refused at once (503 %s), %d held %d of %d blocks until the idle timeout; a legitimate hand-over meanwhile took %v",
		busy, CodeHandoffPeerBusy, perPeer, held, pool, legit)
}

// FuzzVerifyDecodeAuth: any X-CB-Decode-Auth value is refused or verifies,
// never panics, and only a proof made with the key verifies.
func FuzzVerifyDecodeAuth(f *testing.F) {
	const u = "http://127.0.0.1:8001"
	good := api.DecodeAuth(testStackKey, u, "n", time.Now().Add(time.Hour))
	f.Add(good)
	f.Add("v=1;exp=1;nonce=x;sig=AAAA")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		err := api.VerifyDecodeAuth(testStackKey, s, u, time.Now())
		if err == nil && !strings.Contains(s, "sig=") {
			t.Fatalf("%q verified", s)
		}
		if err := api.VerifyDecodeAuth(nil, s, u, time.Now()); err == nil {
			t.Fatalf("%q verified without a key", s)
		}
	})
}
