package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

func TestDecodeChatValid(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"system","content":"be brief"},
		{"role":"user","content":[{"type":"text","text":"hel"},{"type":"text","text":"lo"}]},
		{"role":"assistant","content":null}],
		"max_tokens":5,"max_completion_tokens":7,"temperature":0,"top_p":0.5,"n":1,
		"stream":true,"stream_options":{"include_usage":true},"stop":"\n","seed":-3,
		"presence_penalty":0,"tools":[],"response_format":{"type":"text"},"user":"u","unknown_field":1}`
	g, e := DecodeChat([]byte(body))
	if e != nil {
		t.Fatal(e)
	}
	want := []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello"}, {Role: "assistant"}}
	if !slices.Equal(g.Messages, want) {
		t.Errorf("messages = %+v", g.Messages)
	}
	if g.Operation != OperationChat || g.Model != "m" || g.MaxTokens != 7 || g.Temperature != 0 || g.TopP != 0.5 ||
		!g.Stream || !g.IncludeUsage || !slices.Equal(g.Stop, []string{"\n"}) || g.Seed == nil || *g.Seed != -3 {
		t.Errorf("generation = %+v", g)
	}
	if got := ChatPrompt(g.Messages); got != "<|system|>\nbe brief\n<|user|>\nhello\n<|assistant|>\n\n<|assistant|>\n" {
		t.Errorf("prompt = %q", got)
	}
}

func TestDecodeChatDefaults(t *testing.T) {
	g, e := DecodeChat([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
	if e != nil {
		t.Fatal(e)
	}
	if g.MaxTokens != 0 || g.Temperature != 1 || g.TopP != 1 || g.Stream || g.Seed != nil || g.Stop != nil {
		t.Errorf("defaults = %+v", g)
	}
}

func TestDecodeChatRejects(t *testing.T) {
	for _, tc := range []struct {
		name, body, param string
	}{
		{"empty body", ``, ""},
		{"not an object", `[1,2]`, ""},
		{"null", `null`, ""},
		{"malformed JSON", `{"model":"m",`, ""},
		{"trailing garbage", `{"model":"m","messages":[{"role":"user","content":"x"}]} x`, ""},
		{"invalid UTF-8", "{\"model\":\"m\xff\"}", ""},
		{"missing model", `{"messages":[{"role":"user","content":"x"}]}`, "model"},
		{"model not a string", `{"model":3,"messages":[]}`, "model"},
		{"missing messages", `{"model":"m"}`, "messages"},
		{"empty messages", `{"model":"m","messages":[]}`, "messages"},
		{"messages not array", `{"model":"m","messages":"hi"}`, "messages"},
		{"no role", `{"model":"m","messages":[{"content":"x"}]}`, "messages[0].role"},
		{"bad role", `{"model":"m","messages":[{"role":"wizard","content":"x"}]}`, "messages[0].role"},
		{"tool role without tool_call_id", `{"model":"m","messages":[{"role":"tool","content":"x"}]}`, "messages[0].tool_call_id"},
		{"no content", `{"model":"m","messages":[{"role":"user"}]}`, "messages[0].content"},
		{"numeric content", `{"model":"m","messages":[{"role":"user","content":5}]}`, "messages[0].content"},
		{"image part", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "messages[0].content[0].type"},
		{"part without text", `{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages[0].content[0].text"},
		{"max_tokens zero", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}`, "max_tokens"},
		{"max_tokens negative", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-1}`, "max_tokens"},
		{"max_tokens string", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"5"}`, "max_tokens"},
		{"max_tokens float", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5}`, "max_tokens"},
		{"max_tokens huge", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1e40}`, "max_tokens"},
		{"max_completion_tokens zero", `{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":0}`, "max_completion_tokens"},
		{"temperature high", `{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":2.5}`, "temperature"},
		{"temperature negative", `{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":-0.1}`, "temperature"},
		{"top_p zero", `{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":0}`, "top_p"},
		{"n two", `{"model":"m","messages":[{"role":"user","content":"x"}],"n":2}`, "n"},
		{"stop too many", `{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]}`, "stop"},
		{"stop empty", `{"model":"m","messages":[{"role":"user","content":"x"}],"stop":[""]}`, "stop"},
		{"stop number", `{"model":"m","messages":[{"role":"user","content":"x"}],"stop":7}`, "stop"},
		{"stream not bool", `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}`, "stream"},
		{"stream_options without stream", `{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`, "stream_options"},
		{"presence_penalty out of range", `{"model":"m","messages":[{"role":"user","content":"x"}],"presence_penalty":3}`, "presence_penalty"},
		{"frequency_penalty unsupported", `{"model":"m","messages":[{"role":"user","content":"x"}],"frequency_penalty":0.5}`, "frequency_penalty"},
		{"logprobs", `{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true}`, "logprobs"},
		{"tool without function", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}`, "tools[0].function.name"},
		{"json mode", `{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}`, "response_format"},
		{"logit_bias", `{"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"5":10}}`, "logit_bias"},
		{"seed not int", `{"model":"m","messages":[{"role":"user","content":"x"}],"seed":"s"}`, "seed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, e := DecodeChat([]byte(tc.body))
			if e == nil {
				t.Fatalf("accepted: %+v", g)
			}
			if e.Status != http.StatusBadRequest || e.Type != "invalid_request_error" || e.ErrorType != ErrorTypeInvalidRequest {
				t.Fatalf("error = %+v", e)
			}
			if e.Param != tc.param {
				t.Errorf("param = %q, want %q (message %q)", e.Param, tc.param, e.Message)
			}
		})
	}
}

