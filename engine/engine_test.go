package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/internal/enginetest"
	"github.com/cacheblend/cacheblend/engine/scheduler"
	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/tokenizer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lines returns the JSON log lines with msg.
func (s *syncBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

type envOpts struct {
	cfg       Config
	worker    *enginetest.Worker
	blend     *enginetest.Blend
	deadBlend bool
	sampler   sdktrace.Sampler
	notReady  bool
}

type env struct {
	e      *Engine
	base   string
	worker *enginetest.Worker
	blend  *enginetest.Blend
	reg    *prometheus.Registry
	rec    *tracetest.SpanRecorder
	logs   *syncBuffer
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	if o.worker == nil {
		o.worker = enginetest.NewWorker(256, 16, 2048)
	}
	if o.notReady {
		o.worker.SetInfoError(errors.New("loading weights"))
	}
	if o.sampler == nil {
		o.sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
	}
	ev := &env{worker: o.worker, blend: o.blend, reg: prometheus.NewRegistry(), rec: tracetest.NewSpanRecorder(), logs: &syncBuffer{}}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(ev.rec), sdktrace.WithSampler(o.sampler))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	deps := Deps{
		Deps:   component.Deps{TracerProvider: tp, Registerer: ev.reg, Logger: slogJSON(ev.logs)},
		Worker: enginetest.WorkerClient(t, o.worker),
	}
	switch {
	case o.deadBlend:
		deps.Blend = enginetest.DeadBlendClient(t)
	case o.blend != nil:
		deps.Blend = enginetest.BlendClient(t, o.blend)
	}
	cfg := o.cfg
	cfg.Addr = "127.0.0.1:0"
	e, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	ev.e, ev.base = e, "http://"+e.Addr()
	if !o.notReady {
		waitFor(t, "worker ready", func() bool { _, ok := e.sched.WorkerInfo(); return ok })
	}
	return ev
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (ev *env) client(opts ...option.RequestOption) *openai.Client {
	c := openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(ev.base + "/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
	}, opts...)...)
	return &c
}

// expectedText is the text the worker double generates for a prompt.
func expectedText(prompt []int32, n int) string {
	ts := newTextStream(tokenizer.Tokenizer{}, nil)
	for _, t := range enginetest.Reference(prompt, n) {
		ts.push(t)
	}
	ts.finish()
	return ts.all()
}

func chatPrompt(content string) []int32 {
	text := api.ChatPrompt([]api.Message{{Role: "user", Content: content}})
	return append([]int32{256}, (tokenizer.Tokenizer{}).Encode(text)...)
}

const callerTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestOpenAIClientChat(t *testing.T) {
	ev := newEnv(t, envOpts{})
	c := ev.client()
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:     "cb-llama",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about KV caches.")},
		MaxTokens: openai.Int(40),
	}
	resp, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	want := expectedText(chatPrompt("Tell me about KV caches."), 40)
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content != want || resp.Choices[0].FinishReason != "length" {
		t.Fatalf("response %+v", resp.Choices)
	}
	if resp.Object != "chat.completion" || resp.Model != "cb-llama" || !strings.HasPrefix(resp.ID, "chatcmpl-") {
		t.Fatalf("envelope %s %s %s", resp.Object, resp.Model, resp.ID)
	}
	if u := resp.Usage; u.PromptTokens != int64(len(chatPrompt("Tell me about KV caches."))) || u.CompletionTokens != 40 ||
		u.TotalTokens != u.PromptTokens+40 {
		t.Fatalf("usage %+v", u)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	var sb strings.Builder
	chunks := 0
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		chunks++
		if len(ch.Choices) > 0 {
			sb.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if sb.String() != want || chunks < 3 {
		t.Fatalf("streamed %q in %d chunks, want %q", sb.String(), chunks, want)
	}
	if acc.Usage.CompletionTokens != 40 || acc.Choices[0].FinishReason != "length" {
		t.Fatalf("accumulated usage %+v finish %q", acc.Usage, acc.Choices[0].FinishReason)
	}
}

func TestOpenAIClientCompletionsAndModels(t *testing.T) {
	ev := newEnv(t, envOpts{})
	c := ev.client()
	ctx := context.Background()
	resp, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model:  "cb-llama",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := append([]int32{256}, (tokenizer.Tokenizer{}).Encode("Once upon a time")...)
	if resp.Choices[0].Text != expectedText(p, 16) || resp.Usage.CompletionTokens != 16 || resp.Object != "text_completion" {
		t.Fatalf("completion %+v", resp)
	}
	// Token prompt, streamed, with echo.
	toks := []int64{256, 10, 20, 30}
	stream := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     "cb-llama",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: toks},
		MaxTokens: openai.Int(5),
	})
	var sb strings.Builder
	var finish string
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) > 0 {
			sb.WriteString(ch.Choices[0].Text)
			if ch.Choices[0].FinishReason != "" {
				finish = string(ch.Choices[0].FinishReason)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if sb.String() != expectedText([]int32{256, 10, 20, 30}, 5) || finish != "length" {
		t.Fatalf("streamed %q finish %q", sb.String(), finish)
	}
	models, err := c.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != "cb-llama" {
		t.Fatalf("models %+v", models.Data)
	}
	m, err := c.Models.Get(ctx, "cb-llama")
	if err != nil || m.ID != "cb-llama" {
		t.Fatalf("model %v %v", m, err)
	}
	_, err = c.Models.Get(ctx, "gpt-5")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("unknown model: %v", err)
	}
}

