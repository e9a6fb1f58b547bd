package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestEveryRejectionHasACode: every 4xx of the decoders names a parameter
// (where there is one) and carries an OpenAI code, never null.
func TestEveryRejectionHasACode(t *testing.T) {
	const msg = `"messages":[{"role":"user","content":"x"}]`
	chat := func(extra string) string { return `{"model":"m",` + msg + extra + `}` }
	many := `{"documents":[` + strings.Repeat(`"x",`, MaxDocuments) + `"x"]}`
	for _, tc := range []struct {
		name, decoder, body, param, code string
	}{
		{"empty body", "chat", ``, "", CodeInvalidJSON},
		{"not an object", "chat", `[1]`, "", CodeInvalidJSON},
		{"malformed", "chat", `{"model":`, "", CodeInvalidJSON},
		{"invalid UTF-8", "chat", "{\"model\":\"m\xff\"}", "", CodeInvalidJSON},
		{"missing model", "chat", `{` + msg + `}`, "model", CodeMissingRequiredParameter},
		{"model not a string", "chat", `{"model":3,` + msg + `}`, "model", CodeInvalidType},
		{"missing messages", "chat", `{"model":"m"}`, "messages", CodeMissingRequiredParameter},
		{"empty messages", "chat", `{"model":"m","messages":[]}`, "messages", CodeEmptyArray},
		{"no role", "chat", `{"model":"m","messages":[{"content":"x"}]}`, "messages[0].role", CodeMissingRequiredParameter},
		{"unknown role", "chat", `{"model":"m","messages":[{"role":"wizard","content":"x"}]}`, "messages[0].role", CodeInvalidValue},
		{"function role", "chat", `{"model":"m","messages":[{"role":"function","name":"f","content":"x"}]}`, "messages[0].role", CodeUnsupportedValue},
		{"no content", "chat", `{"model":"m","messages":[{"role":"user"}]}`, "messages[0].content", CodeMissingRequiredParameter},
		{"content a number", "chat", `{"model":"m","messages":[{"role":"user","content":5}]}`, "messages[0].content", CodeInvalidType},
		{"image_url part", "chat", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, "messages[0].content[1].type", CodeUnsupportedValue},
		{"input_audio part", "chat", `{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}`, "messages[0].content[0].type", CodeUnsupportedValue},
		{"unknown part", "chat", `{"model":"m","messages":[{"role":"user","content":[{"type":"video"}]}]}`, "messages[0].content[0].type", CodeInvalidValue},
		{"part without type", "chat", `{"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}]}`, "messages[0].content[0].type", CodeMissingRequiredParameter},
		{"tool message without call id", "chat", `{"model":"m","messages":[{"role":"tool","content":"r"}]}`, "messages[0].tool_call_id", CodeMissingRequiredParameter},
		{"tool_calls on a user message", "chat", `{"model":"m","messages":[{"role":"user","content":"x","tool_calls":[]}]}`, "messages[0].tool_calls", CodeUnsupportedParameter},
		{"tool_calls not an array", "chat", `{"model":"m","messages":[{"role":"assistant","tool_calls":{}}]}`, "messages[0].tool_calls", CodeInvalidType},
		{"custom tool call", "chat", `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"custom","custom":{}}]}]}`, "messages[0].tool_calls[0].type", CodeUnsupportedValue},
		{"tool call without name", "chat", `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"arguments":"{}"}}]}]}`, "messages[0].tool_calls[0].function.name", CodeMissingRequiredParameter},
		{"tool call arguments a number", "chat", `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":3}}]}]}`, "messages[0].tool_calls[0].function.arguments", CodeInvalidType},
		{"tools not an array", "chat", chat(`,"tools":{}`), "tools", CodeInvalidType},
		{"tool without type", "chat", chat(`,"tools":[{"function":{"name":"f"}}]`), "tools[0].type", CodeMissingRequiredParameter},
		{"custom tool", "chat", chat(`,"tools":[{"type":"custom","custom":{"name":"f"}}]`), "tools[0].type", CodeUnsupportedValue},
		{"tool_choice required", "chat", chat(`,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"`), "tool_choice", CodeUnsupportedValue},
		{"tool_choice named", "chat", chat(`,"tool_choice":{"type":"function","function":{"name":"f"}}`), "tool_choice", CodeUnsupportedValue},
		{"tool_choice unknown", "chat", chat(`,"tool_choice":"sometimes"`), "tool_choice", CodeInvalidValue},
		{"functions", "chat", chat(`,"functions":[{"name":"f"}]`), "functions", CodeUnsupportedParameter},
		{"function_call", "chat", chat(`,"function_call":"auto"`), "function_call", CodeUnsupportedParameter},
		{"stream_options without stream", "chat", chat(`,"stream_options":{"include_usage":true}`), "stream_options", CodeUnsupportedParameter},
		{"stream_options with stream false", "chat", chat(`,"stream":false,"stream_options":{}`), "stream_options", CodeUnsupportedParameter},
		{"stop a number", "chat", chat(`,"stop":7`), "stop", CodeInvalidType},
		{"stop empty", "chat", chat(`,"stop":[""]`), "stop", CodeInvalidValue},
		{"seed a string", "chat", chat(`,"seed":"s"`), "seed", CodeInvalidType},
		{"n=3", "chat", chat(`,"n":3`), "n", CodeUnsupportedValue},
		{"logprobs", "chat", chat(`,"logprobs":true`), "logprobs", CodeUnsupportedParameter},
		{"json mode", "chat", chat(`,"response_format":{"type":"json_object"}`), "response_format", CodeUnsupportedValue},
		{"recompute ratio", "chat", chat(`,"cacheblend":{"recompute_ratio":2}`), "cacheblend.recompute_ratio", CodeInvalidValue},
		{"no prompt", "completion", `{"model":"m"}`, "prompt", CodeMissingRequiredParameter},
		{"prompt a number", "completion", `{"model":"m","prompt":3}`, "prompt", CodeInvalidType},
		{"prompt empty array", "completion", `{"model":"m","prompt":[]}`, "prompt", CodeEmptyArray},
		{"batched prompts", "completion", `{"model":"m","prompt":["a","b"]}`, "prompt", CodeUnsupportedValue},
		{"negative token", "completion", `{"model":"m","prompt":[-1]}`, "prompt", CodeInvalidValue},
		{"best_of", "completion", `{"model":"m","prompt":"x","best_of":2}`, "best_of", CodeUnsupportedValue},
		{"suffix", "completion", `{"model":"m","prompt":"x","suffix":"y"}`, "suffix", CodeUnsupportedParameter},
		{"completion stream_options", "completion", `{"model":"m","prompt":"x","stream_options":{}}`, "stream_options", CodeUnsupportedParameter},
		{"no documents", "documents", `{}`, "documents", CodeMissingRequiredParameter},
		{"empty documents", "documents", `{"documents":[]}`, "documents", CodeEmptyArray},
		{"too many documents", "documents", many, "documents", CodeArrayAboveMaxLength},
		{"documents not an array", "documents", `{"documents":"x"}`, "documents", CodeInvalidType},
		{"empty document", "documents", `{"documents":[""]}`, "documents[0]", CodeInvalidValue},
		{"document a number", "documents", `{"documents":[1]}`, "documents[0]", CodeInvalidType},
		{"document without text", "documents", `{"documents":[{"id":"a"}]}`, "documents[0]", CodeInvalidType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e *Error
			switch tc.decoder {
			case "chat":
				_, e = DecodeChat([]byte(tc.body))
			case "completion":
				_, e = DecodeCompletion([]byte(tc.body))
			default:
				_, e = DecodeDocuments([]byte(tc.body))
			}
			if e == nil {
				t.Fatal("accepted")
			}
			if e.Status != http.StatusBadRequest || e.Param != tc.param || e.Code != tc.code {
				t.Fatalf("%d param %q code %q, want param %q code %q (%s)", e.Status, e.Param, e.Code, tc.param, tc.code, e.Message)
			}
			if b := e.Body(); b.Error.Code == nil || *b.Error.Code != tc.code {
				t.Fatalf("body code %v", b.Error.Code)
			}
		})
	}
}

