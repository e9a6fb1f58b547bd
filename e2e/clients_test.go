package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/stack"
)

// openaiClient is the official OpenAI Go client on the stack's API, with
// its own HTTP client (idle connections closed when the test ends).
func (e *env) openaiClient(opts ...option.RequestOption) openai.Client {
	e.t.Helper()
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 120 * time.Second}
	e.t.Cleanup(hc.CloseIdleConnections)
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(e.api + "/v1/"),
		option.WithAPIKey("unused"), option.WithHTTPClient(hc), option.WithMaxRetries(0)}, opts...)...)
}

// usageExtension decodes the "cacheblend" extension of a usage object's
// raw JSON.
func usageExtension(t *testing.T, raw string) api.UsageCacheBlend {
	t.Helper()
	var u struct {
		CacheBlend *api.UsageCacheBlend `json:"cacheblend"`
	}
	if err := json.Unmarshal([]byte(raw), &u); err != nil || u.CacheBlend == nil {
		t.Fatalf("usage %s has no cacheblend extension (%v)", raw, err)
	}
	return *u.CacheBlend
}

// ragChat is a chat request over the sample documents in the given order.
func ragChat(maxTokens int64, order ...int) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(maxTokens), Temperature: openai.Float(0),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(ragPrompt(order...))}}
}

// TestOpenAIClientCachedTokens: through the official openai-go client, a
// request reusing stored documents reports cached_tokens > 0 (CacheBlend's
// non-prefix reuse, in the cacheblend extension), streamed usage too, and
// the split adds up to the prompt.
func TestOpenAIClientCachedTokens(t *testing.T) {
	e := startEnv(t, options{})
	e.ingest()
	c := e.openaiClient()
	ctx := context.Background()
	resp, err := c.Chat.Completions.New(ctx, ragChat(4, 5, 2, 7))
	if err != nil {
		t.Fatal(err)
	}
	u := resp.Usage
	ext := usageExtension(t, u.RawJSON())
	t.Logf("usage: prompt %d, cached %d, split %+v", u.PromptTokens, u.PromptTokensDetails.CachedTokens, ext)
	if u.PromptTokensDetails.CachedTokens <= 0 || ext.NonPrefixHitTokens <= 0 {
		t.Fatalf("a request over stored documents: cached %d, split %+v", u.PromptTokensDetails.CachedTokens, ext)
	}
	if int64(ext.PrefixHitTokens+ext.NonPrefixHitTokens) != u.PromptTokensDetails.CachedTokens ||
		int64(ext.PrefixHitTokens+ext.NonPrefixHitTokens+ext.RecomputedTokens) != u.PromptTokens {
		t.Fatalf("split %+v does not add up (cached %d, prompt %d)", ext, u.PromptTokensDetails.CachedTokens, u.PromptTokens)
	}

	params := ragChat(4, 3, 6, 1)
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
	sext := usageExtension(t, raw)
	if acc.Usage.PromptTokensDetails.CachedTokens <= 0 || sext.NonPrefixHitTokens <= 0 ||
		int64(sext.PrefixHitTokens+sext.NonPrefixHitTokens) != acc.Usage.PromptTokensDetails.CachedTokens {
		t.Fatalf("streamed usage: cached %d, split %+v", acc.Usage.PromptTokensDetails.CachedTokens, sext)
	}
}

// TestOpenAIClientSeeds: on a small random model at temperature 1, two
// requests without a seed sample different tokens somewhere in 20 tries
// (each gets a fresh seed), while two requests with the same seed agree
// and two different seeds do not (so the agreement can fail). (A 16-wide
// model keeps the test fast.)
func TestOpenAIClientSeeds(t *testing.T) {
	e := startEnv(t, options{workerArgs: []string{"--layers", "2", "--dim", "16", "--heads", "2", "--kv-heads", "1", "--ffn-dim", "32"}})
	c := e.openaiClient()
	ctx := context.Background()
	complete := func(seed *int64) string {
		t.Helper()
		p := openai.CompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(8), Temperature: openai.Float(1),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Tell me a story about caches")}}
		if seed != nil {
			p.Seed = openai.Int(*seed)
		}
		resp, err := c.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Choices[0].Text
	}
	differed := 0
	tries := 0
	for tries < 20 && differed == 0 {
		tries++
		if complete(nil) != complete(nil) {
			differed++
		}
	}
	if differed == 0 {
		t.Fatal("20 pairs of unseeded requests at temperature 1 sampled the same text")
	}
	t.Logf("unseeded requests differed at try %d", tries)
	var seeded []string
	for _, seed := range []int64{7, 123456789} {
		a, b := complete(&seed), complete(&seed)
		if a != b {
			t.Fatalf("seed %d: %q then %q", seed, a, b)
		}
		seeded = append(seeded, a)
	}
	requireDistinctText(t, seeded...)
	// The log line records each request's seed: a generated one replays.
	var generated int64 = -1
	for _, l := range strings.Split(e.logs.String(), "\n") {
		if i := strings.Index(l, `{"time"`); i >= 0 && strings.Contains(l, `"msg":"request"`) && strings.Contains(l, `"seed_generated":true`) {
			var m struct{ Seed int64 }
			if json.Unmarshal([]byte(l[i:]), &m) == nil {
				generated = m.Seed
			}
		}
	}
	if generated < 0 {
		t.Fatal("no log line records a generated seed")
	}
}

