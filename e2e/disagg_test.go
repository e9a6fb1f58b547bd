package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/demo"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/internal/freeport"
	"github.com/cacheblend/cacheblend/rpc/mtls"
	"github.com/cacheblend/cacheblend/stack"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore"
)

// pdNodes is a prefill node and a decode node (each cb blend + cb worker +
// cb engine, started by stack.Up with one CA), exporting to one collector.
type pdNodes struct {
	t          *testing.T
	prefill    *stack.Stack
	decode     *stack.Stack
	p, d       stack.Endpoints
	logs       *syncWriter
	collector  *tracestore.Collector
	queryURL   string
	kvSendRate int64
	// stackKey is the engines' shared stack key (CB_STACK_KEY): the test
	// signs its X-CB-Decode-Engine choices with it, as the gateway does.
	stackKey []byte
}

// e2eStackKey is the stack key the hand-over tests give their engines and
// gateways (CB_STACK_KEY, at least api.MinStackKeyBytes).
const e2eStackKey = "e2e-stack-key-0123456789abcdef0123456789abcdef"

// decodeHeaders names decodeURL as the decode engine of one request to a
// prefill engine, with the gateway's proof (api.DecodeAuth, a fresh nonce)
// made with key, plus the extra headers.
func decodeHeaders(key []byte, decodeURL string, extra map[string]string) map[string]string {
	var nonce [12]byte
	_, _ = rand.Read(nonce[:])
	h := map[string]string{
		api.HeaderDecodeEngine: decodeURL,
		api.HeaderDecodeAuth:   api.DecodeAuth(key, decodeURL, hex.EncodeToString(nonce[:]), time.Now().Add(api.HandoffTTL)),
	}
	for k, v := range extra {
		h[k] = v
	}
	return h
}

// toDecode is decodeHeaders for this pair's decode engine.
func (x *pdNodes) toDecode(extra map[string]string) map[string]string {
	return decodeHeaders(x.stackKey, x.d.Engine.API, extra)
}

// startPD starts the two nodes. The prefill worker paces its KV reads at
// kvSendRate bytes/s, so that a transfer lasts long enough to be cut.
func startPD(t *testing.T, kvSendRate int64) *pdNodes {
	t.Helper()
	x := &pdNodes{t: t, logs: &syncWriter{}, kvSendRate: kvSendRate, stackKey: []byte(e2eStackKey)}
	col, err := tracestore.New(tracestore.Config{OTLPAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0"}, component.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := col.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	x.collector, x.queryURL = col, "http://"+col.QueryAddr()
	tlsDir := filepath.Join(t.TempDir(), "tls")
	if err := mtls.WriteDir(tlsDir, mtls.DefaultHosts, time.Hour); err != nil {
		t.Fatal(err)
	}
	small := []string{"--layers", "4"} // both workers: one KV layout
	// Fixed API ports: a restarted engine keeps its address.
	ports, err := freeport.Ports(2)
	if err != nil {
		t.Fatal(err)
	}
	up := func(name string, engineArgs, workerArgs []string) *stack.Stack {
		api := fmt.Sprintf("127.0.0.1:%d", ports[0])
		if name == "decode" {
			api = fmt.Sprintf("127.0.0.1:%d", ports[1])
		}
		st, err := stack.Up(context.Background(), stack.UpConfig{
			Exe: cbBin, APIAddr: api, TLSDir: tlsDir,
			OTLPEndpoint: "http://" + col.OTLPAddr() + "/v1/traces", OTLPProtocol: "http/protobuf",
			Env:        []string{"OTEL_BSP_SCHEDULE_DELAY=100", "CB_STACK_KEY=" + e2eStackKey},
			EngineArgs: engineArgs, WorkerArgs: append(small, workerArgs...),
			Supervisor: stack.Config{Logs: &prefixWriter{prefix: name + " ", w: x.logs}, ReadyTimeout: 90 * time.Second},
		})
		if err != nil {
			t.Fatalf("%s node: %v\nlogs:\n%s", name, err, tail(x.logs.String(), 60))
		}
		return st
	}
	// The prefill engine's allow-list: the decode engine's URL.
	x.prefill = up("prefill", []string{"--role", "prefill", "--decode-engine", fmt.Sprintf("http://127.0.0.1:%d", ports[1])}, []string{"--kv-send-rate", fmt.Sprint(kvSendRate)})
	x.decode = up("decode", []string{"--role", "decode"}, nil)
	x.p, x.d = x.prefill.Endpoints(), x.decode.Endpoints()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, st := range []*stack.Stack{x.decode, x.prefill} {
			if err := st.Shutdown(ctx); err != nil {
				t.Errorf("stack shutdown: %v", err)
			}
		}
		col.Shutdown(ctx)
		if t.Failed() {
			t.Logf("process logs:\n%s", tail(x.logs.String(), 120))
		}
	})
	return x
}

