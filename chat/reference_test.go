package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fixedNow is the strftime_now date both sides render with.
var fixedNow = time.Date(2024, 7, 26, 10, 30, 0, 0, time.UTC)

// smolLM2Template is SmolLM2-Instruct's chat template (plain ChatML with a default system prompt),
// as published in HuggingFaceTB/SmolLM2-1.7B-Instruct's tokenizer_config.json.
const smolLM2Template = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

// longDocument is a ~40 KB user document with paragraphs, lists and code.
func longDocument() string {
	var b strings.Builder
	b.WriteString("Summarize the following report.\n\n")
	for i := range 120 {
		fmt.Fprintf(&b, "## Section %d\n\nThe quarterly figures for region %d rose by %d.%d%% while costs "+
			"\"held steady\"; see table %d. Ünïcödé: ç, ø, 日本語, 🚀.\n\n- item a\n- item 'b'\n\n```go\nfmt.Println(%d)\n```\n\n",
			i, i%7, i%13, i%10, i, i)
	}
	return b.String()
}

// conversation is one test conversation; mayFail marks one a template may reject (then both
// engines must reject it).
type conversation struct {
	name    string
	msgs    []Message
	extra   map[string]any
	mayFail bool
}

// toolsJSON is an OpenAI-style tool list, given as json.RawMessage so both engines see the same
// key order.
var toolsJSON = json.RawMessage(`[{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. \"Paris\""}, "unit": {"type": "string", "description": "Unit", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "description": "Forecast days"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "search", "description": "Search the web — ünïcödé <b>ok</b>.", "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "Query text"}}, "required": ["query"]}}}]`)

// templateExtra holds the variables some templates cannot render without.
var templateExtra = map[string]map[string]any{
	"fireworks-ai-llama-3-firefunction-v2": {"functions": string(toolsJSON), "datetime": "2024-07-26"},
	// Command R+ takes Cohere-style tools (name, description, parameter_definitions).
	"CohereForAI-c4ai-command-r-plus-tool_use": {"tools": json.RawMessage(`[{"name": "internet_search", "description": "Returns a list of relevant document snippets for a textual query retrieved from the internet", "parameter_definitions": {"query": {"description": "Query to search the internet with", "type": "str", "required": true}}}, {"name": "directly_answer", "description": "Calls a standard (un-augmented) AI chatbot to generate a response given the conversation history", "parameter_definitions": {}}]`)},
}

// toolTemplates are the templates that need a tools variable to render.
var toolTemplates = []string{
	"ByteDance-Seed-OSS",
	"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
	"NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
	"meetkai-functionary-medium-v3.1",
	"unsloth-Apriel-1.5",
}