func TestDecodeCompletion(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		prompt string
		tokens []int32
	}{
		{"string", `{"model":"m","prompt":"hi"}`, "hi", nil},
		{"one string in array", `{"model":"m","prompt":["hi"]}`, "hi", nil},
		{"tokens", `{"model":"m","prompt":[1,2,3]}`, "", []int32{1, 2, 3}},
		{"one token array", `{"model":"m","prompt":[[4,5]]}`, "", []int32{4, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, e := DecodeCompletion([]byte(tc.body))
			if e != nil {
				t.Fatal(e)
			}
			if g.Prompt != tc.prompt || !slices.Equal(g.PromptTokens, tc.tokens) || g.MaxTokens != 16 ||
				g.Operation != OperationTextCompletion {
				t.Errorf("generation = %+v", g)
			}
		})
	}
	for _, tc := range []struct{ name, body, param string }{
		{"no prompt", `{"model":"m"}`, "prompt"},
		{"null prompt", `{"model":"m","prompt":null}`, "prompt"},
		{"empty array", `{"model":"m","prompt":[]}`, "prompt"},
		{"batched", `{"model":"m","prompt":["a","b"]}`, "prompt"},
		{"negative token", `{"model":"m","prompt":[1,-2]}`, "prompt"},
		{"float token", `{"model":"m","prompt":[1.5]}`, "prompt"},
		{"object prompt", `{"model":"m","prompt":{"a":1}}`, "prompt"},
		{"best_of", `{"model":"m","prompt":"x","best_of":3}`, "best_of"},
		{"logprobs", `{"model":"m","prompt":"x","logprobs":2}`, "logprobs"},
		{"suffix", `{"model":"m","prompt":"x","suffix":"y"}`, "suffix"},
		{"max_tokens zero", `{"model":"m","prompt":"x","max_tokens":0}`, "max_tokens"},
		{"no model", `{"prompt":"x"}`, "model"},
		{"blank model", `{"model":"  ","prompt":"x"}`, "model"},
	} {
		t.Run("rejects "+tc.name, func(t *testing.T) {
			if _, e := DecodeCompletion([]byte(tc.body)); e == nil || e.Status != 400 || e.Param != tc.param {
				t.Fatalf("error = %+v, want 400 on %q", e, tc.param)
			}
		})
	}
}

