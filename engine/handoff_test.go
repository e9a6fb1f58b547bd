package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/internal/enginetest"
)

const prefillWorker = "127.0.0.1:50999" // the prefill worker's advertised address (a double)

// pdEnv is a prefill engine and a decode engine, each with its worker
// double; the decode double pulls from the prefill double.
type pdEnv struct{ p, d *env }

// newPD starts the pair; the prefill engine's allow-list is the decode
// engine and allowed.
func newPD(t *testing.T, allowed ...string) *pdEnv {
	t.Helper()
	d := newEnv(t, envOpts{cfg: Config{Role: RoleDecode, StackKey: testStackKey}})
	p := newEnv(t, envOpts{cfg: prefillConfig(append(allowed, d.base)...)})
	d.worker.AddSource(prefillWorker, p.worker)
	return &pdEnv{p: p, d: d}
}

// testStackKey is the stack key of the tests' engines.
var testStackKey = []byte("the tests' stack key, 32+ bytes.")

// prefillConfig is a prefill engine's configuration with the test stack
// key and the allow-list allowed.
func prefillConfig(allowed ...string) Config {
	return Config{Role: RolePrefill, WorkerAdvertise: prefillWorker, StackKey: testStackKey, DecodeEngines: allowed}
}

// via is the gateway's headers naming the decode engine u: X-CB-Decode-Engine
// and its proof made with the test stack key.
func via(u string) map[string]string {
	return map[string]string{api.HeaderDecodeEngine: u, api.HeaderDecodeAuth: proof(u)}
}

// proof is the gateway's X-CB-Decode-Auth for u (its normalized URL), made
// with the test stack key, valid for api.HandoffTTL.
func proof(u string) string {
	n, err := api.ParseDecodeEngine(u)
	if err != nil {
		n = u
	}
	return api.DecodeAuth(testStackKey, n, "test", time.Now().Add(api.HandoffTTL))
}

// chatVia posts a chat completion to ev with extra headers and returns
// the answer.
func chatVia(t *testing.T, ev *env, hdr map[string]string, content string, maxTokens int, stream bool) *http.Response {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "cb-llama", "max_tokens": maxTokens, "stream": stream, "ignore_eos": true,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	h := map[string]string{"Content-Type": "application/json"}
	maps.Copy(h, hdr)
	return send(t, http.MethodPost, ev.base+"/v1/chat/completions", string(body), h)
}

