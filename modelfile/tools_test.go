package modelfile

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/chat"
	"github.com/cacheblend/cacheblend/internal/testmodel"
)

// TestChatTokensTools: a tool-use template gets the request's tools and an
// agent loop's history (the assistant's tool call, arguments as an object,
// and the tool's result) and renders them; without tools the rendering is
// ChatTokens'.
func TestChatTokensTools(t *testing.T) {
	tools := json.RawMessage(`[{"type":"function","function":{"name":"get_weather","description":"Weather of a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`)
	msgs := []chat.Message{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: json.RawMessage(`[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]`)},
		{Role: "tool", Content: `{"temperature": 21}`, ToolCallID: "call_1"},
	}
	for _, tc := range []struct {
		name, vocab, tmpl string
		want              []string // in the rendering with tools
	}{
		{"Llama 3.1", "llama-bpe", "meta-llama-Llama-3.1-8B-Instruct",
			[]string{`"name": "get_weather"`, `{"name": "get_weather", "parameters": {"city": "Paris"}}`, "<|start_header_id|>ipython<|end_header_id|>\n\n" + `"{\"temperature\": 21}"`}},
		{"Qwen2.5", "qwen2", "Qwen-Qwen2.5-7B-Instruct",
			[]string{"<tools>", `"name": "get_weather"`, `<tool_call>` + "\n" + `{"name": "get_weather", "arguments": {"city": "Paris"}}`, "<tool_response>\n{\"temperature\": 21}\n</tool_response>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Open(writeModel(t, testmodel.Spec{Name: "tiny", VocabFile: refPath(t, "ggml-vocab-"+tc.vocab+".gguf"), Template: template(t, tc.tmpl)}))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			toks, text, err := f.ChatTokensTools(msgs, tools)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Fatalf("rendering lacks %q:\n%s", w, text)
				}
			}
			if len(toks) == 0 {
				t.Fatal("no tokens")
			}
			plain, _, err := f.ChatTokens(msgs)
			if err != nil {
				t.Fatal(err)
			}
			none, _, err := f.ChatTokensTools(msgs, nil)
			if err != nil || len(plain) != len(none) || len(plain) >= len(toks) {
				t.Fatalf("without tools: %d and %d tokens (%v); with: %d", len(plain), len(none), err, len(toks))
			}
		})
	}
}