// prefixWriter prefixes each write (one log line) with the node's name.
type prefixWriter struct {
	prefix string
	w      io.Writer
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append([]byte(p.prefix), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// chatBody is a greedy chat completion of content.
func chatBody(content string, maxTokens int, stream bool, extra map[string]any) []byte {
	body := map[string]any{"model": "cb-llama", "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": content}}}
	for k, v := range extra {
		body[k] = v
	}
	b, _ := json.Marshal(body)
	return b
}

// answer is one HTTP answer: status, headers, the completion's text (for
// streams: the deltas, with any error event) and the raw body.
type answer struct {
	status int
	header http.Header
	text   string
	body   string
	took   time.Duration
}

// send posts body to base's chat route with headers and reads the answer
// (status 0 and the error as body when the call failed).
func send(base string, hdr map[string]string, body []byte) answer {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	t0 := time.Now()
	resp, err := (&http.Client{Timeout: 120 * time.Second}).Do(req)
	if err != nil {
		return answer{body: err.Error(), took: time.Since(t0)}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, body: string(raw), took: time.Since(t0)}
	if resp.StatusCode != http.StatusOK {
		return a
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var sb strings.Builder
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			var ch struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
				Error *api.ErrorObject `json:"error"`
			}
			if json.Unmarshal([]byte(line), &ch) == nil {
				if ch.Error != nil {
					sb.WriteString("<error: " + ch.Error.Message + ">")
				} else if len(ch.Choices) > 0 {
					sb.WriteString(ch.Choices[0].Delta.Content)
				}
			}
		}
		a.text = sb.String()
		return a
	}
	var out struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &out); err == nil && len(out.Choices) == 1 {
		a.text = out.Choices[0].Message.Content
	}
	return a
}

// scrapeValue returns the value of one sample (name with its labels) at a
// /metrics URL, -1 when absent.
func scrapeValue(url, sample string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, sample+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return -1
}

