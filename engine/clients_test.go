package engine

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/internal/enginetest"
	"github.com/cacheblend/cacheblend/engine/scheduler"
)

func TestUsageSplit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prompt int
		res    scheduler.Result
		want   api.UsageCacheBlend
		cached int
	}{
		{"nothing reused", 100, scheduler.Result{Tokens: make([]int32, 3)}, api.UsageCacheBlend{RecomputedTokens: 100}, 0},
		{"engine prefix cache", 100, scheduler.Result{CachedTokens: 64}, api.UsageCacheBlend{PrefixHitTokens: 64, RecomputedTokens: 36}, 64},
		{"blend prefix leg", 600, scheduler.Result{CachedTokens: 16, ReusedTokens: 496, PrefixReusedTokens: 240},
			api.UsageCacheBlend{PrefixHitTokens: 256, NonPrefixHitTokens: 256, RecomputedTokens: 88}, 512},
		{"non-prefix only", 300, scheduler.Result{ReusedTokens: 256}, api.UsageCacheBlend{NonPrefixHitTokens: 256, RecomputedTokens: 44}, 256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := usage(tc.prompt, tc.res)
			if *u.CacheBlend != tc.want || u.PromptTokensDetails.CachedTokens != tc.cached {
				t.Fatalf("usage %+v %+v, want %+v cached %d", *u.CacheBlend, *u.PromptTokensDetails, tc.want, tc.cached)
			}
			if b := u.CacheBlend; b.PrefixHitTokens+b.NonPrefixHitTokens+b.RecomputedTokens != tc.prompt {
				t.Fatalf("split %+v does not add up to %d", b, tc.prompt)
			}
			if u.CompletionTokens != len(tc.res.Tokens) || u.TotalTokens != tc.prompt+len(tc.res.Tokens) {
				t.Fatalf("counts %+v", u)
			}
		})
	}
}

// cacheBlendUsage decodes the "cacheblend" usage extension from a raw
// usage object.
func cacheBlendUsage(t *testing.T, raw string) api.UsageCacheBlend {
	t.Helper()
	var u struct {
		CacheBlend *api.UsageCacheBlend `json:"cacheblend"`
	}
	if err := json.Unmarshal([]byte(raw), &u); err != nil || u.CacheBlend == nil {
		t.Fatalf("usage %s: no cacheblend extension (%v)", raw, err)
	}
	return *u.CacheBlend
}

