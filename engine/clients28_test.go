package engine

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/internal/enginetest"
	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/tokenizer"
)

// echoedSeed reads the "seed" extension field of a response body (raw JSON).
func echoedSeed(t *testing.T, raw string) int64 {
	t.Helper()
	var b struct {
		Seed *json.Number `json:"seed"`
	}
	if err := json.Unmarshal([]byte(raw), &b); err != nil || b.Seed == nil {
		t.Fatalf("no seed in %s (%v)", raw, err)
	}
	s, err := b.Seed.Int64()
	if err != nil {
		t.Fatalf("seed %s is not an integer: %v", *b.Seed, err)
	}
	return s
}

func TestGeneratedSeedsFitAJavaScriptNumber(t *testing.T) {
	for range 10000 {
		s, gen := requestSeed(&api.Generation{})
		if !gen || s < 0 || s >= api.MaxGeneratedSeed || float64(s) != float64(int64(float64(s))) {
			t.Fatalf("generated seed %d (generated %v) is not in [0, 2^53)", s, gen)
		}
	}
	given := int64(-5)
	if s, gen := requestSeed(&api.Generation{Seed: &given}); gen || s != -5 {
		t.Fatalf("client seed: %d %v", s, gen)
	}
}

// TestSeedAndFingerprintEchoedToOpenAIClient: through openai-go, every body
// and chunk carries the seed the worker sampled with (a generated one is in
// [0, 2^53)) and a stable system_fingerprint; sending the echoed seed back
// gives the worker the same seed.
func TestSeedAndFingerprintEchoedToOpenAIClient(t *testing.T) {
	w := enginetest.NewWorker(256, 16, 2048)
	ev := newEnv(t, envOpts{worker: w})
	c := ev.client()
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(3), Temperature: openai.Float(1),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("replay me")}}
	var hr *http.Response
	first, err := c.Chat.Completions.New(ctx, params, option.WithResponseInto(&hr))
	if err != nil {
		t.Fatal(err)
	}
	seed := echoedSeed(t, first.RawJSON())
	if seed < 0 || seed >= 1<<53 {
		t.Fatalf("generated seed %d is outside [0, 2^53)", seed)
	}
	id := hr.Header.Get("X-Request-Id")
	if steps := w.SeqSteps(id); len(steps) == 0 || steps[0].GetSampling().GetSeed() != uint64(seed) {
		t.Fatalf("echoed seed %d is not the worker's (%v)", seed, steps)
	}
	fp := first.SystemFingerprint
	if !strings.HasPrefix(fp, "fp_") || len(fp) != 13 {
		t.Fatalf("system_fingerprint %q", fp)
	}

	params.Seed = openai.Int(seed)
	replay, err := c.Chat.Completions.New(ctx, params, option.WithResponseInto(&hr))
	if err != nil {
		t.Fatal(err)
	}
	if got := echoedSeed(t, replay.RawJSON()); got != seed {
		t.Fatalf("replay echoed seed %d, sent %d", got, seed)
	}
	if steps := w.SeqSteps(hr.Header.Get("X-Request-Id")); steps[0].GetSampling().GetSeed() != uint64(seed) {
		t.Fatalf("replay: worker seed %d, want %d", steps[0].GetSampling().GetSeed(), seed)
	}
	if replay.Choices[0].Message.Content != first.Choices[0].Message.Content || replay.SystemFingerprint != fp {
		t.Fatalf("replay %q %s, first %q %s", replay.Choices[0].Message.Content, replay.SystemFingerprint, first.Choices[0].Message.Content, fp)
	}

	// Streamed: every chunk carries the same seed and fingerprint.
	params.Seed = openai.Int(123)
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	n := 0
	for stream.Next() {
		ch := stream.Current()
		n++
		if s := echoedSeed(t, ch.RawJSON()); s != 123 || ch.SystemFingerprint != fp {
			t.Fatalf("chunk %d: seed %d fingerprint %q", n, s, ch.SystemFingerprint)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if n < 3 {
		t.Fatalf("%d chunks", n)
	}

	// Completions too.
	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(2),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if s := echoedSeed(t, comp.RawJSON()); s < 0 || s >= 1<<53 || comp.SystemFingerprint != fp {
		t.Fatalf("completion seed %d fingerprint %q, want %q", s, comp.SystemFingerprint, fp)
	}
}

// TestFingerprintAndCreatedStable: two engines over the same model and
// build (a restart) report the same system_fingerprint and /v1/models
// created (the build's time for the built-in model, not the start time);
// another model shape changes the fingerprint.
func TestFingerprintAndCreatedStable(t *testing.T) {
	probe := func(w *enginetest.Worker) (fp string, created int64) {
		t.Helper()
		ev := newEnv(t, envOpts{worker: w})
		c := ev.client()
		resp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(1),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}})
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.Models.Get(context.Background(), "cb-llama")
		if err != nil {
			t.Fatal(err)
		}
		return resp.SystemFingerprint, m.Created
	}
	fp1, c1 := probe(enginetest.NewWorker(256, 16, 2048))
	fp2, c2 := probe(enginetest.NewWorker(256, 16, 2048))
	if fp1 == "" || fp1 != fp2 || c1 != c2 {
		t.Fatalf("restart: fingerprint %q then %q, created %d then %d", fp1, fp2, c1, c2)
	}
	if bt := buildTime(); bt <= 0 || c1 != bt {
		t.Fatalf("created %d, build time %d", c1, bt)
	}
	other := enginetest.NewWorker(256, 16, 1024) // another model: fewer positions
	if fp3, _ := probe(other); fp3 == fp1 {
		t.Fatalf("a different model shape kept fingerprint %q", fp3)
	}
}