func TestStopSequence(t *testing.T) {
	ev := newEnv(t, envOpts{})
	p := chatPrompt("hi")
	full := expectedText(p, 60)
	// Pick a stop sequence from the middle of the expected text.
	r := []rune(full)
	stop := string(r[10:12])
	wantText := full[:strings.Index(full, stop)]
	resp, err := ev.client().Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "cb-llama", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		MaxTokens: openai.Int(60), Stop: openai.ChatCompletionNewParamsStopUnion{OfString: openai.String(stop)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != wantText || resp.Choices[0].FinishReason != "stop" || resp.Usage.CompletionTokens >= 60 {
		t.Fatalf("content %q finish %q tokens %d, want %q", resp.Choices[0].Message.Content, resp.Choices[0].FinishReason,
			resp.Usage.CompletionTokens, wantText)
	}
}

// scrape fetches /metrics and parses the text exposition.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(pmodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// series finds the metric of fam whose labels include want.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	fam := fams[name]
	if fam == nil {
		return nil
	}
next:
	for _, m := range fam.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

func histCount(fams map[string]*dto.MetricFamily, name string, labels map[string]string) uint64 {
	if m := series(fams, name, labels); m != nil {
		return m.GetHistogram().GetSampleCount()
	}
	return 0
}

func TestServeLoopRecordsMetrics(t *testing.T) {
	ev := newEnv(t, envOpts{})
	c := ev.client()
	ctx := context.Background()
	chat := openai.ChatCompletionNewParams{Model: "cb-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}, MaxTokens: openai.Int(5)}
	if _, err := c.Chat.Completions.New(ctx, chat); err != nil {
		t.Fatal(err)
	}
	s := c.Chat.Completions.NewStreaming(ctx, chat)
	for s.Next() {
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	one := openai.ChatCompletionNewParams{Model: "cb-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("y")}, MaxTokens: openai.Int(1)}
	if _, err := c.Chat.Completions.New(ctx, one); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "cb-llama",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("z")}, MaxTokens: openai.Int(3)}); err != nil {
		t.Fatal(err)
	}
	chat.Model = "nope"
	_, err := c.Chat.Completions.New(ctx, chat)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("unknown model: %v", err)
	}

	fams := scrape(t, ev.base)
	chatOK := map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": "cb-llama"}
	if n := histCount(fams, "gen_ai_server_time_to_first_token_seconds", chatOK); n != 3 {
		t.Errorf("chat TTFT count %d, want 3", n)
	}
	if n := histCount(fams, "gen_ai_server_time_per_output_token_seconds", chatOK); n != 2 {
		t.Errorf("chat TPOT count %d, want 2 (the 1-token request has none)", n)
	}
	if n := histCount(fams, "gen_ai_server_request_duration_seconds",
		map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": "cb-llama", "error_type": ""}); n != 3 {
		t.Errorf("chat duration count %d, want 3", n)
	}
	if n := histCount(fams, "gen_ai_server_request_duration_seconds",
		map[string]string{"gen_ai_operation_name": "text_completion", "error_type": ""}); n != 1 {
		t.Errorf("completion duration count %d, want 1", n)
	}
	if n := histCount(fams, "gen_ai_server_request_duration_seconds",
		map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": "nope", "error_type": "not_found"}); n != 1 {
		t.Errorf("failed request duration count %d, want 1 with error_type not_found", n)
	}
	if n := histCount(fams, "gen_ai_server_time_to_first_token_seconds",
		map[string]string{"gen_ai_request_model": "nope"}); n != 0 {
		t.Errorf("a failed request has a TTFT")
	}
	if n := histCount(fams, "http_server_request_duration_seconds",
		map[string]string{"http_request_method": "POST", "http_route": api.RouteChat, "http_response_status_code": "200"}); n != 3 {
		t.Errorf("http chat 200 count %d, want 3", n)
	}
	if n := histCount(fams, "http_server_request_duration_seconds",
		map[string]string{"http_route": api.RouteChat, "http_response_status_code": "404"}); n != 1 {
		t.Errorf("http chat 404 count %d, want 1", n)
	}
	if n := histCount(fams, "http_server_request_duration_seconds",
		map[string]string{"http_route": api.RouteCompletions, "http_response_status_code": "200"}); n != 1 {
		t.Errorf("http completions count %d", n)
	}
	if m := series(fams, "cb_engine_generation_tokens_total", map[string]string{"gen_ai_request_model": "cb-llama"}); m == nil ||
		m.GetCounter().GetValue() != 5+5+1+3 {
		t.Errorf("generation tokens %v", m)
	}
	gauge := func(name string, labels map[string]string) float64 {
		m := series(fams, name, labels)
		if m == nil {
			t.Fatalf("no series %s %v", name, labels)
		}
		return m.GetGauge().GetValue()
	}
	free := gauge("cb_engine_kv_blocks", map[string]string{"state": "free"})
	used := gauge("cb_engine_kv_blocks", map[string]string{"state": "used"})
	cached := gauge("cb_engine_kv_blocks", map[string]string{"state": "cached"})
	pool := gauge("cb_engine_kv_pool_blocks", nil)
	if pool != 256 || free+used+cached != pool || cached == 0 {
		t.Errorf("kv blocks free %v used %v cached %v pool %v", free, used, cached, pool)
	}
	if w := gauge("cb_engine_requests_waiting", nil); w != 0 {
		t.Errorf("waiting %v", w)
	}
	// The /metrics scrape itself was recorded.
	fams = scrape(t, ev.base)
	if n := histCount(fams, "http_server_request_duration_seconds",
		map[string]string{"http_request_method": "GET", "http_route": api.RouteMetrics, "http_response_status_code": "200"}); n < 1 {
		t.Errorf("metrics route not recorded")
	}
}