// TestHandOverMatchesOneEngine: a chat completion sent to the prefill
// engine with X-CB-Decode-Engine is prefilled there, handed over, decoded
// by the decode engine and relayed: the same text as one engine, streamed
// or not, one request id, one trace (prefill SERVER → kv.transfer → decode
// SERVER); a second request sharing the prefix sends fewer blocks; both
// sides free their blocks.
func TestHandOverMatchesOneEngine(t *testing.T) {
	x := newPD(t)
	content := strings.Repeat("Paged KV caches share prefixes. ", 4)
	want := expectedText(chatPrompt(content), 30)
	c := x.p.client(option.WithHeader(api.HeaderDecodeEngine, x.d.base), option.WithHeader(api.HeaderDecodeAuth, proof(x.d.base)),
		option.WithHeader("traceparent", callerTP))
	resp, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "cb-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)}, MaxTokens: openai.Int(30)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != want || resp.Usage.CompletionTokens != 30 || resp.Choices[0].FinishReason != "length" {
		t.Fatalf("handed over: %q (%d tokens, %s), want %q", resp.Choices[0].Message.Content, resp.Usage.CompletionTokens, resp.Choices[0].FinishReason, want)
	}
	// The decode side took the request over: one request id, its first
	// step a decode carrying the prompt.
	steps := x.d.worker.SeqSteps(resp.ID)
	if len(steps) != 29 || steps[0].GetIsPrefill() || len(steps[0].GetPromptTokens()) != len(chatPrompt(content)) {
		t.Fatalf("decode side's steps: %d, first %v", len(steps), steps[0])
	}
	if n := len(x.p.worker.SeqSteps(resp.ID)); n != 1 {
		t.Fatalf("prefill side ran %d steps, want 1", n)
	}

	// Spans: one trace from the caller through both engines.
	waitFor(t, "spans", func() bool {
		return len(spansByName(x.p.rec)[spanname.KVTransfer]) == 1 && len(spansByName(x.d.rec)["chat cb-llama"]) == 1
	})
	pb, db := spansByName(x.p.rec), spansByName(x.d.rec)
	pserver, kvt, dserver := pb["chat cb-llama"][0], pb[spanname.KVTransfer][0], db["chat cb-llama"][0]
	if kvt.SpanKind() != trace.SpanKindClient || kvt.Parent().SpanID() != pserver.SpanContext().SpanID() {
		t.Fatalf("kv.transfer kind %v parent %v", kvt.SpanKind(), kvt.Parent())
	}
	if dserver.Parent().SpanID() != kvt.SpanContext().SpanID() || dserver.SpanContext().TraceID() != pserver.SpanContext().TraceID() {
		t.Fatalf("decode SERVER parent %v trace %v, want kv.transfer %v", dserver.Parent(), dserver.SpanContext().TraceID(), kvt.SpanContext())
	}
	ka := attrs(kvt)
	blocks := int64((len(chatPrompt(content)) + 15) / 16)
	if ka["request_id"] != resp.ID || ka["blocks_sent"] != blocks || ka["blocks_deduped"] != int64(0) || ka["bytes"] != int64(4*len(chatPrompt(content))) {
		t.Fatalf("kv.transfer attributes %v (blocks %d)", ka, blocks)
	}
	if attrs(dserver)["request_id"] != resp.ID || len(pb[spanname.EnginePrefill]) != 1 || len(db[spanname.EnginePrefill]) != 0 ||
		len(db[spanname.EngineDecode]) != 1 || len(db[spanname.CBRequest]) != 0 {
		t.Fatalf("spans: prefill side %v, decode side %v", spanNames(pb), spanNames(db))
	}

	// Streamed, sharing the prompt's first blocks: those are deduplicated.
	content2 := content + "And a second question?"
	sresp := chatVia(t, x.p, via(x.d.base), content2, 12, true)
	if sresp.StatusCode != http.StatusOK || sresp.Header.Get(api.HeaderKVBlocksDeduped) == "" {
		t.Fatalf("stream: %d %v", sresp.StatusCode, sresp.Header)
	}
	text, done := readSSE(t, sresp.Body)
	if want2 := expectedText(chatPrompt(content2), 12); text != want2 || !done {
		t.Fatalf("streamed %q (done %v), want %q", text, done, want2)
	}
	rep, ok := api.ParseKVReport(sresp.Header)
	p1, p2 := chatPrompt(content), chatPrompt(content2)
	common := 0
	for common < min(len(p1), len(p2)) && p1[common] == p2[common] {
		common++
	}
	if !ok || rep.BlocksDeduped != common/16 || rep.BlocksDeduped == 0 || rep.BlocksSent != (len(p2)+15)/16-common/16 {
		t.Fatalf("second hand-over report %+v", rep)
	}
	waitFor(t, "blocks freed on both sides", func() bool {
		ps, ds := x.p.e.SchedulerStats(), x.d.e.SchedulerStats()
		return ps.KVUsed == 0 && ps.HandoffsHeld == 0 && ds.KVUsed == 0
	})
	for _, m := range []struct {
		ev  *env
		dir string
	}{{x.p, "sent"}, {x.d, "received"}} {
		fams := scrape(t, m.ev.base)
		if s := series(fams, "cb_kv_handoffs_total", map[string]string{"direction": m.dir, "result": "ok"}); s.GetCounter().GetValue() != 2 {
			t.Errorf("%s hand-overs %v", m.dir, s)
		}
		if s := series(fams, "cb_kv_handoff_blocks_total", map[string]string{"direction": m.dir, "outcome": "deduped"}); s.GetCounter().GetValue() != float64(rep.BlocksDeduped) {
			t.Errorf("%s deduped blocks %v", m.dir, s)
		}
	}
}

func spanNames(by map[string][]sdktrace.ReadOnlySpan) []string {
	var out []string
	for n := range by {
		out = append(out, n)
	}
	return out
}