// TestToolMessagesThroughOpenAIClient: an agent loop's history (tools, an
// assistant tool call, the tool's result) is accepted and rendered into the
// built-in model's prompt; images and forced tool calls are refused with
// codes naming the parameter.
func TestToolMessagesThroughOpenAIClient(t *testing.T) {
	w := enginetest.NewWorker(256, 16, 2048)
	ev := newEnv(t, envOpts{worker: w})
	c := ev.client()
	ctx := context.Background()
	weather := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather",
		Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}})
	call := openai.ChatCompletionMessageToolCallUnionParam{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
		ID: "call_1", Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}
	history := []openai.ChatCompletionMessageParamUnion{
		openai.UserMessage("Weather in Paris?"),
		{OfAssistant: &openai.ChatCompletionAssistantMessageParam{ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{call}}},
		openai.ToolMessage(`{"temperature":21}`, "call_1"),
	}
	var hr *http.Response
	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(2),
		Messages: history, Tools: []openai.ChatCompletionToolUnionParam{weather},
		ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")}}, option.WithResponseInto(&hr))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].FinishReason == "" {
		t.Fatalf("response %s", resp.RawJSON())
	}
	steps := w.SeqSteps(hr.Header.Get("X-Request-Id"))
	if len(steps) == 0 {
		t.Fatal("no steps")
	}
	prompt := tokenizer.Tokenizer{}.Decode(steps[0].GetPromptTokens())
	for _, want := range []string{`<|tools|>`, `"name":"get_weather"`, `<|tool_calls|>`, `"arguments":{"city":"Paris"}`, "<|tool|>\n{\"temperature\":21}\n<|assistant|>\n"} {
		if !strings.Contains(prompt, want) {
			t.Fatalf("prompt lacks %q:\n%s", want, prompt)
		}
	}

	image := openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{openai.TextContentPart("what is this?"),
		openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: "https://example.com/x.png"})})
	for _, tc := range []struct {
		name        string
		params      openai.ChatCompletionNewParams
		code, param string
	}{
		{"image part", openai.ChatCompletionNewParams{Model: "cb-llama", Messages: []openai.ChatCompletionMessageParamUnion{image}},
			api.CodeUnsupportedValue, "messages[0].content[1].type"},
		{"forced tool call", openai.ChatCompletionNewParams{Model: "cb-llama", Messages: history, Tools: []openai.ChatCompletionToolUnionParam{weather},
			ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}}, api.CodeUnsupportedValue, "tool_choice"},
		{"tool message without its call id", openai.ChatCompletionNewParams{Model: "cb-llama", Messages: []openai.ChatCompletionMessageParamUnion{
			openai.UserMessage("x"), openai.ToolMessage("r", "")}}, api.CodeMissingRequiredParameter, "messages[1].tool_call_id"},
		{"stream_options without stream", openai.ChatCompletionNewParams{Model: "cb-llama", Messages: history,
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}}, api.CodeUnsupportedParameter, "stream_options"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Chat.Completions.New(ctx, tc.params)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v", err)
			}
			if apiErr.StatusCode != 400 || apiErr.Code != tc.code || apiErr.Param != tc.param {
				t.Fatalf("%d code %q param %q, want %q %q: %s", apiErr.StatusCode, apiErr.Code, apiErr.Param, tc.code, tc.param, apiErr.Message)
			}
			if apiErr.Response.Header.Get("X-Request-Id") == "" {
				t.Fatal("no x-request-id on the error")
			}
		})
	}
}