func spansByName(rec *tracetest.SpanRecorder) map[string][]sdktrace.ReadOnlySpan {
	out := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		out[s.Name()] = append(out[s.Name()], s)
	}
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[string]any {
	m := map[string]any{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

func TestSpanTreeContinuesCallerTrace(t *testing.T) {
	blend := &enginetest.Blend{Result: func(tokens []int32) *cbv1.LookupResult {
		return &cbv1.LookupResult{RequestedTokens: int32(len(tokens)), PrefixHitTokens: 16, NonPrefixHitTokens: 0, HitRate: 16 / float64(len(tokens)),
			Matches: []*cbv1.Match{{StoredSt: 0, StoredEd: 16, CurSt: 0, CurEd: 16, Prefix: true}}, ChunkSize: 256}
	}}
	ev := newEnv(t, envOpts{blend: blend})
	c := ev.client(option.WithHeader("traceparent", callerTP))
	resp, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "cb-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("trace me")}, MaxTokens: openai.Int(70)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "spans", func() bool { return len(spansByName(ev.rec)["chat cb-llama"]) == 1 })
	by := spansByName(ev.rec)
	server := by["chat cb-llama"][0]
	caller, _ := telemetry.ParseTraceparent(callerTP)
	if server.SpanKind() != trace.SpanKindServer || server.Parent().SpanID() != caller.SpanID() ||
		server.SpanContext().TraceID() != caller.TraceID() {
		t.Fatalf("SERVER span kind %v parent %v trace %v", server.SpanKind(), server.Parent().SpanID(), server.SpanContext().TraceID())
	}
	sa := attrs(server)
	if sa["gen_ai.operation.name"] != "chat" || sa["gen_ai.request.model"] != "cb-llama" || sa["gen_ai.usage.output_tokens"] != int64(70) ||
		sa["request_id"] != resp.ID || server.Status().Code == codes.Error {
		t.Fatalf("SERVER attributes %v status %v", sa, server.Status())
	}
	sid := server.SpanContext().SpanID()
	for _, name := range []string{spanname.EngineQueue, spanname.EnginePrefill, spanname.EngineDecode, spanname.CBRequest} {
		if len(by[name]) != 1 || by[name][0].Parent().SpanID() != sid || by[name][0].SpanContext().TraceID() != caller.TraceID() {
			t.Fatalf("%s is not a child of the SERVER span: %v", name, by[name])
		}
	}
	q, p, d := by[spanname.EngineQueue][0], by[spanname.EnginePrefill][0], by[spanname.EngineDecode][0]
	if q.StartTime().Before(server.StartTime()) || p.StartTime().Before(q.EndTime()) || d.StartTime().Before(p.EndTime()) ||
		server.EndTime().Before(d.EndTime()) {
		t.Fatal("engine spans out of order")
	}
	if ev := d.Events(); len(ev) != 2 || ev[0].Name != "token" || ev[1].Attributes[0] != attribute.Int("n", 64) {
		t.Fatalf("decode events %v, want token events at 32 and 64", ev)
	}
	req := by[spanname.CBRequest][0]
	ra := attrs(req)
	for k, want := range map[string]any{"request_id": resp.ID, "model": "cb-llama", "world_size": int64(1),
		"n_prompt_tokens": int64(len(chatPrompt("trace me"))), "prefix_hit_tokens": int64(16), "non_prefix_hit_tokens": int64(0)} {
		if ra[k] != want {
			t.Errorf("cb.request %s = %v, want %v", k, ra[k], want)
		}
	}
	sched := by[spanname.CBSchedule][0]
	if sched.Parent().SpanID() != req.SpanContext().SpanID() || by[spanname.CBLookupRPC][0].Parent().SpanID() != sched.SpanContext().SpanID() ||
		by[spanname.CBBuildMeta][0].Parent().SpanID() != sched.SpanContext().SpanID() {
		t.Fatal("cb.request ⊃ cb.schedule ⊃ {cb.lookup.rpc, cb.build_meta} violated")
	}
	if attrs(by[spanname.CBLookupRPC][0])["n_polls"] != int64(0) { // no other request ran steps meanwhile
		t.Errorf("n_polls %v", attrs(by[spanname.CBLookupRPC][0])["n_polls"])
	}
	// The worker got cb.request's context; the blend server cb.lookup.rpc's.
	first := ev.worker.SeqSteps(resp.ID)[0]
	if first.GetTraceContext() != telemetry.FormatTraceparent(req.SpanContext()) {
		t.Fatalf("step trace_context %q", first.GetTraceContext())
	}
	if got := blend.Lookups()[0].GetTraceContext(); got != telemetry.FormatTraceparent(by[spanname.CBLookupRPC][0].SpanContext()) {
		t.Fatalf("lookup trace_context %q", got)
	}
	// One JSON log line inside the SERVER span.
	lines := ev.logs.lines(t, "request")
	if len(lines) != 1 {
		t.Fatalf("%d request log lines", len(lines))
	}
	l := lines[0]
	if l["trace_id"] != caller.TraceID().String() || l["span_id"] != sid.String() || l["request_id"] != resp.ID ||
		l["status"] != float64(200) || l["completion_tokens"] != float64(70) || l["ttft_s"] == nil || l["duration_s"] == nil {
		t.Fatalf("log line %v", l)
	}
}

func TestInvalidTraceparentStartsNewTrace(t *testing.T) {
	ev := newEnv(t, envOpts{})
	bad := strings.ToUpper(callerTP) // uppercase hex is invalid
	c := ev.client(option.WithHeader("traceparent", bad))
	if _, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "cb-llama",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("q")}, MaxTokens: openai.Int(2)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "span", func() bool { return len(spansByName(ev.rec)["text_completion cb-llama"]) == 1 })
	s := spansByName(ev.rec)["text_completion cb-llama"][0]
	if s.Parent().IsValid() || s.SpanContext().TraceID().String() == "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("invalid traceparent was trusted: parent %v", s.Parent())
	}
}