// readSSE reads a chat stream: the content and whether it ended with
// [DONE] after no error event.
func readSSE(t *testing.T, r io.Reader) (string, bool) {
	t.Helper()
	var sb strings.Builder
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			return sb.String(), true
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error *api.ErrorObject `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		if ch.Error != nil {
			sb.WriteString("<error " + ch.Error.Message + ">")
			continue
		}
		if len(ch.Choices) > 0 {
			sb.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	return sb.String(), false
}

// TestHandOverRefusals: the hand-over headers need the right role, parse,
// and name the prompt the decode engine tokenizes itself.
func TestHandOverRefusals(t *testing.T) {
	x := newPD(t)
	both := newEnv(t, envOpts{})
	good := api.Handoff{ID: "chatcmpl-x", Worker: prefillWorker, Secret: make([]byte, 32), N: len(chatPrompt("hi")),
		Digest: api.PromptDigest(chatPrompt("hi")), Expires: time.Now().Add(time.Minute).Unix()}
	other := good
	other.Digest = api.PromptDigest([]int32{1})
	good, other = good.Sign(testStackKey, x.d.base), other.Sign(testStackKey, x.d.base)
	for _, tc := range []struct {
		name string
		ev   *env
		hdr  map[string]string
		code string
	}{
		{"decode header to a both engine", both, via(x.d.base), "wrong_role"},
		{"decode header to a decode engine", x.d, via(x.d.base), "wrong_role"},
		{"hand-over to a prefill engine", x.p, map[string]string{api.HeaderHandoff: good.String()}, "wrong_role"},
		{"hand-over to a both engine", both, map[string]string{api.HeaderHandoff: good.String()}, "wrong_role"},
		{"bad decode URL", x.p, via("ftp://x"), "invalid_handoff"},
		{"bad hand-over", x.d, map[string]string{api.HeaderHandoff: "v=1;id=x"}, "invalid_handoff"},
		{"another prompt", x.d, map[string]string{api.HeaderHandoff: other.String()}, "handoff_mismatch"},
		{"both headers", x.d, map[string]string{api.HeaderHandoff: good.String(), api.HeaderDecodeEngine: x.d.base}, "invalid_handoff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := chatVia(t, tc.ev, tc.hdr, "hi", 4, false)
			checkErrorBody2(t, resp, http.StatusBadRequest, tc.code)
		})
	}
	if _, err := New(Config{Role: "sideways"}, Deps{Worker: enginetest.WorkerClient(t, enginetest.NewWorker(8, 16, 64))}); err == nil {
		t.Error("unknown role accepted")
	}
	if _, err := New(Config{Role: RolePrefill, StackKey: testStackKey}, Deps{Worker: enginetest.WorkerClient(t, enginetest.NewWorker(8, 16, 64))}); err == nil {
		t.Error("prefill role without the worker's address accepted")
	}
	for _, role := range []string{RolePrefill, RoleDecode} {
		if _, err := New(Config{Role: role, WorkerAdvertise: prefillWorker, StackKey: []byte("short")},
			Deps{Worker: enginetest.WorkerClient(t, enginetest.NewWorker(8, 16, 64))}); err == nil || !strings.Contains(err.Error(), "stack key") {
			t.Errorf("role %s without a stack key: %v", role, err)
		}
	}
}

// checkErrorBody2 checks an OpenAI error answer's status and code.
func checkErrorBody2(t *testing.T, resp *http.Response, status int, code string) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	var body api.ErrorBody
	if resp.StatusCode != status || json.Unmarshal(b, &body) != nil || body.Error.Code == nil || *body.Error.Code != code || body.Error.Message == "" {
		t.Fatalf("status %d body %s, want %d with code %s", resp.StatusCode, b, status, code)
	}
}

// TestHandOverFailures: a decode engine that cannot be reached, a pull that
// fails and a stream that breaks off all end in an OpenAI-shaped error, and
// the prefill side frees its blocks (the worker's keep dropped).
func TestHandOverFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	// A decode engine that dies after its first event.
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"par\"}}]}\n\ndata: {\"choi")
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer broken.Close()
	x := newPD(t, dead, broken.URL)
	freed := func(what string) {
		t.Helper()
		waitFor(t, what+": prefill side freed", func() bool {
			st := x.p.e.SchedulerStats()
			return st.KVUsed == 0 && st.HandoffsHeld == 0
		})
		waitFor(t, what+": decode side freed", func() bool { return x.d.e.SchedulerStats().KVUsed == 0 })
	}

	for _, stream := range []bool{false, true} {
		resp := chatVia(t, x.p, via(dead), "nobody decodes", 8, stream)
		checkErrorBody2(t, resp, http.StatusServiceUnavailable, "decode_unavailable")
		freed(fmt.Sprintf("unreachable (stream %v)", stream))
	}

	x.d.worker.SetPullHook(func(context.Context) error { return status.Error(codes.PermissionDenied, "wrong secret") })
	resp := chatVia(t, x.p, via(x.d.base), "pull fails", 8, true)
	checkErrorBody2(t, resp, http.StatusServiceUnavailable, "kv_transfer_failed")
	freed("pull failed")
	x.d.worker.SetPullHook(nil)

	resp = chatVia(t, x.p, via(broken.URL), "broken stream", 8, true)
	text, done := readSSE(t, resp.Body)
	if !strings.HasPrefix(text, "par<error The decode engine is unavailable") || !done {
		t.Fatalf("broken stream relayed as %q (done %v)", text, done)
	}
	freed("stream broke off")
	if s := series(scrape(t, x.p.base), "cb_kv_handoffs_total", map[string]string{"direction": "sent", "result": "error"}); s.GetCounter().GetValue() != 4 {
		t.Errorf("failed hand-overs counted %v, want 4", s.GetCounter().GetValue())
	}
}

// fakeDecode is an httptest decode engine on 127.0.0.1 that answers a
// hand-over as mode says, with a usage claiming 32 cached tokens (its
// block dedup), never pulling the KV.
func fakeDecode(t *testing.T, mode string, idle time.Duration) string {
	t.Helper()
	const usage = `"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":32},"cacheblend":{"prefix_hit_tokens":32,"non_prefix_hit_tokens":0,"recomputed_tokens":0}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wait := func(d time.Duration) bool {
			select {
			case <-time.After(d):
				return true
			case <-r.Context().Done():
				return false
			}
		}
		switch mode {
		case "stall before headers":
			wait(10 * idle)
			return
		case "drop":
			panic(http.ErrAbortHandler)
		case "whole":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"x","object":"chat.completion","model":"cb-llama","choices":[{"index":0,"message":{"role":"assistant","content":"ab"},"finish_reason":"length"}],`+usage+`}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		io.WriteString(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n")
		fl.Flush()
		if mode == "stall mid-stream" {
			wait(10 * idle)
			return
		}
		io.WriteString(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[],"+usage+"}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestHandOverFaults: a decode engine that is silent past the hand-over
// idle timeout (before its headers or in the middle of its stream) or drops
// the connection gets the caller a 503 decode_unavailable (nothing relayed
// yet: the gateway may go elsewhere) or an error event, within the idle
// timeout; a decode engine's usage is replaced by the prefill side's (here
// nothing reused: 0 cached tokens, not the decode side's 32).
func TestHandOverFaults(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, tc := range []struct {
		mode      string
		stream    bool
		status    int
		bodyHas   []string
		bodyLacks []string
	}{
		{"whole", false, 200, []string{`"cached_tokens":0`, `"prefix_hit_tokens":0`}, []string{`"cached_tokens":32`}},
		{"stream", true, 200, []string{`"cached_tokens":0`, "[DONE]"}, []string{`"cached_tokens":32`, "error"}},
		{"stall before headers", false, 503, []string{"decode_unavailable", "idle timeout"}, nil},
		{"stall before headers", true, 503, []string{"decode_unavailable", "idle timeout"}, nil},
		{"stall mid-stream", true, 200, []string{`"content":"a"`, "decode_unavailable", "idle timeout", "[DONE]"}, nil},
		{"drop", false, 503, []string{"decode_unavailable"}, nil},
	} {
		t.Run(fmt.Sprint(tc.mode, " stream=", tc.stream), func(t *testing.T) {
			d := fakeDecode(t, tc.mode, idle)
			cfg := prefillConfig(d)
			cfg.HandoffIdleTimeout = idle
			p := newEnv(t, envOpts{cfg: cfg})
			t0 := time.Now()
			resp := chatVia(t, p, via(d), "hello there", 4, tc.stream)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took := time.Since(t0)
			body := string(b)
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			for _, s := range tc.bodyHas {
				if !strings.Contains(body, s) {
					t.Errorf("body lacks %q: %s", s, body)
				}
			}
			for _, s := range tc.bodyLacks {
				if strings.Contains(body, s) {
					t.Errorf("body has %q: %s", s, body)
				}
			}
			if took > idle+2*time.Second {
				t.Fatalf("took %v with an idle timeout of %v", took, idle)
			}
		})
	}
}

// TestHandOverUsageIsThePrefillSides: through a real decode engine, the
// second request of a prompt reports the prefill engine's prefix reuse.
func TestHandOverUsageIsThePrefillSides(t *testing.T) {
	x := newPD(t)
	content := strings.Repeat("Paged KV caches share prefixes. ", 6)
	var cached []int
	for range 2 {
		resp := chatVia(t, x.p, via(x.d.base), content, 3, false)
		var out struct {
			Usage api.Usage `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatal(resp.Status, err)
		}
		resp.Body.Close()
		cb := out.Usage.CacheBlend
		if cb == nil || out.Usage.PromptTokensDetails == nil || cb.PrefixHitTokens+cb.NonPrefixHitTokens != out.Usage.PromptTokensDetails.CachedTokens {
			t.Fatalf("usage %+v", out.Usage)
		}
		cached = append(cached, out.Usage.PromptTokensDetails.CachedTokens)
	}
	// The prefill engine's log line of the second request has its own count.
	want := 0
	for _, l := range strings.Split(x.p.logs.String(), "\n") {
		var m struct {
			Msg    string `json:"msg"`
			Cached *int   `json:"cached_tokens"`
		}
		if json.Unmarshal([]byte(l), &m) == nil && m.Msg == "request" && m.Cached != nil {
			want = *m.Cached
		}
	}
	if cached[0] != 0 || cached[1] == 0 || cached[1] != want {
		t.Fatalf("cached tokens per request %v, the prefill engine's last log line says %d", cached, want)
	}
}

// TestLoopbackAdvertiseRefused: a loopback worker address is not handed
// to a decode engine on another host (500 handoff_misconfigured naming the
// fix, before any work); loopback to loopback is fine.
func TestLoopbackAdvertiseRefused(t *testing.T) {
	for _, tc := range []struct {
		advertise, decode string
		refused           bool
	}{
		{"127.0.0.1:50061", "http://10.0.0.3:8000", true},
		{"localhost:50061", "http://decode.example:8000", true},
		{"[::1]:50061", "http://[2001:db8::1]:8000", true},
		{"127.0.0.1:50061", "http://127.0.0.1:8001", false},
		{"127.0.0.1:50061", "http://localhost:8001", false},
		{"10.0.0.2:50061", "http://10.0.0.3:8000", false},
	} {
		err := CheckAdvertise(tc.advertise, tc.decode)
		if (err != nil) != tc.refused || err != nil && !strings.Contains(err.Error(), "--worker-advertise") {
			t.Errorf("%s to %s: %v", tc.advertise, tc.decode, err)
		}
	}
	cfg := prefillConfig("http://10.255.255.1:8000")
	cfg.WorkerAdvertise = "127.0.0.1:50061"
	p := newEnv(t, envOpts{cfg: cfg})
	resp := chatVia(t, p, via("http://10.255.255.1:8000"), "hi", 2, false)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || !strings.Contains(string(b), CodeHandoffMisconfigured) || !strings.Contains(string(b), "--worker-advertise") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	for _, s := range p.rec.Ended() {
		if s.Name() == spanname.KVTransfer || s.Name() == spanname.EnginePrefill {
			t.Fatalf("a refused hand-over ran %s", s.Name())
		}
	}
}