func TestCachedTokensThroughOpenAIClient(t *testing.T) {
	ev := newEnv(t, envOpts{})
	c := ev.client()
	ctx := context.Background()
	long := strings.Repeat("shared context ", 20)
	params := openai.ChatCompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(long)}}
	first, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if n := first.Usage.PromptTokensDetails.CachedTokens; n != 0 {
		t.Fatalf("first request: %d cached tokens", n)
	}
	second, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	u := second.Usage
	if u.PromptTokensDetails.CachedTokens <= 0 || u.PromptTokensDetails.CachedTokens >= u.PromptTokens {
		t.Fatalf("second request: cached %d of %d", u.PromptTokensDetails.CachedTokens, u.PromptTokens)
	}
	cb := cacheBlendUsage(t, u.RawJSON())
	if int64(cb.PrefixHitTokens) != u.PromptTokensDetails.CachedTokens || int64(cb.PrefixHitTokens+cb.RecomputedTokens) != u.PromptTokens {
		t.Fatalf("split %+v of %+v", cb, u)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	var raw string
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		if ch.JSON.Usage.Valid() {
			raw = ch.Usage.RawJSON()
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if acc.Usage.PromptTokensDetails.CachedTokens != u.PromptTokensDetails.CachedTokens {
		t.Fatalf("streamed cached tokens %d, want %d", acc.Usage.PromptTokensDetails.CachedTokens, u.PromptTokensDetails.CachedTokens)
	}
	if got := cacheBlendUsage(t, raw); got != cb {
		t.Fatalf("streamed split %+v, want %+v", got, cb)
	}
}

func TestSeedPerRequest(t *testing.T) {
	w := enginetest.NewWorker(256, 16, 2048)
	ev := newEnv(t, envOpts{worker: w})
	send := func(seed string) string {
		t.Helper()
		body := `{"model":"cb-llama","prompt":"x","max_tokens":1,"temperature":1` + seed + `}`
		resp, err := http.Post(ev.base+api.RouteCompletions, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		return resp.Header.Get("X-Request-Id")
	}
	workerSeed := func(id string) uint64 {
		t.Helper()
		steps := w.SeqSteps(id)
		if len(steps) == 0 {
			t.Fatalf("no steps for %s", id)
		}
		return steps[0].GetSampling().GetSeed()
	}
	logged := func(id string) map[string]any {
		t.Helper()
		for _, l := range ev.logs.lines(t, "request") {
			if l["request_id"] == id {
				return l
			}
		}
		t.Fatalf("no log line for %s", id)
		return nil
	}
	spanSeed := func(id string) (int64, bool) {
		t.Helper()
		for _, s := range ev.rec.Ended() {
			a := attrs(s)
			if a["request_id"] == id && a["gen_ai.request.seed"] != nil {
				return a["gen_ai.request.seed"].(int64), a["seed_generated"].(bool)
			}
		}
		t.Fatalf("no SERVER span with a seed for %s", id)
		return 0, false
	}
	for _, tc := range []struct {
		name      string
		body      string
		generated bool
		want      int64 // when !generated
	}{
		{"client seed used as given", `,"seed":42`, false, 42},
		{"client seed zero", `,"seed":0`, false, 0},
		{"no seed: a fresh one", ``, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := send(tc.body)
			seed, generated := spanSeed(id)
			l := logged(id)
			if generated != tc.generated || l["seed_generated"] != tc.generated || l["seed"] != float64(seed) {
				t.Fatalf("span seed %d generated %v, log %v", seed, generated, l)
			}
			if workerSeed(id) != uint64(seed) {
				t.Fatalf("worker got seed %d, recorded %d", workerSeed(id), seed)
			}
			if !tc.generated && seed != tc.want {
				t.Fatalf("seed %d, want %d", seed, tc.want)
			}
			if tc.generated && seed < 0 {
				t.Fatalf("generated seed %d is negative: it could not be sent back", seed)
			}
		})
	}
	// Unseeded requests draw different seeds.
	seen := map[uint64]bool{}
	for range 5 {
		seen[workerSeed(send(""))] = true
	}
	if len(seen) < 5 {
		t.Fatalf("5 unseeded requests drew %d distinct seeds", len(seen))
	}
}

func TestOpenAIErrorCodes(t *testing.T) {
	ev := newEnv(t, envOpts{worker: enginetest.NewWorker(64, 16, 512)})
	long := strings.Repeat("a", 600)
	msg := `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct {
		name, path, body string
		param, code      string
	}{
		{"max_tokens beyond context", api.RouteChat, `{"model":"cb-llama",` + msg + `,"max_tokens":600}`, "max_tokens", api.CodeContextLengthExceeded},
		{"max_completion_tokens beyond context", api.RouteChat, `{"model":"cb-llama",` + msg + `,"max_completion_tokens":600}`, "max_completion_tokens", api.CodeContextLengthExceeded},
		{"both: the newer name", api.RouteChat, `{"model":"cb-llama",` + msg + `,"max_tokens":5,"max_completion_tokens":600}`, "max_completion_tokens", api.CodeContextLengthExceeded},
		{"completion max_tokens beyond context", api.RouteCompletions, `{"model":"cb-llama","prompt":"x","max_tokens":600}`, "max_tokens", api.CodeContextLengthExceeded},
		{"prompt too long", api.RouteCompletions, `{"model":"cb-llama","prompt":"` + long + `"}`, "prompt", api.CodeContextLengthExceeded},
		{"messages too long", api.RouteChat, `{"model":"cb-llama","messages":[{"role":"user","content":"` + long + `"}]}`, "messages", api.CodeContextLengthExceeded},
		{"temperature above", api.RouteChat, `{"model":"cb-llama",` + msg + `,"temperature":3}`, "temperature", api.CodeDecimalAboveMax},
		{"temperature below", api.RouteChat, `{"model":"cb-llama",` + msg + `,"temperature":-1}`, "temperature", api.CodeDecimalBelowMin},
		{"top_p zero", api.RouteChat, `{"model":"cb-llama",` + msg + `,"top_p":0}`, "top_p", api.CodeDecimalBelowMin},
		{"max_completion_tokens zero", api.RouteChat, `{"model":"cb-llama",` + msg + `,"max_completion_tokens":0}`, "max_completion_tokens", api.CodeIntegerBelowMin},
		{"too many stops", api.RouteChat, `{"model":"cb-llama",` + msg + `,"stop":["a","b","c","d","e"]}`, "stop", api.CodeArrayAboveMaxLength},
		{"empty messages", api.RouteChat, `{"model":"cb-llama","messages":[]}`, "messages", api.CodeEmptyArray},
		{"n above 1", api.RouteChat, `{"model":"cb-llama",` + msg + `,"n":2}`, "n", api.CodeUnsupportedValue},
		{"tool without a function", api.RouteChat, `{"model":"cb-llama",` + msg + `,"tools":[{"type":"function"}]}`, "tools[0].function.name", api.CodeMissingRequiredParameter},
		{"token outside the vocabulary", api.RouteCompletions, `{"model":"cb-llama","prompt":[1,300]}`, "prompt", api.CodeInvalidValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(ev.base+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body api.ErrorBody
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			e := body.Error
			if resp.StatusCode != 400 || e.Param == nil || *e.Param != tc.param || e.Code == nil || *e.Code != tc.code {
				t.Fatalf("status %d error %+v (param %v code %v), want param %s code %s", resp.StatusCode, e, deref(e.Param), deref(e.Code), tc.param, tc.code)
			}
		})
	}
	// A completion that sent no max_tokens gets the API's default (16),
	// lowered to fit the context instead of refused.
	resp, err := http.Post(ev.base+api.RouteCompletions, "application/json",
		strings.NewReader(`{"model":"cb-llama","prompt":"`+strings.Repeat("a", 505)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("defaulted max_tokens near the context end: status %d", resp.StatusCode)
	}
}

func deref(p *string) string {
	if p == nil {
		return "<null>"
	}
	return *p
}

func TestOpenAIClientSeesContextLengthCode(t *testing.T) {
	ev := newEnv(t, envOpts{worker: enginetest.NewWorker(64, 16, 512)})
	_, err := ev.client().Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "cb-llama", MaxCompletionTokens: openai.Int(600),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != api.CodeContextLengthExceeded || apiErr.Param != "max_completion_tokens" {
		t.Fatalf("error %v", err)
	}
}

func TestUnsupportedMediaType(t *testing.T) {
	ev := newEnv(t, envOpts{})
	chat := `{"model":"cb-llama","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`
	for _, tc := range []struct {
		name, path, contentType string
		status                  int
	}{
		{"json", api.RouteChat, "application/json", 200},
		{"json utf-8", api.RouteChat, "application/json; charset=utf-8", 200},
		{"json UTF-8 completions", api.RouteCompletions, "application/json; charset=UTF-8", 400}, // served (a chat body on the completions route)
		{"text/plain", api.RouteChat, "text/plain", 415},
		{"text/plain completions", api.RouteCompletions, "text/plain;charset=UTF-8", 415},
		{"form", api.RouteChat, "application/x-www-form-urlencoded", 415},
		{"multipart", api.RouteChat, "multipart/form-data; boundary=x", 415},
		{"none", api.RouteChat, "", 415},
		{"json latin-1", api.RouteChat, "application/json; charset=iso-8859-1", 415},
		{"malformed", api.RouteChat, "application/json; =", 415},
		{"documents text/plain", api.RouteDocuments, "text/plain", 415},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := send(t, http.MethodPost, ev.base+tc.path, chat, map[string]string{"Content-Type": tc.contentType})
			if resp.StatusCode != tc.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.status == 415 {
				checkErrorBody(t, resp, 415, "invalid_request_error")
			}
		})
	}
}