// TestOpenAIClientErrorCodes: the official client sees OpenAI's codes and
// params for the context limit and the other limits; a body that is not
// JSON is refused with 415.
func TestOpenAIClientErrorCodes(t *testing.T) {
	e := startEnv(t, options{})
	c := e.openaiClient()
	ctx := context.Background()
	resp, err := http.Get(e.api + "/v1/models/cb-llama")
	if err != nil {
		t.Fatal(err)
	}
	var model struct {
		MaxModelLen int64 `json:"max_model_len"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&model)
	resp.Body.Close()
	if model.MaxModelLen <= 0 {
		t.Fatal("no max_model_len")
	}
	huge := model.MaxModelLen + 10
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}
	for _, tc := range []struct {
		name        string
		call        func() error
		code, param string
	}{
		{"max_completion_tokens beyond the context", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "cb-llama", Messages: msgs, MaxCompletionTokens: openai.Int(huge)})
			return err
		}, "context_length_exceeded", "max_completion_tokens"},
		{"max_tokens beyond the context", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "cb-llama", Messages: msgs, MaxTokens: openai.Int(huge)})
			return err
		}, "context_length_exceeded", "max_tokens"},
		{"messages beyond the context", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "cb-llama",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("x", int(huge)))}})
			return err
		}, "context_length_exceeded", "messages"},
		{"temperature above 2", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "cb-llama", Messages: msgs, Temperature: openai.Float(2.5)})
			return err
		}, "decimal_above_max_value", "temperature"},
		{"n above 1", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "cb-llama", Messages: msgs, N: openai.Int(2)})
			return err
		}, "unsupported_value", "n"},
		{"five stop sequences", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "cb-llama", Messages: msgs,
				Stop: openai.ChatCompletionNewParamsStopUnion{OfStringArray: []string{"a", "b", "c", "d", "e"}}})
			return err
		}, "array_above_max_length", "stop"},
		{"unknown model", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-9", Messages: msgs})
			return err
		}, "model_not_found", "model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var apiErr *openai.Error
			if err := tc.call(); !errors.As(err, &apiErr) {
				t.Fatalf("error %v", err)
			}
			if apiErr.Code != tc.code || apiErr.Param != tc.param {
				t.Fatalf("code %q param %q, want %q %q: %s", apiErr.Code, apiErr.Param, tc.code, tc.param, apiErr.Message)
			}
		})
	}
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b"} {
		t.Run("415 "+ct, func(t *testing.T) {
			resp, err := http.Post(e.api+"/v1/chat/completions", ct,
				strings.NewReader(`{"model":"cb-llama","messages":[{"role":"user","content":"x"}],"max_tokens":1}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(string(b), `"unsupported_media_type"`) {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
		})
	}
}

// retryLog records, per request attempt, its status, Retry-After and time
// (an openai-go middleware).
type retryLog struct {
	mu       sync.Mutex
	attempts []attempt
}

type attempt struct {
	at         time.Time
	status     int
	retryAfter string
	// retryAfterMs is the Retry-After-Ms header ("" without one): the SDKs
	// read it first, to the millisecond.
	retryAfterMs string
	client       string
}

func (l *retryLog) middleware(client string) option.Middleware {
	return func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		at := time.Now()
		resp, err := next(req)
		a := attempt{at: at, client: client}
		if resp != nil {
			a.status, a.retryAfter, a.retryAfterMs = resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Retry-After-Ms")
		}
		l.mu.Lock()
		l.attempts = append(l.attempts, a)
		l.mu.Unlock()
		return resp, err
	}
}