// TestErrorBodiesNeverHaveNullCode: every error constructor, and an Error
// built without a code, writes a non-null code and an X-Request-Id (kept
// when the handler set one).
func TestErrorBodiesNeverHaveNullCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    *Error
		code string
	}{
		{"BadRequest", BadRequest("x", "bad"), CodeInvalidRequest},
		{"UnsupportedMediaType", UnsupportedMediaType("text/plain"), CodeUnsupportedMediaType},
		{"Unauthorized", Unauthorized("no"), "invalid_api_key"},
		{"ModelNotFound", ModelNotFound("x"), "model_not_found"},
		{"RouteNotFound", RouteNotFound("GET", "/x"), "not_found"},
		{"MethodNotAllowed", MethodNotAllowed("GET", "/x"), "method_not_allowed"},
		{"PayloadTooLarge", PayloadTooLarge(1), "request_too_large"},
		{"RequestTimeout", RequestTimeout(1), "request_timeout"},
		{"QueueFull", QueueFull(1), "queue_full"},
		{"WorkerUnavailable", WorkerUnavailable("x"), "worker_unavailable"},
		{"Timeout", Timeout("x"), "timeout"},
		{"Internal", Internal("x"), "internal_error"},
		{"4xx without a code", &Error{Status: 409, Type: "invalid_request_error", Message: "m"}, CodeInvalidRequest},
		{"5xx without a code", &Error{Status: 502, Type: "server_error", Message: "m"}, CodeServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tc.e.Write(rec)
			var body struct {
				Error struct {
					Code *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if body.Error.Code == nil || *body.Error.Code != tc.code {
				t.Fatalf("code %v, want %s: %s", body.Error.Code, tc.code, rec.Body)
			}
			if id := rec.Header().Get(HeaderRequestID); !strings.HasPrefix(id, "req-") || len(id) != 28 {
				t.Fatalf("request id %q", id)
			}
			rec = httptest.NewRecorder()
			rec.Header().Set(HeaderRequestID, "chatcmpl-1")
			tc.e.Write(rec)
			if id := rec.Header().Get(HeaderRequestID); id != "chatcmpl-1" {
				t.Fatalf("request id %q replaced the handler's", id)
			}
		})
	}
}