func TestQueueFullCarriesRetryAfter(t *testing.T) {
	w := enginetest.NewWorker(64, 16, 2048)
	gate := w.Gate()
	ev := newEnv(t, envOpts{worker: w, cfg: Config{Config: scheduler.Config{MaxQueue: 1, MaxRunning: 1}}})
	body := `{"model":"cb-llama","prompt":"x","max_tokens":1}`
	post := func() *http.Response {
		resp, err := http.Post(ev.base+api.RouteCompletions, "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); post() }()
	waitFor(t, "running", func() bool { return ev.e.SchedulerStats().Running == 1 })
	go func() { defer wg.Done(); post() }()
	waitFor(t, "waiting", func() bool { return ev.e.SchedulerStats().Waiting == 1 })
	r := post()
	if r == nil || r.StatusCode != 429 {
		t.Fatalf("third request: %v", r)
	}
	// Nothing has drained yet: the client is told to come back after
	// ColdRetryAfter, when the rate is measured.
	if ra := r.Header.Get("Retry-After"); ra != strconv.Itoa(int(ColdRetryAfter/time.Second)) {
		t.Fatalf("Retry-After %q", ra)
	}
	close(gate)
	wg.Wait()
}

func TestWorkerUnavailableCarriesRetryAfter(t *testing.T) {
	ev := newEnv(t, envOpts{notReady: true})
	c := ev.client(option.WithMaxRetries(0))
	_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "cb-llama",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || apiErr.Response.Header.Get("Retry-After") != strconv.Itoa(WorkerRetryAfter) {
		t.Fatalf("error %v", err)
	}
}