func TestSampledOutRecordsNothingAndPropagatesFlags(t *testing.T) {
	blend := &enginetest.Blend{}
	ev := newEnv(t, envOpts{blend: blend, sampler: sdktrace.ParentBased(sdktrace.NeverSample())})
	resp, err := ev.client().Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "cb-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("quiet")}, MaxTokens: openai.Int(3)})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(ev.rec.Ended()); n != 0 {
		t.Fatalf("%d spans recorded for a sampled-out request", n)
	}
	tc := ev.worker.SeqSteps(resp.ID)[0].GetTraceContext()
	lc := blend.Lookups()[0].GetTraceContext()
	if !strings.HasSuffix(tc, "-00") || !strings.HasSuffix(lc, "-00") {
		t.Fatalf("sampled-out flags not propagated: step %q lookup %q", tc, lc)
	}
	if l := ev.logs.lines(t, "request"); len(l) != 1 || l[0]["trace_id"] == nil {
		t.Fatalf("log line %v", l)
	}
}

func TestLookupFallbackServesRequest(t *testing.T) {
	ev := newEnv(t, envOpts{deadBlend: true})
	if _, err := ev.client().Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "cb-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}, MaxTokens: openai.Int(2)}); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, ev.base)
	if m := series(fams, "cb_engine_lookup_fallbacks_total", map[string]string{"reason": "unavailable"}); m == nil || m.GetCounter().GetValue() != 1 {
		t.Fatalf("fallback counter %v", m)
	}
	var rpc sdktrace.ReadOnlySpan
	waitFor(t, "lookup span", func() bool { return len(spansByName(ev.rec)[spanname.CBLookupRPC]) == 1 })
	rpc = spansByName(ev.rec)[spanname.CBLookupRPC][0]
	if rpc.Status().Code != codes.Error {
		t.Fatalf("cb.lookup.rpc status %v", rpc.Status())
	}
}