func conversations() []conversation {
	return []conversation{
		{name: "system+user", msgs: []Message{
			{Role: "system", Content: "You are a concise assistant."},
			{Role: "user", Content: "What is the capital of France?"},
		}},
		{name: "user only", msgs: []Message{{Role: "user", Content: "Hello!"}}},
		{name: "multi-turn", msgs: []Message{
			{Role: "system", Content: "You are helpful."},
			{Role: "user", Content: "Hi"},
			{Role: "assistant", Content: "Hello! How can I help?"},
			{Role: "user", Content: "Tell me a joke."},
			{Role: "assistant", Content: "Why did the chicken cross the road?"},
			{Role: "user", Content: "Why?"},
		}},
		{name: "multi-turn without system", msgs: []Message{
			{Role: "user", Content: "2+2?"},
			{Role: "assistant", Content: "4"},
			{Role: "user", Content: "and 3+3?"},
		}},
		{name: "unicode quotes newlines", msgs: []Message{
			{Role: "system", Content: "Réponds en \"français\" — s'il te plaît.\n\tIndented line\r\nCRLF line"},
			{Role: "user", Content: "日本語と emoji 🎉👩‍💻, quotes ' \" `, backslash \\ and \\n, braces {{ x }} {% if %} {# c #}, tags </s> <|im_end|> [INST], NUL \x00, LS \u2028, RTL שלום"},
			{Role: "assistant", Content: "trailing spaces and newlines  \n\n"},
			{Role: "user", Content: "\n\nnewlines first"},
		}},
		{name: "long document", msgs: []Message{
			{Role: "system", Content: "You summarize documents."},
			{Role: "user", Content: longDocument()},
		}},
		{name: "empty content", msgs: []Message{
			{Role: "system", Content: ""},
			{Role: "user", Content: ""},
		}, mayFail: true},
		{name: "with tools", msgs: []Message{
			{Role: "system", Content: "You can call tools."},
			{Role: "user", Content: "Weather in Paris?"},
		}, extra: map[string]any{"tools": toolsJSON}, mayFail: true},
		{name: "tool result", msgs: []Message{
			{Role: "user", Content: "Weather in Paris?"},
			{Role: "assistant", Content: "Let me check."},
			{Role: "tool", Content: "{\"temperature\": 21}", ToolCallID: "call_1", Name: "get_weather"},
		}, mayFail: true},
		// An agent loop's history as an OpenAI client replays it: the assistant's tool call
		// (arguments decoded to an object, as the engine hands them over) and its result.
		{name: "tool call and result", msgs: []Message{
			{Role: "user", Content: "Weather in Paris?"},
			{Role: "assistant", Content: "", ToolCalls: json.RawMessage(`[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris","days":2}}}]`)},
			{Role: "tool", Content: "{\"temperature\": 21}", ToolCallID: "call_1", Name: "get_weather"},
		}, extra: map[string]any{"tools": toolsJSON}, mayFail: true},
	}
}

// requiredTemplates must match @huggingface/jinja on every conversation.
var requiredTemplates = []string{
	"meta-llama-Llama-3.1-8B-Instruct",
	"meta-llama-Llama-3.2-3B-Instruct",
	"Qwen-Qwen2.5-7B-Instruct",
	"HuggingFaceTB-SmolLM3-3B",
	"SmolLM2 (ChatML, constant)",
	"mistralai-Mistral-Nemo-Instruct-2407",
	"unsloth-mistral-Devstral-Small-2507",
	"Mistral-Small-3.2-24B-Instruct-2506",
	"microsoft-Phi-3.5-mini-instruct",
	"google-gemma-2-2b-it",
}

// knownDifferent lists the templates of llama.cpp's collection that do not match, with the reason.
// Every other template in the directory must match.
var knownDifferent = map[string]string{
	"ByteDance-Seed-OSS": "@huggingface/jinja throws on its dict literal with integer keys ({0: 0, 512: 128, ...}: " +
		"\"Object keys must be strings\"); Go renders it",
	"tencent-Hy3":        "@huggingface/jinja has no str.format() (\"Cannot call something that is not a function\"); Go renders it",
	"unsloth-Apriel-1.5": "@huggingface/jinja has no string filter for a dict (\"Unknown ObjectValue filter: string\"); Go renders it",
}

// templateResult is the comparison of one template on all conversations.
type templateResult struct {
	name     string
	problems []string
}

