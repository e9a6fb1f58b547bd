package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/gateway"
)

// responseSeed reads the "seed" a response body echoes, as a JavaScript
// client would: through a float64.
func responseSeed(t *testing.T, raw string) (exact int64, asJS float64) {
	t.Helper()
	var b struct {
		Seed *json.Number `json:"seed"`
	}
	if err := json.Unmarshal([]byte(raw), &b); err != nil || b.Seed == nil {
		t.Fatalf("no seed in %s (%v)", raw, err)
	}
	exact, err := b.Seed.Int64()
	if err != nil {
		t.Fatal(err)
	}
	asJS, err = b.Seed.Float64()
	if err != nil {
		t.Fatal(err)
	}
	return exact, asJS
}

// TestOpenAIClientReplaysEchoedSeed: at temperature 1 on a small random
// model, a request without a seed echoes the seed it drew (below 2^53, so
// a JavaScript number holds it exactly); sending that seed back through the
// official client, as a float64 would carry it, reproduces the text, and
// the system_fingerprint is the same. Several draws so that the replay
// could fail (unseeded requests differ).
func TestOpenAIClientReplaysEchoedSeed(t *testing.T) {
	e := startEnv(t, options{workerArgs: []string{"--layers", "2", "--dim", "16", "--heads", "2", "--kv-heads", "1", "--ffn-dim", "32"}})
	c := e.openaiClient()
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(12), Temperature: openai.Float(1),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a story about caches")}}
	texts := map[string]bool{}
	var fp string
	for i := range 4 {
		first, err := c.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		seed, js := responseSeed(t, first.RawJSON())
		if seed < 0 || seed >= 1<<53 || int64(js) != seed {
			t.Fatalf("echoed seed %d (as a JS number %v) is not exact below 2^53", seed, js)
		}
		replayParams := params
		replayParams.Seed = openai.Int(int64(js))
		replay, err := c.Chat.Completions.New(ctx, replayParams)
		if err != nil {
			t.Fatal(err)
		}
		a, b := first.Choices[0].Message.Content, replay.Choices[0].Message.Content
		if a != b {
			t.Fatalf("seed %d: %q, replayed %q", seed, a, b)
		}
		if fp == "" {
			fp = first.SystemFingerprint
		}
		if !strings.HasPrefix(fp, "fp_") || first.SystemFingerprint != fp || replay.SystemFingerprint != fp {
			t.Fatalf("fingerprints %q %q, want %q", first.SystemFingerprint, replay.SystemFingerprint, fp)
		}
		texts[a] = true
		t.Logf("draw %d: seed %d replayed %q", i, seed, a)
	}
	if len(texts) < 2 {
		t.Fatalf("4 unseeded requests gave %d distinct texts: the replay check cannot fail", len(texts))
	}
}