// TestRetryAfterHonoured: against an engine with a one-request queue,
// concurrent openai-go clients (retries on) are refused with 429 and a
// Retry-After computed from the queue's drain rate; each waits it out and
// is served.
func TestRetryAfterHonoured(t *testing.T) {
	e := startEnv(t, options{engineArgs: []string{"--max-queue", "1", "--max-running", "1"}})
	ctx := context.Background()
	// Some requests finish first, so that the drain rate is measured.
	warm := e.openaiClient()
	for range 3 {
		if _, err := warm.Completions.New(ctx, openai.CompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(8),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("warm up")}}); err != nil {
			t.Fatal(err)
		}
	}
	const clients = 8
	var log retryLog
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		name := "client-" + strconv.Itoa(i)
		c := e.openaiClient(option.WithMaxRetries(10), option.WithMiddleware(log.middleware(name)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(48),
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("a longer answer, please")}},
				option.WithJSONSet("ignore_eos", true))
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	refused := 0
	byClient := map[string][]attempt{}
	for _, a := range log.attempts {
		byClient[a.client] = append(byClient[a.client], a)
	}
	for name, as := range byClient {
		for i, a := range as {
			if a.status != http.StatusTooManyRequests {
				continue
			}
			refused++
			secs, err := strconv.Atoi(a.retryAfter)
			if err != nil || secs < 1 || secs > 60 {
				t.Fatalf("%s: 429 with Retry-After %q", name, a.retryAfter)
			}
			if i+1 >= len(as) {
				t.Fatalf("%s: no retry after a 429", name)
			}
			wait := time.Duration(secs) * time.Second
			if a.retryAfterMs != "" { // what the SDK follows when sent
				ms, err := strconv.ParseInt(a.retryAfterMs, 10, 64)
				if err != nil || ms < 1 || time.Duration(ms)*time.Millisecond > wait {
					t.Fatalf("%s: 429 with Retry-After-Ms %q beyond Retry-After %ds", name, a.retryAfterMs, secs)
				}
				wait = time.Duration(ms) * time.Millisecond
			}
			if waited := as[i+1].at.Sub(a.at); waited < wait {
				t.Fatalf("%s: retried after %v, Retry-After %ds, Retry-After-Ms %q", name, waited, secs, a.retryAfterMs)
			}
			t.Logf("%s: 429 with Retry-After %ss, retried after %v (status %d)", name, a.retryAfter, as[i+1].at.Sub(a.at).Round(time.Millisecond), as[i+1].status)
		}
		if last := as[len(as)-1]; last.status != http.StatusOK {
			t.Fatalf("%s: last attempt %d", name, last.status)
		}
	}
	if refused == 0 {
		t.Fatal("no request was refused: the queue never filled")
	}
}