func TestFailureSpanStatus(t *testing.T) {
	w := enginetest.NewWorker(64, 16, 2048)
	gate := w.Gate()
	ev := newEnv(t, envOpts{worker: w, cfg: Config{Config: scheduler.Config{MaxQueue: 1, MaxRunning: 1}}})
	post := func(body string) *http.Response {
		resp, err := http.Post(ev.base+api.RouteCompletions, "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp
	}
	body := `{"model":"cb-llama","prompt":"x","max_tokens":2}`
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); post(body) }() // admitted, stuck in the gated step
	waitFor(t, "running", func() bool { return ev.e.SchedulerStats().Running == 1 })
	wg.Add(1)
	go func() { defer wg.Done(); post(body) }() // waiting
	waitFor(t, "waiting", func() bool { return ev.e.SchedulerStats().Waiting == 1 })
	if r := post(body); r == nil || r.StatusCode != 429 {
		t.Fatalf("third request: %v", r)
	}
	w.FailNextExecute(errors.New("worker crashed"))
	close(gate)
	wg.Wait()
	by := spansByName(ev.rec)
	var got429, got503 bool
	for _, s := range by["text_completion cb-llama"] {
		a := attrs(s)
		switch a["http.response.status_code"] {
		case int64(429):
			got429 = true
			if s.Status().Code == codes.Error || a["error.type"] != "queue_full" {
				t.Errorf("429 span: status %v attrs %v", s.Status(), a)
			}
		case int64(503):
			got503 = true
			if s.Status().Code != codes.Error || a["error.type"] != "worker_unavailable" {
				t.Errorf("503 span: status %v attrs %v", s.Status(), a)
			}
		}
	}
	if !got429 || !got503 {
		t.Fatalf("spans: 429 %v 503 %v", got429, got503)
	}
	fams := scrape(t, ev.base)
	for et, want := range map[string]uint64{"queue_full": 1, "worker_unavailable": 2} {
		if n := histCount(fams, "gen_ai_server_request_duration_seconds", map[string]string{"error_type": et}); n != want {
			t.Errorf("duration count error_type=%s: %d, want %d", et, n, want)
		}
	}
	for _, l := range ev.logs.lines(t, "request") {
		if l["trace_id"] == nil || l["span_id"] == nil || l["request_id"] == nil {
			t.Errorf("log line without ids: %v", l)
		}
	}
}