// TestGatewayErrorsCarryRequestIDAndCode: through a gateway (in process,
// over a stack's engine), the errors the gateway makes itself (400 for n=3,
// for an image and for stream_options without stream, 415, 404, empty
// documents) carry x-request-id (openai-go: the error's response header)
// and a code; an agent loop's tool history is served with the engine's
// system_fingerprint, and /v1/models created is the same through the
// gateway and after an engine restart.
func TestGatewayErrorsCarryRequestIDAndCode(t *testing.T) {
	e := startEnv(t, options{workerArgs: smallModel})
	engineAPI := e.api
	gw, err := gateway.New(gateway.Config{Addr: "127.0.0.1:0", Engines: []string{engineAPI}}, gateway.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = gw.Shutdown(sctx)
	})
	e.api = "http://" + gw.Addr()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(e.api + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway did not see its engine up: %v", err)
		}
	}
	c := e.openaiClient()
	image := openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{openai.TextContentPart("what is this?"),
		openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: "https://example.com/x.png"})})
	for _, tc := range []struct {
		name        string
		params      openai.ChatCompletionNewParams
		code, param string
	}{
		{"n=3", openai.ChatCompletionNewParams{Model: "cb-llama", N: openai.Int(3), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}},
			api.CodeUnsupportedValue, "n"},
		{"image part", openai.ChatCompletionNewParams{Model: "cb-llama", Messages: []openai.ChatCompletionMessageParamUnion{image}},
			api.CodeUnsupportedValue, "messages[0].content[1].type"},
		{"stream_options without stream", openai.ChatCompletionNewParams{Model: "cb-llama", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")},
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}}, api.CodeUnsupportedParameter, "stream_options"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Chat.Completions.New(ctx, tc.params)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v", err)
			}
			if apiErr.StatusCode != 400 || apiErr.Code != tc.code || apiErr.Param != tc.param {
				t.Fatalf("%d code %q param %q, want %q %q", apiErr.StatusCode, apiErr.Code, apiErr.Param, tc.code, tc.param)
			}
			if id := apiErr.Response.Header.Get("x-request-id"); id == "" {
				t.Fatal("the gateway's error has no x-request-id")
			}
		})
	}
	for _, tc := range []struct {
		name, method, path, ctype string
		status                    int
		code                      string
	}{
		{"415", "POST", "/v1/chat/completions", "text/plain", 415, api.CodeUnsupportedMediaType},
		{"404", "GET", "/v1/nowhere", "", 404, "not_found"},
		{"empty documents", "POST", "/v1/documents", "application/json", 400, api.CodeEmptyArray},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"model":"cb-llama","messages":[{"role":"user","content":"x"}]}`
			if tc.path == "/v1/documents" {
				body = `{"documents":[]}`
			}
			req, _ := http.NewRequest(tc.method, e.api+tc.path, strings.NewReader(body))
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var eb api.ErrorBody
			_ = json.Unmarshal(b, &eb)
			if resp.StatusCode != tc.status || eb.Error.Code == nil || *eb.Error.Code != tc.code || resp.Header.Get("X-Request-Id") == "" {
				t.Fatalf("%d %s (x-request-id %q), want %d %s", resp.StatusCode, b, resp.Header.Get("X-Request-Id"), tc.status, tc.code)
			}
		})
	}

	// An agent loop's history with tools, through the gateway to an engine.
	weather := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather"})
	call := openai.ChatCompletionMessageToolCallUnionParam{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
		ID: "call_1", Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}
	fps := map[string]bool{}
	for i := range 3 {
		var hr *http.Response
		resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "cb-llama", MaxTokens: openai.Int(2),
			Tools: []openai.ChatCompletionToolUnionParam{weather},
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Paris? " + strings.Repeat("x", i)),
				{OfAssistant: &openai.ChatCompletionAssistantMessageParam{ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{call}}},
				openai.ToolMessage(`{"temperature":21}`, "call_1")}}, option.WithResponseInto(&hr))
		if err != nil {
			t.Fatalf("tool history: %v", err)
		}
		if hr.Header.Get("X-Request-Id") == "" {
			t.Fatal("no x-request-id on a served request")
		}
		fps[resp.SystemFingerprint] = true
	}
	if len(fps) != 1 {
		t.Fatalf("%d fingerprints for one model and build: %v", len(fps), fps)
	}
	created := map[int64]bool{}
	for _, base := range []string{e.api, engineAPI} {
		nc := e.openaiClientAt(base)
		m, err := nc.Models.Get(ctx, "cb-llama")
		if err != nil {
			t.Fatal(err)
		}
		created[m.Created] = true
	}
	if len(created) != 1 {
		t.Fatalf("different created times: %v", created)
	}
}

// openaiClientAt is the official client on another API base URL.
func (e *env) openaiClientAt(base string) openai.Client {
	e.t.Helper()
	hc := &http.Client{Transport: &http.Transport{}}
	e.t.Cleanup(hc.CloseIdleConnections)
	return openai.NewClient(option.WithBaseURL(strings.TrimSuffix(base, "/")+"/v1/"), option.WithAPIKey("unused"),
		option.WithHTTPClient(hc), option.WithMaxRetries(0))
}