func TestMatchesHuggingFaceJinja(t *testing.T) {
	dir := filepath.Join(refDir(t), "llama.cpp", "models", "templates")
	files, err := filepath.Glob(filepath.Join(dir, "*.jinja"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no templates in %s (%v): run bash scripts/deps.sh", dir, err)
	}
	type tmpl struct{ name, src string }
	tmpls := []tmpl{{"SmolLM2 (ChatML, constant)", smolLM2Template}}
	for _, f := range files {
		tmpls = append(tmpls, tmpl{strings.TrimSuffix(filepath.Base(f), ".jinja"), readFile(t, f)})
	}
	for _, name := range requiredTemplates {
		if !slices.ContainsFunc(tmpls, func(x tmpl) bool { return x.name == name }) {
			t.Fatalf("required template %s not found in %s", name, dir)
		}
	}

	type goCase struct {
		tmpl int
		conv conversation
		agp  bool
	}
	var cases []refCase
	var meta []goCase
	for ti, tm := range tmpls {
		for _, c := range conversations() {
			for _, agp := range []bool{false, true} {
				o := Options{BOS: "<s>", EOS: "</s>", AddGenerationPrompt: agp, Now: fixedNow, Extra: map[string]any{}}
				for k, v := range templateExtra[tm.name] {
					o.Extra[k] = v
				}
				if slices.Contains(toolTemplates, tm.name) {
					o.Extra["tools"] = toolsJSON
				}
				for k, v := range c.extra {
					o.Extra[k] = v
				}
				cases = append(cases, refCase{Template: tm.src, Messages: c.msgs, Opts: o})
				meta = append(meta, goCase{ti, c, agp})
			}
		}
	}
	ref := renderRef(t, cases)

	results := make([]templateResult, len(tmpls))
	parsed := make([]*Template, len(tmpls))
	parseErr := make([]error, len(tmpls))
	for i, tm := range tmpls {
		results[i].name = tm.name
		parsed[i], parseErr[i] = Parse(tm.src)
	}
	accepted := map[string]int{} // tolerated failures on the conversations a template may reject
	for i, c := range cases {
		m := meta[i]
		var got string
		err := parseErr[m.tmpl]
		if err == nil {
			got, err = parsed[m.tmpl].Render(c.Messages, c.Opts)
		}
		where := fmt.Sprintf("%s, add_generation_prompt=%v", m.conv.name, m.agp)
		r := ref[i]
		var problem string
		switch {
		case r.Error != nil && err != nil:
			// The same raise_exception on both sides is the same behaviour.
			var re *RaiseError
			switch {
			case errors.As(err, &re) && re.Message == *r.Error:
				accepted["same raise_exception"]++
			case m.conv.mayFail:
				accepted["both fail on "+m.conv.name]++
			default:
				problem = fmt.Sprintf("%s: both fail: go %v; ref %s", where, err, *r.Error)
			}
		case r.Error != nil:
			// Go renders where @huggingface/jinja throws (Python Jinja is lenient in the same
			// places); acceptable only on the conversations a template may reject.
			if !m.conv.mayFail {
				problem = fmt.Sprintf("%s: only @huggingface/jinja fails: %s", where, *r.Error)
			} else {
				accepted["only @huggingface/jinja fails on "+m.conv.name]++
				t.Logf("tolerated: %s %s: %s", results[m.tmpl].name, where, *r.Error)
			}
		case err != nil:
			problem = fmt.Sprintf("%s: only Go fails: %v", where, err)
		case got != *r.Output:
			problem = fmt.Sprintf("%s: output differs at byte %d:\n go: %q\nref: %q", where, diffAt(got, *r.Output), around(got, *r.Output), around(*r.Output, got))
		}
		if problem != "" {
			results[m.tmpl].problems = append(results[m.tmpl].problems, problem)
		}
	}

	var pass, fail []string
	for _, r := range results {
		reason, known := knownDifferent[r.name]
		required := slices.Contains(requiredTemplates, r.name)
		switch {
		case len(r.problems) == 0:
			pass = append(pass, r.name)
			if known {
				t.Errorf("%s now matches; remove it from knownDifferent (%s)", r.name, reason)
			}
		case known && !required:
			fail = append(fail, r.name+": "+reason)
		default:
			t.Errorf("%s does not match @huggingface/jinja (%d problems), first:\n%s", r.name, len(r.problems), r.problems[0])
		}
	}
	t.Logf("%d templates match @huggingface/jinja on %d renders each: %s", len(pass), 2*len(conversations()), strings.Join(pass, ", "))
	for _, f := range fail {
		t.Logf("known difference: %s", f)
	}
	t.Logf("tolerated failures (renders): %v", accepted)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// diffAt is the first byte where a and b differ.
func diffAt(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// around is a's text around the first difference from b.
func around(a, b string) string {
	i := diffAt(a, b)
	lo, hi := max(0, i-40), min(len(a), i+40)
	return a[lo:hi]
}