func TestBadInputs(t *testing.T) {
	ev := newEnv(t, envOpts{cfg: Config{Settings: httpfront.Settings{MaxBodyBytes: 4096}}, worker: enginetest.NewWorker(64, 16, 512)})
	long := strings.Repeat("a", 600)
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		errType                  string
	}{
		{"malformed json", "POST", api.RouteChat, `{"model":`, 400, "invalid_request_error"},
		{"not an object", "POST", api.RouteChat, `[]`, 400, "invalid_request_error"},
		{"missing messages", "POST", api.RouteChat, `{"model":"cb-llama"}`, 400, "invalid_request_error"},
		{"bad temperature", "POST", api.RouteChat, `{"model":"cb-llama","messages":[{"role":"user","content":"x"}],"temperature":9}`, 400, "invalid_request_error"},
		{"bad max_tokens type", "POST", api.RouteCompletions, `{"model":"cb-llama","prompt":"x","max_tokens":"many"}`, 400, "invalid_request_error"},
		{"prompt too long", "POST", api.RouteCompletions, `{"model":"cb-llama","prompt":"` + long + `"}`, 400, "invalid_request_error"},
		{"max_tokens beyond context", "POST", api.RouteCompletions, `{"model":"cb-llama","prompt":"x","max_tokens":600}`, 400, "invalid_request_error"},
		{"token out of vocab", "POST", api.RouteCompletions, `{"model":"cb-llama","prompt":[1,300]}`, 400, "invalid_request_error"},
		{"unknown model", "POST", api.RouteChat, `{"model":"gpt-4","messages":[]}`, 404, "invalid_request_error"},
		{"unknown model first", "POST", api.RouteCompletions, `{"model":"gpt-4","prompt":null,"temperature":-5}`, 404, "invalid_request_error"},
		{"unknown route", "GET", "/v1/nothing", ``, 404, "invalid_request_error"},
		{"wrong method", "GET", api.RouteChat, ``, 405, "invalid_request_error"},
		{"body too large", "POST", api.RouteChat, `{"model":"cb-llama","x":"` + strings.Repeat("b", 5000) + `"}`, 413, "invalid_request_error"},
		{"documents empty", "POST", api.RouteDocuments, `{"documents":[]}`, 400, "invalid_request_error"},
		{"documents unknown model", "POST", api.RouteDocuments, `{"model":"m2","documents":["a"]}`, 404, "invalid_request_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkErrorBody(t, send(t, tc.method, ev.base+tc.path, tc.body, jsonHeader), tc.status, tc.errType)
		})
	}
}

// send sends body to url with method and the headers hdr (a header with an
// empty value is left out) and returns the response; its body is closed
// when the test ends.
func send(t *testing.T, method, url, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// jsonHeader is the Content-Type of a JSON request.
var jsonHeader = map[string]string{"Content-Type": "application/json"}

func checkErrorBody(t *testing.T, resp *http.Response, status int, typ string) {
	t.Helper()
	if resp.StatusCode != status {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("content type %q", ct)
	}
	var body struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error == nil {
		t.Fatalf("not an OpenAI error body: %v", err)
	}
	if body.Error.Message == "" || body.Error.Type != typ {
		t.Fatalf("error %+v", body.Error)
	}
}

func TestAPIKey(t *testing.T) {
	ev := newEnv(t, envOpts{cfg: Config{Settings: httpfront.Settings{APIKey: "s3cret"}}})
	for _, tc := range []struct {
		name, auth string
		status     int
	}{
		{"missing", "", 401},
		{"wrong", "Bearer nope", 401},
		{"not bearer", "Basic s3cret", 401},
		{"right", "Bearer s3cret", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := send(t, http.MethodPost, ev.base+api.RouteCompletions, `{"model":"cb-llama","prompt":"x","max_tokens":1}`,
				map[string]string{"Content-Type": "application/json", "Authorization": tc.auth})
			if tc.status != 200 {
				checkErrorBody(t, resp, tc.status, "invalid_request_error")
			} else if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
		})
	}
	// The official client with the right key; /health and /metrics stay open.
	if _, err := ev.client(option.WithAPIKey("s3cret")).Models.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err := ev.client(option.WithAPIKey("bad")).Models.List(context.Background())
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Fatalf("client with a bad key: %v", err)
	}
	for _, p := range []string{api.RouteHealth, api.RouteMetrics} {
		resp, err := http.Get(ev.base + p)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
	}
	fams := scrape(t, ev.base)
	if n := histCount(fams, "gen_ai_server_request_duration_seconds", map[string]string{"error_type": "unauthorized"}); n != 3 {
		t.Errorf("unauthorized count %d", n)
	}
}