// TestEveryErrorHasCodeAndRequestID: every 4xx the engine answers (the
// decoder's, the front's 401/404/405/415, documents, the model check)
// has a non-null code and an x-request-id, as openai-go sees them.
func TestEveryErrorHasCodeAndRequestID(t *testing.T) {
	ev := newEnv(t, envOpts{cfg: Config{Settings: httpfront.Settings{APIKey: "k"}}})
	c := ev.client(option.WithAPIKey("k"))
	msg := `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct {
		name, method, path, ctype, key, body string
		status                               int
		code                                 string
	}{
		{"no key", "POST", api.RouteChat, "application/json", "", `{}`, 401, "invalid_api_key"},
		{"415", "POST", api.RouteChat, "text/plain", "k", `{}`, 415, api.CodeUnsupportedMediaType},
		{"unknown route", "GET", "/v2/x", "", "k", ``, 404, "not_found"},
		{"wrong method", "GET", api.RouteChat, "", "k", ``, 405, "method_not_allowed"},
		{"unknown model", "GET", "/v1/models/gpt-9", "", "k", ``, 404, "model_not_found"},
		{"malformed JSON", "POST", api.RouteChat, "application/json", "k", `{"model":`, 400, api.CodeInvalidJSON},
		{"missing model", "POST", api.RouteChat, "application/json", "k", `{` + msg + `}`, 400, api.CodeMissingRequiredParameter},
		{"wrong type", "POST", api.RouteChat, "application/json", "k", `{"model":"cb-llama",` + msg + `,"max_tokens":"5"}`, 400, api.CodeInvalidType},
		{"n=3", "POST", api.RouteChat, "application/json", "k", `{"model":"cb-llama",` + msg + `,"n":3}`, 400, api.CodeUnsupportedValue},
		{"role function", "POST", api.RouteChat, "application/json", "k", `{"model":"cb-llama","messages":[{"role":"function","name":"f","content":"x"}]}`, 400, api.CodeUnsupportedValue},
		{"empty documents", "POST", api.RouteDocuments, "application/json", "k", `{"documents":[]}`, 400, api.CodeEmptyArray},
		{"document empty", "POST", api.RouteDocuments, "application/json", "k", `{"documents":[""]}`, 400, api.CodeInvalidValue},
		{"batched prompt", "POST", api.RouteCompletions, "application/json", "k", `{"model":"cb-llama","prompt":["a","b"]}`, 400, api.CodeUnsupportedValue},
		{"token outside the vocabulary", "POST", api.RouteCompletions, "application/json", "k", `{"model":"cb-llama","prompt":[1,999999]}`, 400, api.CodeInvalidValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, ev.base+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var body api.ErrorBody
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatalf("%d %s: %v", resp.StatusCode, b, err)
			}
			if resp.StatusCode != tc.status || body.Error.Code == nil || *body.Error.Code != tc.code {
				t.Fatalf("%d %s, want %d code %s", resp.StatusCode, b, tc.status, tc.code)
			}
			if resp.Header.Get("X-Request-Id") == "" {
				t.Fatalf("%d without x-request-id", resp.StatusCode)
			}
		})
	}
	// The same through openai-go: the error's response carries the id.
	_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "cb-llama", N: openai.Int(3),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.Code != api.CodeUnsupportedValue || apiErr.Response.Header.Get("X-Request-Id") == "" {
		t.Fatalf("n=3: %v", err)
	}
	// Successes other than generations carry one too.
	for _, p := range []string{"/v1/models", "/health"} {
		req, _ := http.NewRequest("GET", ev.base+p, nil)
		req.Header.Set("Authorization", "Bearer k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get("X-Request-Id") == "" {
			t.Fatalf("%s %d without x-request-id", p, resp.StatusCode)
		}
	}
}