func TestDecodeDocuments(t *testing.T) {
	d, e := DecodeDocuments([]byte(`{"documents":["alpha",{"id":"b","text":"beta"}]}`))
	if e != nil {
		t.Fatal(e)
	}
	if len(d.Docs) != 2 || d.Docs[0] != (DocumentInput{Text: "alpha"}) || d.Docs[1] != (DocumentInput{ID: "b", Text: "beta"}) {
		t.Errorf("docs = %+v", d.Docs)
	}
	many := `{"documents":[` + strings.Repeat(`"x",`, MaxDocuments) + `"x"]}`
	for _, tc := range []struct{ name, body string }{
		{"none", `{}`},
		{"empty", `{"documents":[]}`},
		{"empty text", `{"documents":[""]}`},
		{"number", `{"documents":[1]}`},
		{"object without text", `{"documents":[{"id":"a"}]}`},
		{"too many", many},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, e := DecodeDocuments([]byte(tc.body)); e == nil || e.Status != 400 {
				t.Fatalf("error = %v", e)
			}
		})
	}
}

func TestModelOf(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"x","messages":1}`: "x",
		`{"model":3}`:                "",
		`garbage`:                    "",
		`{}`:                         "",
	} {
		if got := ModelOf([]byte(body)); got != want {
			t.Errorf("ModelOf(%s) = %q, want %q", body, got, want)
		}
	}
}

func TestErrorShape(t *testing.T) {
	for _, e := range []*Error{
		BadRequest("max_tokens", "bad"), Unauthorized("no key"), ModelNotFound("x"), RouteNotFound("GET", "/x"),
		MethodNotAllowed("GET", "/v1/completions"), PayloadTooLarge(10), QueueFull(3), WorkerUnavailable("down"),
		Timeout("slow"), Internal("boom"),
	} {
		t.Run(e.ErrorType+"_"+e.Code, func(t *testing.T) {
			rec := httptest.NewRecorder()
			e.Write(rec)
			if rec.Code != e.Status {
				t.Fatalf("status %d, want %d", rec.Code, e.Status)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("content type %q", ct)
			}
			var body map[string]map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			obj := body["error"]
			for _, k := range []string{"message", "type", "param", "code"} {
				if _, ok := obj[k]; !ok {
					t.Errorf("error object lacks %q: %s", k, rec.Body)
				}
			}
			if obj["message"] != e.Message || obj["type"] != e.Type {
				t.Errorf("body %s", rec.Body)
			}
		})
	}
}

// FuzzDecode feeds arbitrary bodies to every decoder: they must never panic,
// and every rejection must be a 4xx OpenAI error; every acceptance a
// well-formed generation.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","prompt":[1,2,[3]]}`,
		`{"model":"m","prompt":[["a"]],"stop":["a",null]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"stream":true,"stream_options":{}}`,
		`{"documents":[{"text":"a","id":3}]}`,
		`{"model":"m","temperature":NaN}`,
		"{\"model\":\"\\ud800\"}",
		``, `{`, `[]`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(e *Error) {
			if e.Status < 400 || e.Status >= 500 || e.Message == "" || e.Type == "" || e.Code == "" {
				t.Fatalf("bad error %+v", e)
			}
		}
		if g, e := DecodeChat(body); e != nil {
			check(e)
		} else if g.Model == "" || len(g.Messages) == 0 || g.Operation != OperationChat || g.MaxTokens < 0 ||
			g.Temperature < 0 || g.Temperature > 2 || g.TopP <= 0 || g.TopP > 1 || len(g.Stop) > MaxStopSequences {
			t.Fatalf("accepted bad chat %+v", g)
		}
		if g, e := DecodeCompletion(body); e != nil {
			check(e)
		} else if g.Model == "" || (g.Prompt == "" && g.PromptTokens == nil && len(body) == 0) || g.MaxTokens < 1 {
			t.Fatalf("accepted bad completion %+v", g)
		}
		if d, e := DecodeDocuments(body); e != nil {
			check(e)
		} else if len(d.Docs) == 0 || len(d.Docs) > MaxDocuments {
			t.Fatalf("accepted bad documents %+v", d)
		}
		_ = ModelOf(body)
	})
}