// waitValue waits until the sample at url satisfies ok.
func waitValue(t *testing.T, url, sample string, ok func(float64) bool, what string) float64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		v := scrapeValue(url, sample)
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s = %v", what, sample, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPrefillDecodeDisaggregation: 1 prefill node + 1 decode node, the
// hand-over driven over HTTP as a gateway would (X-CB-Decode-Engine on the
// request to the prefill engine): greedy tokens equal to one engine's,
// one trace prefill → kv.transfer → decode checked against the contract,
// blocks deduplicated on a second request sharing the prefix, and the
// decode engine killed mid-transfer answered by a clean OpenAI-shaped
// error with the KV blocks freed on both sides.
func TestPrefillDecodeDisaggregation(t *testing.T) {
	x := startPD(t, 2<<20) // 2 MB/s: a 2-document prompt's KV (~2.7 MB) takes ~1.3 s
	p := x.p.Engine.API
	// The prefill node's blend server holds the documents: CacheBlend reuse
	// on the prefill engine.
	var docs []map[string]string
	for _, doc := range demo.Documents() {
		docs = append(docs, map[string]string{"id": doc.ID, "text": doc.Text})
	}
	ib, _ := json.Marshal(map[string]any{"documents": docs})
	if resp, err := http.Post(p+"/v1/documents", "application/json", bytes.NewReader(ib)); err != nil || resp.StatusCode != 200 {
		t.Fatalf("ingest: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// 1. Greedy tokens equal to one engine's. Computed in full (no reuse
	// anywhere, no deduplication), the hand-over alone separates the two.
	full := map[string]any{"cacheblend": map[string]any{"reuse": false}}
	question := demo.Prompt(demo.Documents()[7:8], "Question: summarize this document in one sentence.")
	one := send(p, nil, chatBody(question, 24, false, full))
	dis := send(p, x.toDecode(nil), chatBody(question, 24, false, full))
	if one.status != 200 || dis.status != 200 || one.text == "" || dis.text != one.text {
		t.Fatalf("one engine %d %q\ndisaggregated %d %q %s", one.status, one.text, dis.status, dis.text, dis.body)
	}
	if r, _ := api.ParseKVReport(dis.header); r.BlocksDeduped != 0 || r.BlocksSent == 0 {
		t.Fatalf("full request's transfer %+v", r)
	}
	t.Logf("greedy: one engine %v, disaggregated %v, same %d-byte answer; transfer %s bytes, %s blocks",
		one.took.Round(time.Millisecond), dis.took.Round(time.Millisecond), len(dis.text), dis.header.Get(api.HeaderKVBytes), dis.header.Get(api.HeaderKVBlocksSent))

	// 2. One trace: prefill SERVER (CacheBlend subtree) → kv.transfer →
	// decode SERVER → kv.receive → kv.send, checked against the contract.
	docs14 := []demo.Document{demo.Documents()[1], demo.Documents()[4]}
	rag := demo.Prompt(docs14, "Question: what do these documents have in common?")
	a := send(p, x.toDecode(map[string]string{"traceparent": caller}), chatBody(rag, 16, true, nil))
	if a.status != 200 || strings.Contains(a.text, "<error") {
		t.Fatalf("RAG hand-over: %d %s", a.status, a.body)
	}
	first, _ := api.ParseKVReport(a.header)
	tr := x.trace("4bf92f3577b34da6a3ce929d0e0e4736", spanname.KVTransfer, spanname.KVReceive, spanname.KVSend,
		spanname.CBLookup, spanname.CBRetrieve, spanname.CBExecute, spanname.EngineDecode)
	spec, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	if rep := tracecheck.Check([]tracecheck.Trace{*tr}, spec); !rep.OK() {
		for _, s := range tr.Spans {
			t.Logf("%-22s %s %s parent %s  %v +%v", s.Name, s.Service, s.SpanID, s.ParentSpanID, s.Start.Format("05.000000"), s.Duration())
		}
		t.Fatalf("contract check failed:\n%s", rep.String())
	}
	spans := byName(tr)
	servers, kvt := spans["chat cb-llama"], spans[spanname.KVTransfer]
	if len(servers) != 2 || len(kvt) != 1 {
		t.Fatalf("%d SERVER spans, %d kv.transfer", len(servers), len(kvt))
	}
	var pserver, dserver *tracecheck.Span
	for _, s := range servers {
		if s.ParentSpanID == kvt[0].SpanID {
			dserver = s
		} else {
			pserver = s
		}
	}
	if pserver == nil || dserver == nil || kvt[0].ParentSpanID != pserver.SpanID || pserver.ParentSpanID != "00f067aa0ba902b7" {
		t.Fatal("want caller → prefill SERVER → kv.transfer → decode SERVER")
	}
	if spanByID(tr, spans[spanname.CBRequest][0].ParentSpanID) != pserver || spans[spanname.KVReceive][0].ParentSpanID != dserver.SpanID ||
		spans[spanname.KVSend][0].ParentSpanID != spans[spanname.KVReceive][0].SpanID {
		t.Fatal("CacheBlend subtree under the prefill SERVER, kv.receive under the decode SERVER, kv.send under kv.receive: violated")
	}
	ka := kvt[0].Attributes
	if ka["bytes"].Int == 0 || ka["blocks_sent"].Int == 0 || ka["blocks_sent"].Int != int64(first.BlocksSent) || ka["blocks_deduped"].Int != int64(first.BlocksDeduped) {
		t.Fatalf("kv.transfer attributes %v", ka)
	}
	t.Logf("trace %s: %d spans, services %v; kv.transfer %v bytes, %v blocks sent, %v deduped, %v",
		tr.TraceID, len(tr.Spans), services(tr), ka["bytes"].Int, ka["blocks_sent"].Int, ka["blocks_deduped"].Int, kvt[0].Duration().Round(time.Millisecond))

	// 3. A second request sharing the prefix: the decode engine's prefix
	// cache holds its blocks, which are not sent.
	b := send(p, x.toDecode(nil), chatBody(demo.Prompt(docs14, "Question: which one is longer?"), 16, false, nil))
	second, ok := api.ParseKVReport(b.header)
	// (The first one shared only the prompt's opening with the earlier
	// request: the chat template and the instruction, 2 blocks.)
	if b.status != 200 || !ok || second.BlocksDeduped <= first.BlocksDeduped || second.BlocksSent >= first.BlocksSent {
		t.Fatalf("second request: %d %+v %s", b.status, second, b.body)
	}
	t.Logf("shared prefix: %d blocks deduped, %d sent (%d bytes) vs %d sent (%d bytes) the first time; %v vs %v",
		second.BlocksDeduped, second.BlocksSent, second.Bytes, first.BlocksSent, first.Bytes, b.took.Round(time.Millisecond), a.took.Round(time.Millisecond))
	if v, want := scrapeValue(x.p.Engine.API+"/metrics", `cb_kv_handoff_blocks_total{direction="sent",outcome="deduped"}`), first.BlocksDeduped+second.BlocksDeduped; v != float64(want) {
		t.Errorf("prefill engine counted %v deduped blocks, want %d", v, want)
	}

	// The RAG request with CacheBlend reuse on the prefill engine: the
	// same answer from the prefill engine alone (its prefix cache now holds
	// the blended prompt's KV, as the decode engine received it).
	if alone := send(p, nil, chatBody(rag, 16, false, nil)); alone.status != 200 || alone.text != a.text {
		t.Errorf("RAG with reuse: disaggregated %q, the prefill engine alone %d %q", a.text, alone.status, alone.text)
	}
	// The two prompts' answers differ: the comparisons above can fail.
	requireDistinctText(t, one.text, a.text)

	// 4. The decode engine killed mid-transfer.
	x.killDecodeMidTransfer(t)
}

// killDecodeMidTransfer kills the decode engine while its worker pulls a
// prompt's KV: the caller gets a clean OpenAI-shaped error, the prefill
// engine frees the prompt's blocks (its worker's keep ends), the decode
// worker's pull stops, and the restarted decode engine serves again.
func (x *pdNodes) killDecodeMidTransfer(t *testing.T) {
	p, d := x.p.Engine.API, x.d.Engine.API
	usedP := `cb_engine_kv_blocks{state="used"}`
	waitValue(t, p+"/metrics", usedP, func(v float64) bool { return v == 0 }, "prefill engine idle before the fault")
	done := make(chan answer, 1)
	go func() {
		done <- send(p, x.toDecode(nil), chatBody(ragPrompt(2, 5, 6), 8, true, nil))
	}()
	pulling := `cb_worker_kv_handoffs{state="pulling"}`
	waitValue(t, x.d.Worker.Metrics, pulling, func(v float64) bool { return v == 1 }, "decode worker pulling")
	held := scrapeValue(p+"/metrics", usedP)
	kept := scrapeValue(x.p.Worker.Metrics, `cb_worker_kv_handoffs{state="kept"}`)
	pid := 0
	for _, s := range x.decode.Supervisor().Status() {
		if s.Name == "cb-engine" {
			pid = s.PID
		}
	}
	killed := time.Now()
	if err := x.decode.Supervisor().Signal("cb-engine", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var a answer
	select {
	case a = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the request hangs after the decode engine died")
	}
	var eb api.ErrorBody
	if a.status != http.StatusServiceUnavailable || json.Unmarshal([]byte(a.body), &eb) != nil || eb.Error.Code == nil ||
		*eb.Error.Code != "decode_unavailable" || eb.Error.Type != "server_error" {
		t.Fatalf("after the kill: %d %s", a.status, a.body)
	}
	answered := time.Since(killed)
	waitValue(t, x.d.Worker.Metrics, pulling, func(v float64) bool { return v == 0 }, "decode worker's pull stopped")
	waitValue(t, x.p.Worker.Metrics, `cb_worker_kv_handoffs{state="kept"}`, func(v float64) bool { return v == 0 }, "prefill worker's keep ended")
	waitValue(t, p+"/metrics", usedP, func(v float64) bool { return v == 0 }, "prefill engine's blocks freed")
	freed := time.Since(killed)
	// The supervisor restarts the decode engine: a fresh pool, no block
	// used, and hand-overs work again.
	deadline := time.Now().Add(60 * time.Second)
	for {
		restarted := false
		for _, s := range x.decode.Supervisor().Status() {
			restarted = restarted || s.Name == "cb-engine" && s.PID != pid && s.Ready
		}
		if restarted && stack.WaitHealthy(context.Background(), d+"/health", time.Second) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the decode engine did not come back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if v := scrapeValue(d+"/metrics", `cb_engine_kv_blocks{state="used"}`); v != 0 {
		t.Errorf("restarted decode engine: %v blocks used", v)
	}
	again := send(p, x.toDecode(nil), chatBody("hello again", 4, false, nil))
	if again.status != 200 {
		t.Fatalf("after the restart: %d %s", again.status, again.body)
	}
	if v := scrapeValue(p+"/metrics", `cb_kv_handoffs_total{direction="sent",result="error"}`); v < 1 {
		t.Errorf("failed hand-over not counted: %v", v)
	}
	t.Logf("decode engine killed mid-transfer (prefill engine held %v blocks, its worker %v keep): answered %d %s %v after the kill; blocks freed on both sides within %v",
		held, kept, a.status, *eb.Error.Code, answered.Round(time.Millisecond), freed.Round(time.Millisecond))
}

// services lists the services of a trace's spans.
func services(tr *tracecheck.Trace) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range tr.Spans {
		if !seen[s.Service] {
			seen[s.Service] = true
			out = append(out, s.Service)
		}
	}
	return out
}

// trace waits for the trace with every span named in want and both
// engines' SERVER spans.
func (x *pdNodes) trace(traceID string, want ...string) *tracecheck.Trace {
	x.t.Helper()
	e := &env{t: x.t, queryURL: x.queryURL}
	deadline := time.Now().Add(60 * time.Second)
	for {
		tr := e.trace(traceID, want...)
		if len(byName(tr)["chat cb-llama"]) == 2 || time.Now().After(deadline) {
			return tr
		}
		time.Sleep(200 * time.Millisecond)
	}
}