func TestFingerprint(t *testing.T) {
	a := Fingerprint("m", "", "build")
	if !strings.HasPrefix(a, "fp_") || len(a) != 13 || a != Fingerprint("m", "", "build") {
		t.Fatalf("fingerprint %q", a)
	}
	for _, other := range [][]string{{"m", "", "build2"}, {"m2", "", "build"}, {"m", "id", "build"}, {"m", "build", ""}} {
		if Fingerprint(other...) == a {
			t.Fatalf("%v has the fingerprint of m/build", other)
		}
	}
}

// TestToolHistoryDecoded: tool messages and assistant tool calls are
// accepted; a JSON-string arguments object is decoded for the template,
// other strings kept; tools and tool_choice auto pass.
func TestToolHistoryDecoded(t *testing.T) {
	body := `{"model":"m","tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"tool_choice":"auto","parallel_tool_calls":true,
		"messages":[{"role":"user","content":"Weather?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"a\": 1}"}},
			{"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"not json"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"21C"},
		{"role":"tool","tool_call_id":"call_2","name":"get_weather","content":[{"type":"text","text":"?"}]}]}`
	g, e := DecodeChat([]byte(body))
	if e != nil {
		t.Fatal(e)
	}
	wantCalls := `[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris","a":1}}},` +
		`{"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"not json"}}]`
	want := []Message{{Role: "user", Content: "Weather?"}, {Role: "assistant", ToolCalls: wantCalls},
		{Role: "tool", Content: "21C", ToolCallID: "call_1"}, {Role: "tool", Content: "?", ToolCallID: "call_2", Name: "get_weather"}}
	for i := range want {
		if g.Messages[i] != want[i] {
			t.Fatalf("message %d = %+v\nwant %+v", i, g.Messages[i], want[i])
		}
	}
	if string(g.Tools) != `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]` {
		t.Fatalf("tools %s", g.Tools)
	}
	cm := ChatMessages(g.Messages)
	if string(cm[1].ToolCalls) != wantCalls || cm[2].ToolCallID != "call_1" || cm[3].Name != "get_weather" {
		t.Fatalf("chat messages %+v", cm)
	}
	p := ChatPromptTools(g.Messages, g.Tools)
	if !strings.HasPrefix(p, "<|tools|>\n"+string(g.Tools)+"\n<|user|>\nWeather?\n<|assistant|>\n\n<|tool_calls|>\n"+wantCalls+"\n<|tool|>\n21C\n") {
		t.Fatalf("prompt %q", p)
	}
	if ChatPrompt(g.Messages[:1]) != "<|user|>\nWeather?\n<|assistant|>\n" {
		t.Fatalf("a plain conversation renders as before: %q", ChatPrompt(g.Messages[:1]))
	}
	// tool_choice none with tools, and an empty tools list, are accepted.
	for _, extra := range []string{`,"tools":[],"tool_choice":"none"`, `,"tools":null`} {
		if _, e := DecodeChat([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}]` + extra + `}`)); e != nil {
			t.Fatalf("%s: %v", extra, e)
		}
	}
}