func TestWorkerUnavailable(t *testing.T) {
	ev := newEnv(t, envOpts{notReady: true})
	resp, err := http.Post(ev.base+api.RouteChat, "application/json",
		strings.NewReader(`{"model":"cb-llama","messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	checkErrorBody(t, resp, 503, "server_error")
	_ = resp.Body.Close()
	h, err := http.Get(ev.base + api.RouteHealth)
	if err != nil {
		t.Fatal(err)
	}
	_ = h.Body.Close()
	if h.StatusCode != 503 {
		t.Fatalf("/health %d while the worker is down", h.StatusCode)
	}
	ev.worker.SetInfoError(nil)
	waitFor(t, "healthy", func() bool {
		h, err := http.Get(ev.base + api.RouteHealth)
		if err != nil {
			return false
		}
		_ = h.Body.Close()
		return h.StatusCode == 200
	})
	by := spansByName(ev.rec)["chat cb-llama"]
	if len(by) != 1 || by[0].Status().Code != codes.Error {
		t.Fatalf("503 SERVER span %v", by)
	}
}

// TestModelMismatchRefused: a worker serving another model file than the
// engine's (here: the built-in model) is not paired with: requests get 503
// and /health stays 503 while the worker answers Info.
func TestModelMismatchRefused(t *testing.T) {
	w := enginetest.NewWorker(64, 16, 2048)
	w.ModelIdentity = "gguf-123-abc"
	ev := newEnv(t, envOpts{worker: w, notReady: true})
	w.SetInfoError(nil) // answers, with another file
	n := w.InfoCalls()
	waitFor(t, "probe", func() bool { return w.InfoCalls() > n })
	resp, err := http.Post(ev.base+api.RouteChat, "application/json",
		strings.NewReader(`{"model":"cb-llama","messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	checkErrorBody(t, resp, 503, "server_error")
	_ = resp.Body.Close()
	h, err := http.Get(ev.base + api.RouteHealth)
	if err != nil {
		t.Fatal(err)
	}
	_ = h.Body.Close()
	if h.StatusCode != 503 {
		t.Fatalf("/health %d with a worker of another model file", h.StatusCode)
	}
}

func TestDocumentsIngest(t *testing.T) {
	w := enginetest.NewWorker(64, 16, 2048)
	w.StoreDelaySteps = 2
	ev := newEnv(t, envOpts{worker: w, blend: &enginetest.Blend{}})
	body := `{"documents":["The quick brown fox jumps over the lazy dog.",{"id":"d2","text":"Second document, a bit longer than the first one."}]}`
	resp := send(t, http.MethodPost, ev.base+api.RouteDocuments, body, map[string]string{"traceparent": callerTP, "Content-Type": "application/json"})
	var out api.DocumentList
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d err %v", resp.StatusCode, err)
	}
	if len(out.Data) != 2 || out.Data[1].ID != "d2" || out.Data[0].Status != "stored" || out.Data[0].Tokens != 44 {
		t.Fatalf("response %+v", out)
	}
	if len(w.Stored()) != 2 {
		t.Fatalf("stored %v", w.Stored())
	}
	spans := spansByName(ev.rec)[spanname.CBStorePreComputed]
	if len(spans) != 2 {
		t.Fatalf("%d cb.store_pre_computed spans", len(spans))
	}
	for _, s := range spans {
		id := attrs(s)["request_id"].(string)
		steps := w.SeqSteps(id)
		if len(steps) == 0 || !steps[len(steps)-1].GetDocument() || steps[0].GetTraceContext() != telemetry.FormatTraceparent(s.SpanContext()) {
			t.Fatalf("document %s steps %v", id, steps)
		}
		if s.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("document span not in the caller's trace")
		}
	}
	if st := ev.e.SchedulerStats(); st.KVUsed != 0 {
		t.Fatalf("document blocks held after their store: %+v", st)
	}
	if l := ev.logs.lines(t, "documents"); len(l) != 1 || l[0]["status"] != float64(200) {
		t.Fatalf("documents log %v", l)
	}
}

// The ingest answer says whether each document is shared in the fleet
// (BlendService.FleetStatus), and says nothing without a fleet tier.
func TestDocumentsFleetState(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fleet func(id string) string
		want  []string
	}{
		{"no fleet tier", nil, []string{"", ""}},
		{"shared", func(string) string { return "shared" }, []string{"shared", "shared"}},
		{"second pending", func() func(string) string {
			n := 0 // asked in the documents' order
			return func(string) string {
				n++
				return map[int]string{1: "shared", 2: "pending"}[n]
			}
		}(), []string{"shared", "pending"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := enginetest.NewWorker(64, 16, 2048)
			ev := newEnv(t, envOpts{worker: w, blend: &enginetest.Blend{Fleet: tc.fleet}})
			resp := send(t, http.MethodPost, ev.base+api.RouteDocuments, `{"documents":["first document text","second document text"]}`,
				map[string]string{"Content-Type": "application/json"})
			var out struct {
				Data []struct {
					Status string `json:"status"`
					Fleet  string `json:"fleet"`
				} `json:"data"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out.Data) != 2 {
				t.Fatalf("status %d err %v %+v", resp.StatusCode, err, out)
			}
			for i, d := range out.Data {
				if d.Status != "stored" || d.Fleet != tc.want[i] {
					t.Fatalf("document %d: %+v, want stored and fleet %q", i, d, tc.want[i])
				}
			}
		})
	}
}

func TestShutdownFinishesInFlightStream(t *testing.T) {
	w := enginetest.NewWorker(64, 16, 2048)
	ev := newEnv(t, envOpts{worker: w})
	gate := w.Gate()
	stream := ev.client().Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "cb-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}, MaxTokens: openai.Int(4)})
	waitFor(t, "running", func() bool { return ev.e.SchedulerStats().Running == 1 })
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- ev.e.Shutdown(ctx)
	}()
	go func() {
		for range 4 {
			gate <- struct{}{}
		}
	}()
	n := 0
	for stream.Next() {
		n++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream cut by shutdown: %v", err)
	}
	_ = stream.Close()
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n < 3 {
		t.Fatalf("%d chunks, want the role chunk, content and the finish", n)
	}
	if resp, err := http.Get(ev.base + api.RouteHealth); err == nil {
		_ = resp.Body.Close()
		t.Fatal("still accepting connections after Shutdown")
	}
}

func TestPrefixCacheHitRatio(t *testing.T) {
	ev := newEnv(t, envOpts{})
	c := ev.client()
	long := strings.Repeat("shared context ", 20)
	for range 2 {
		if _, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "cb-llama",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(long)}, MaxTokens: openai.Int(2)}); err != nil {
			t.Fatal(err)
		}
	}
	fams := scrape(t, ev.base)
	m := series(fams, "cb_engine_prefix_cache_hit_ratio", nil)
	if m == nil || m.GetGauge().GetValue() <= 0.4 {
		t.Fatalf("prefix hit ratio %v", m)
	}
}

func slogJSON(w io.Writer) *slog.Logger { return slog.New(telemetry.NewLogHandler(w, nil)) }

func TestContentCaptureIsOptIn(t *testing.T) {
	tests := []struct {
		name    string
		capture bool
	}{
		{"off by default", false},
		{"opted in", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := newEnv(t, envOpts{cfg: Config{CaptureContent: tc.capture}})
			resp, err := ev.client().Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "cb-llama",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("a secret prompt")}, MaxTokens: openai.Int(5)})
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "spans", func() bool { return len(spansByName(ev.rec)["chat cb-llama"]) == 1 })
			var found, completion bool
			for _, s := range ev.rec.Ended() {
				for _, a := range s.Attributes() {
					if strings.Contains(a.Value.Emit(), "a secret prompt") {
						t.Errorf("span %s attribute %s carries the prompt", s.Name(), a.Key)
					}
				}
				for _, e := range s.Events() {
					for _, a := range e.Attributes {
						if strings.Contains(a.Value.Emit(), "a secret prompt") {
							found = true
						}
						if a.Key == "gen_ai.completion" && a.Value.AsString() == resp.Choices[0].Message.Content {
							completion = true
						}
					}
				}
			}
			if found != tc.capture || completion != tc.capture {
				t.Fatalf("prompt in events %v, completion in events %v; capture %v", found, completion, tc.capture)
			}
			if strings.Contains(ev.logs.String(), "a secret prompt") {
				t.Error("the log carries the prompt")
			}
		})
	}
}