// TestEngineServesWithinASecondOfWorkerRestart kills the worker three
// times in a row; after each restart (the worker's READY line) the engine
// serves a request again within a generous bound (see the comment at the
// assertion), and the measured delays are logged.
func TestEngineServesWithinASecondOfWorkerRestart(t *testing.T) {
	var mu sync.Mutex
	readyAt := map[int]time.Time{} // worker pid → when it announced READY
	e := startEnv(t, options{onReady: func(r stack.Ready) {
		if r.Service == "cb-worker" {
			mu.Lock()
			readyAt[r.PID] = time.Now()
			mu.Unlock()
		}
	}})
	body := `{"model":"cb-llama","max_tokens":1,"messages":[{"role":"user","content":"are you back?"}]}`
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	serve := func() bool {
		resp, err := hc.Post(e.api+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if !serve() {
		t.Fatal("not serving before the first kill")
	}
	workerPID := func() int {
		for _, s := range e.stack.Supervisor().Status() {
			if s.Name == "cb-worker" {
				return s.PID
			}
		}
		return 0
	}
	for i := range 3 {
		old := workerPID()
		if err := e.stack.Supervisor().Signal("cb-worker", syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		// Wait for the restarted worker's READY, probing the engine all along
		// (as clients would).
		var ready time.Time
		deadline := time.Now().Add(60 * time.Second)
		for ready.IsZero() {
			if time.Now().After(deadline) {
				t.Fatalf("kill %d: the worker did not come back", i+1)
			}
			serve()
			mu.Lock()
			for pid, at := range readyAt {
				if pid != old && at.After(killed) {
					ready = at
				}
			}
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
		for !serve() {
			if time.Now().After(deadline) {
				t.Fatalf("kill %d: the engine did not serve again", i+1)
			}
			time.Sleep(10 * time.Millisecond)
		}
		back := time.Since(ready)
		t.Logf("kill %d: worker restarted %v after the kill; engine serving %v after the worker's READY",
			i+1, ready.Sub(killed).Round(time.Millisecond), back.Round(time.Millisecond))
		// The bound is the requirement, 1 s, about 5x what the design needs:
		// the engine probes its worker every 100 ms and every failed probe
		// redials at once (the reconnect backoff, capped at 0.5 s +20%, only
		// matters without probes), so the first probe after the READY line
		// connects: measured 89-101 ms per restart on the shared 2-core
		// machine. Before (gRPC's default backoff, a 1 s probe) the same
		// test measured 1.0-2.0 s, and after many crashes ~18 s.
		if back > time.Second {
			t.Fatalf("kill %d: the engine served again only %v after the worker's READY", i+1, back)
		}
	}
}

// scrapeSum sums the samples of a counter or gauge family in a
// Prometheus text exposition.
func scrapeSum(t *testing.T, url, name string) float64 {
	t.Helper()
	body, err := httpGet(url)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != ' ' && l[len(name)] != '{') {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// TestDocumentSurvivesBlendRestart: documents stored through
// /v1/documents, the blend server killed (SIGKILL) and restarted by the
// supervisor on the same state directory: a request over the documents
// reuses them (non-prefix hits, KV scattered by the restarted server).
func TestDocumentSurvivesBlendRestart(t *testing.T) {
	e := startEnv(t, options{stateDir: t.TempDir() + "/state"})
	e.ingest()
	c := e.openaiClient()
	ctx := context.Background()
	blendPID := func() int {
		for _, s := range e.stack.Supervisor().Status() {
			if s.Name == "cb-blend" {
				return s.PID
			}
		}
		return 0
	}
	old := blendPID()
	if err := e.stack.Supervisor().Signal("cb-blend", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	metricsURL := e.stack.Endpoints().Blend.Metrics // same port after the restart
	deadline := time.Now().Add(60 * time.Second)
	for {
		if pid := blendPID(); pid != old && pid != 0 {
			if _, err := httpGet(metricsURL); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the blend server did not come back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := scrapeSum(t, metricsURL, "lmcache_blend_fingerprints"); n <= 0 {
		t.Fatalf("the restarted blend server has %v fingerprints: the stored documents were not restored", n)
	}
	// The worker registers its KV memory again (every second until the
	// server listens): retry until the restarted server scattered KV.
	var ext api.UsageCacheBlend
	for i := 0; ; i++ {
		resp, err := c.Chat.Completions.New(ctx, ragChat(2, 6, 1, 4+i%3))
		if err != nil {
			t.Fatal(err)
		}
		ext = usageExtension(t, resp.Usage.RawJSON())
		if ext.NonPrefixHitTokens > 0 && scrapeSum(t, metricsURL, "lmcache_blend_scattered_tokens_total") > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reuse through the restarted blend server: last split %+v", ext)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("documents reused %v after the blend server's kill: split %+v", time.Since(killed).Round(time.Millisecond), ext)
}

// TestBurstOverTheQueueServedWithRetryAfter: 600 concurrent openai-go
// clients (5 retries, the client's default behaviour for 429 is to honour
// Retry-After) against the default 256-request queue: every request is
// served (without retries, 328 of the 600 are refused: measured once with
// option.WithMaxRetries(0)).
func TestBurstOverTheQueueServedWithRetryAfter(t *testing.T) {
	e := startEnv(t, options{})
	var log retryLog
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []error
	var slowest time.Duration
	t0 := time.Now()
	for i := range 600 {
		c := e.openaiClient(option.WithMaxRetries(5), option.WithMiddleware(log.middleware(strconv.Itoa(i))))
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := time.Now()
			_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(32),
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("a longer answer, please")}},
				option.WithJSONSet("ignore_eos", true))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err)
			}
			slowest = max(slowest, time.Since(s))
		}()
	}
	wg.Wait()
	values := map[string]int{}
	refused := 0
	for _, a := range log.attempts {
		if a.status == http.StatusTooManyRequests {
			refused++
			values[a.retryAfter]++
			if secs, err := strconv.Atoi(a.retryAfter); err != nil || secs < 1 || secs > 60 {
				t.Fatalf("429 with Retry-After %q", a.retryAfter)
			}
		}
	}
	t.Logf("600 requests: %d failed, %d answers were 429 (Retry-After values %v); wall %v, slowest request %v",
		len(failed), refused, values, time.Since(t0).Round(time.Millisecond), slowest.Round(time.Millisecond))
	if len(failed) > 0 {
		t.Fatalf("%d of 600 requests failed, e.g. %v", len(failed), failed[0])
	}
	if refused == 0 {
		t.Fatal("the queue never filled")
	}
}