func TestDecodeCacheBlendExtension(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		noReuse bool
	}{
		{"absent", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, false},
		{"reuse true", `{"model":"m","messages":[{"role":"user","content":"hi"}],"cacheblend":{"reuse":true}}`, false},
		{"reuse false", `{"model":"m","messages":[{"role":"user","content":"hi"}],"cacheblend":{"reuse":false}}`, true},
		{"empty object", `{"model":"m","messages":[{"role":"user","content":"hi"}],"cacheblend":{}}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, e := DecodeChat([]byte(tc.body))
			if e != nil {
				t.Fatal(e)
			}
			if g.NoReuse != tc.noReuse {
				t.Fatalf("NoReuse = %v, want %v", g.NoReuse, tc.noReuse)
			}
			c, e := DecodeCompletion([]byte(`{"model":"m","prompt":"hi","cacheblend":{"reuse":false}}`))
			if e != nil || !c.NoReuse {
				t.Fatalf("completion: %v %v", c, e)
			}
		})
	}
	if _, e := DecodeChat([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"cacheblend":{"reuse":"no"}}`)); e == nil {
		t.Fatal("a non-boolean reuse was accepted")
	}
}

func TestDecodeCacheBlendSettings(t *testing.T) {
	ratio := func(f float64) *float64 { return &f }
	tests := []struct {
		name  string
		ext   string
		want  BlendOptions
		param string // non-empty: rejected naming this parameter
	}{
		{"none", `{}`, BlendOptions{}, ""},
		{"ratio", `{"recompute_ratio":0.3}`, BlendOptions{RecomputeRatio: ratio(0.3)}, ""},
		{"ratio zero is full reuse", `{"recompute_ratio":0}`, BlendOptions{RecomputeRatio: ratio(0)}, ""},
		{"ratio one", `{"recompute_ratio":1}`, BlendOptions{RecomputeRatio: ratio(1)}, ""},
		{"random selection", `{"selection":"random"}`, BlendOptions{Selection: SelectionRandom}, ""},
		{"deviation selection", `{"selection":"deviation"}`, BlendOptions{Selection: SelectionDeviation}, ""},
		{"quality check", `{"quality_check":true}`, BlendOptions{QualityCheck: true}, ""},
		{"ratio above one", `{"recompute_ratio":1.5}`, BlendOptions{}, "cacheblend.recompute_ratio"},
		{"negative ratio", `{"recompute_ratio":-0.1}`, BlendOptions{}, "cacheblend.recompute_ratio"},
		{"unknown selection", `{"selection":"hkvd2"}`, BlendOptions{}, "cacheblend.selection"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, body := range []string{
				`{"model":"m","messages":[{"role":"user","content":"hi"}],"cacheblend":` + tc.ext + `}`,
				`{"model":"m","prompt":"hi","cacheblend":` + tc.ext + `}`,
			} {
				var g *Generation
				var e *Error
				if strings.Contains(body, "messages") {
					g, e = DecodeChat([]byte(body))
				} else {
					g, e = DecodeCompletion([]byte(body))
				}
				if tc.param != "" {
					if e == nil || e.Param != tc.param {
						t.Fatalf("%s: error %v, want one on %s", body, e, tc.param)
					}
					continue
				}
				if e != nil {
					t.Fatalf("%s: %v", body, e)
				}
				got := g.Blend
				if (got.RecomputeRatio == nil) != (tc.want.RecomputeRatio == nil) ||
					(got.RecomputeRatio != nil && *got.RecomputeRatio != *tc.want.RecomputeRatio) ||
					got.Selection != tc.want.Selection || got.QualityCheck != tc.want.QualityCheck {
					t.Fatalf("%s: Blend = %+v, want %+v", body, got, tc.want)
				}
			}
		})
	}
}
