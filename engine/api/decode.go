package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/cacheblend/cacheblend/chat"
	"math"
	"strings"
	"unicode/utf8"
)

// Limits of the decoder.
const (
	// MaxStopSequences is the most stop sequences a request may give.
	MaxStopSequences = 4
	// MaxDocuments is the most documents one POST /v1/documents may ingest.
	MaxDocuments = 64
	// MaxMessages is the most chat messages one request may carry.
	MaxMessages = 1024
)

// Generation is a decoded, validated generation request, normalized over
// the chat and completion APIs.
type Generation struct {
	// Operation is OperationChat or OperationTextCompletion.
	Operation string
	// Model is the requested model name (checked by the caller).
	Model string
	// Messages are the chat messages (chat only).
	Messages []Message
	// Prompt is the completion prompt text (completions with a string
	// prompt).
	Prompt string
	// PromptTokens is the completion prompt as token ids (completions with a
	// token-array prompt); nil otherwise.
	PromptTokens []int32
	// MaxTokens is the output token limit; 0 means the server's default.
	MaxTokens int
	// MaxTokensParam names the body field MaxTokens came from
	// ("max_tokens" or "max_completion_tokens"), for errors about it; ""
	// when the client sent neither (MaxTokens is then a default that the
	// engine may lower to fit the context).
	MaxTokensParam string
	// Temperature (default 1) and TopP (default 1) are the sampling
	// parameters.
	Temperature, TopP float64
	// Seed is the sampling seed, or nil.
	Seed *int64
	// Stop are the stop sequences (at most MaxStopSequences, non-empty).
	Stop []string
	// Stream asks for server-sent events; IncludeUsage for the final usage
	// chunk.
	Stream, IncludeUsage bool
	// IgnoreEOS keeps generating past the end-of-sequence token (vLLM
	// extension).
	IgnoreEOS bool
	// Echo prepends the prompt to the completion text (completions only).
	Echo bool
	// NoReuse asks for a full prefill without any KV reuse (extension:
	// "cacheblend": {"reuse": false}); the baseline of a reuse measurement.
	NoReuse bool
	// Blend holds the request's CacheBlend settings (the rest of the
	// "cacheblend" extension); the zero value takes the engine's.
	Blend BlendOptions
	// Tools is the chat request's "tools" list (compact JSON, each a
	// {"type": "function", "function": {...}}), nil when absent or empty:
	// given to the chat template as its tools variable. The output is not
	// parsed for tool calls (it is the assistant's content).
	Tools json.RawMessage
}

// BlendOptions are a request's CacheBlend settings: the "cacheblend"
// extension's "recompute_ratio", "selection" and "quality_check" (cb eval
// sets them to measure one ratio and rule through the real stack).
type BlendOptions struct {
	// RecomputeRatio is the share of reused tokens the check layer
	// recomputes, in [0, 1] (0 reuses without recompute); nil takes the
	// engine's (cb engine --recomp-ratio).
	RecomputeRatio *float64
	// Selection is the rule that picks them: SelectionDeviation (the
	// default, CacheBlend's check-layer KV deviation) or SelectionRandom.
	Selection string
	// QualityCheck asks the worker to compare the request with a full
	// prefill online (cb.quality), whatever its sample rate.
	QualityCheck bool
}

// The values of BlendOptions.Selection ("cacheblend": {"selection": …}).
const (
	SelectionDeviation = "deviation"
	SelectionRandom    = "random"
)

// rawCommon holds the wire fields the chat and completion APIs share.
// Pointer fields distinguish absent (or null) from zero.
type rawCommon struct {
	Model            *string          `json:"model"`
	MaxTokens        *int             `json:"max_tokens"`
	Temperature      *float64         `json:"temperature"`
	TopP             *float64         `json:"top_p"`
	N                *int             `json:"n"`
	Stream           *bool            `json:"stream"`
	StreamOptions    *rawStreamOpts   `json:"stream_options"`
	Stop             stopList         `json:"stop"`
	Seed             *int64           `json:"seed"`
	PresencePenalty  *float64         `json:"presence_penalty"`
	FrequencyPenalty *float64         `json:"frequency_penalty"`
	LogitBias        map[string]int64 `json:"logit_bias"`
	IgnoreEOS        *bool            `json:"ignore_eos"`
	User             *string          `json:"user"`
	CacheBlend       *rawCacheBlend   `json:"cacheblend"`
}

// extensions sets the options of g from the vLLM and cacheblend
// extensions.
func (r *rawCommon) extensions(g *Generation) *Error {
	g.IgnoreEOS = r.IgnoreEOS != nil && *r.IgnoreEOS
	cb := r.CacheBlend
	if cb == nil {
		return nil
	}
	g.NoReuse = cb.Reuse != nil && !*cb.Reuse
	if q := cb.RecomputeRatio; q != nil {
		if math.IsNaN(*q) || *q < 0 || *q > 1 {
			return BadRequestCode("cacheblend.recompute_ratio", CodeInvalidValue, "cacheblend.recompute_ratio must be between 0 and 1.")
		}
		g.Blend.RecomputeRatio = q
	}
	if sel := cb.Selection; sel != nil {
		switch *sel {
		case SelectionDeviation, SelectionRandom:
			g.Blend.Selection = *sel
		default:
			return BadRequestCode("cacheblend.selection", CodeInvalidValue, "cacheblend.selection must be %q or %q.", SelectionDeviation, SelectionRandom)
		}
	}
	g.Blend.QualityCheck = cb.QualityCheck != nil && *cb.QualityCheck
	return nil
}

// rawCacheBlend is the "cacheblend" extension object of a request.
type rawCacheBlend struct {
	Reuse          *bool    `json:"reuse"`
	RecomputeRatio *float64 `json:"recompute_ratio"`
	Selection      *string  `json:"selection"`
	QualityCheck   *bool    `json:"quality_check"`
}

// Message is one chat message with its content flattened to text. It is
// comparable (ToolCalls is JSON text, not a slice).
type Message struct {
	Role    string
	Content string
	// Name is the message's "name" (a participant's or a tool's), or "".
	Name string
	// ToolCallID is a "tool" message's tool_call_id: the call it answers.
	ToolCallID string
	// ToolCalls is an assistant message's tool_calls as compact JSON, ""
	// when it has none: a list of {"id", "type": "function", "function":
	// {"name", "arguments"}} whose arguments, sent by OpenAI clients as a
	// JSON string, are the decoded JSON object when that string holds one
	// (what chat templates expect, as in transformers and vLLM).
	ToolCalls string
}

// rawChat is the wire form of a chat completion request. Pointer fields
// distinguish absent (or null) from zero.
type rawChat struct {
	rawCommon
	Messages            []rawMessage    `json:"messages"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            *bool           `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	Functions           json.RawMessage `json:"functions"`
	FunctionCall        json.RawMessage `json:"function_call"`
	ResponseFormat      *rawRespFormat  `json:"response_format"`
}

type rawStreamOpts struct {
	IncludeUsage *bool `json:"include_usage"`
}

type rawRespFormat struct {
	Type string `json:"type"`
}

type rawMessage struct {
	Role       *string         `json:"role"`
	Content    messageContent  `json:"content"`
	Name       *string         `json:"name"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID *string         `json:"tool_call_id"`
}

// messageContent is a string, an array of content parts, or null.
type messageContent struct {
	text string
	set  bool
	bad  *contentError // why the content is not acceptable
}

// contentError is what is wrong with a message's content: the code, the
// parameter below the content ("" or "[j].type" ...) and the message.
type contentError struct {
	code, sub, msg string
}

// Content part types of OpenAI's chat API that this server cannot take
// (no vision or audio model): refused as unsupported_value.
var unsupportedParts = map[string]bool{"image_url": true, "input_audio": true, "file": true, "image": true, "audio": true}

func (c *messageContent) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		return nil
	case len(b) > 0 && b[0] == '"':
		c.set = true
		return json.Unmarshal(b, &c.text)
	case len(b) > 0 && b[0] == '[':
		var parts []struct {
			Type *string `json:"type"`
			Text *string `json:"text"`
		}
		if json.Unmarshal(b, &parts) != nil {
			c.bad = &contentError{CodeInvalidType, "", "content must be a string, an array of text parts, or null"}
			return nil
		}
		c.set = true
		var sb strings.Builder
		for i, p := range parts {
			switch {
			case p.Type == nil:
				c.bad = &contentError{CodeMissingRequiredParameter, fmt.Sprintf("[%d].type", i), fmt.Sprintf("content part %d has no type", i)}
			case unsupportedParts[*p.Type]:
				c.bad = &contentError{CodeUnsupportedValue, fmt.Sprintf("[%d].type", i),
					fmt.Sprintf("content part type %q is not supported by this server (it serves a text-only model; send text parts)", *p.Type)}
			case *p.Type != "text":
				c.bad = &contentError{CodeInvalidValue, fmt.Sprintf("[%d].type", i), fmt.Sprintf("content part type %q is not known (text is supported)", *p.Type)}
			case p.Text == nil:
				c.bad = &contentError{CodeMissingRequiredParameter, fmt.Sprintf("[%d].text", i), fmt.Sprintf("text content part %d has no text", i)}
			default:
				sb.WriteString(*p.Text)
				continue
			}
			return nil
		}
		c.text = sb.String()
		return nil
	}
	c.bad = &contentError{CodeInvalidType, "", "content must be a string, an array of text parts, or null"}
	return nil
}

// stopList is a string, an array of strings, or null.
type stopList struct {
	vals []string
	bad  bool
}

func (s *stopList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		return nil
	case len(b) > 0 && b[0] == '"':
		var v string
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		s.vals = []string{v}
		return nil
	}
	if json.Unmarshal(b, &s.vals) != nil {
		s.vals, s.bad = nil, true
	}
	return nil
}

// rawCompletion is the wire form of a text completion request.
type rawCompletion struct {
	rawCommon
	Prompt   json.RawMessage `json:"prompt"`
	BestOf   *int            `json:"best_of"`
	Logprobs *int            `json:"logprobs"`
	Echo     *bool           `json:"echo"`
	Suffix   *string         `json:"suffix"`
}

// ModelOf extracts the "model" string of a JSON request body without
// validating anything else; "" when absent or not a string. It lets the
// caller label metrics and check the model before full validation.
func ModelOf(body []byte) string {
	var m struct {
		Model json.RawMessage `json:"model"`
	}
	if json.Unmarshal(body, &m) != nil {
		return ""
	}
	var s string
	if json.Unmarshal(m.Model, &s) != nil {
		return ""
	}
	return s
}

// unmarshal decodes body into v, turning decoder errors into 400s that name
// the parameter.
func unmarshal(body []byte, v any) *Error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return BadRequestCode("", CodeInvalidJSON, "The request body is empty; expected a JSON object.")
	}
	if body[0] != '{' {
		return BadRequestCode("", CodeInvalidJSON, "The request body must be a JSON object.")
	}
	if !utf8.Valid(body) {
		return BadRequestCode("", CodeInvalidJSON, "The request body is not valid UTF-8.")
	}
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return BadRequestCode("", CodeInvalidJSON, "Malformed JSON at byte %d: %v.", syn.Offset, syn)
	case errors.As(err, &typ):
		// encoding/json names a field of the embedded rawCommon with the
		// Go type as a path element; the parameter is the JSON name alone.
		field := strings.TrimPrefix(typ.Field, "rawCommon.")
		if field == "" {
			return BadRequestCode("", CodeInvalidType, "Invalid type in the request body: %v.", err)
		}
		return BadRequestCode(field, CodeInvalidType, "Invalid type for '%s': got %s.", field, typ.Value)
	default:
		return BadRequestCode("", CodeInvalidJSON, "Malformed JSON: %v.", err)
	}
}

func checkModel(m *string) *Error {
	if m == nil || strings.TrimSpace(*m) == "" {
		return BadRequestCode("model", CodeMissingRequiredParameter, "You must provide a model parameter.")
	}
	return nil
}

// sampling validates the shared sampling parameters into g.
func sampling(g *Generation, r *rawCommon) *Error {
	temp, topP, n, stop := r.Temperature, r.TopP, r.N, r.Stop
	g.Temperature, g.TopP = 1, 1
	if temp != nil {
		if math.IsNaN(*temp) || *temp < 0 || *temp > 2 {
			return BadRequestCode("temperature", rangeCode(*temp, 0), "temperature must be between 0 and 2, got %v.", *temp)
		}
		g.Temperature = *temp
	}
	if topP != nil {
		if math.IsNaN(*topP) || *topP <= 0 || *topP > 1 {
			return BadRequestCode("top_p", rangeCode(*topP, math.SmallestNonzeroFloat64), "top_p must be in (0, 1], got %v.", *topP)
		}
		g.TopP = *topP
	}
	if n != nil && *n != 1 {
		return BadRequestCode("n", CodeUnsupportedValue, "Only n=1 is supported, got %d.", *n)
	}
	if stop.bad {
		return BadRequestCode("stop", CodeInvalidType, "stop must be a string, an array of strings, or null.")
	}
	if len(stop.vals) > MaxStopSequences {
		return BadRequestCode("stop", CodeArrayAboveMaxLength, "At most %d stop sequences are allowed, got %d.", MaxStopSequences, len(stop.vals))
	}
	for _, s := range stop.vals {
		if s == "" {
			return BadRequestCode("stop", CodeInvalidValue, "Stop sequences must not be empty.")
		}
	}
	g.Stop = stop.vals
	g.Seed = r.Seed
	for _, p := range []struct {
		name string
		v    *float64
	}{{"presence_penalty", r.PresencePenalty}, {"frequency_penalty", r.FrequencyPenalty}} {
		if p.v == nil {
			continue
		}
		if math.IsNaN(*p.v) || *p.v < -2 || *p.v > 2 {
			return BadRequestCode(p.name, rangeCode(*p.v, -2), "%s must be between -2 and 2, got %v.", p.name, *p.v)
		}
		if *p.v != 0 {
			return BadRequestCode(p.name, CodeUnsupportedValue, "%s is not supported by this server; omit it or set it to 0.", p.name)
		}
	}
	if len(r.LogitBias) > 0 {
		return BadRequestCode("logit_bias", CodeUnsupportedParameter, "logit_bias is not supported by this server.")
	}
	return nil
}

func streaming(g *Generation, stream *bool, opts *rawStreamOpts) *Error {
	g.Stream = stream != nil && *stream
	if opts != nil {
		if !g.Stream {
			// OpenAI's 400 (its code is null there); unsupported_parameter
			// tells a client to drop the parameter.
			return BadRequestCode("stream_options", CodeUnsupportedParameter, "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
		}
		g.IncludeUsage = opts.IncludeUsage != nil && *opts.IncludeUsage
	}
	return nil
}

func maxTokens(param string, v *int) (int, *Error) {
	if v == nil {
		return 0, nil
	}
	if *v < 1 {
		return 0, BadRequestCode(param, CodeIntegerBelowMin, "%s must be at least 1, got %d.", param, *v)
	}
	return *v, nil
}

// Chat roles accepted in messages.
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// DecodeChat decodes and validates the body of POST /v1/chat/completions.
// Every problem is a 400 *Error naming the parameter.
func DecodeChat(body []byte) (*Generation, *Error) {
	var r rawChat
	if e := unmarshal(body, &r); e != nil {
		return nil, e
	}
	if e := checkModel(r.Model); e != nil {
		return nil, e
	}
	g := &Generation{Operation: OperationChat, Model: *r.Model}
	if r.Messages == nil {
		return nil, BadRequestCode("messages", CodeMissingRequiredParameter, "You must provide messages: a non-empty array.")
	}
	if len(r.Messages) == 0 {
		return nil, BadRequestCode("messages", CodeEmptyArray, "messages must be a non-empty array.")
	}
	if len(r.Messages) > MaxMessages {
		return nil, BadRequestCode("messages", CodeArrayAboveMaxLength, "At most %d messages are allowed, got %d.", MaxMessages, len(r.Messages))
	}
	g.Messages = make([]Message, 0, len(r.Messages))
	for i, m := range r.Messages {
		msg, e := decodeMessage(i, &m)
		if e != nil {
			return nil, e
		}
		g.Messages = append(g.Messages, msg)
	}
	var e *Error
	if g.MaxTokens, e = maxTokens("max_tokens", r.MaxTokens); e != nil {
		return nil, e
	}
	if r.MaxTokens != nil {
		g.MaxTokensParam = "max_tokens"
	}
	if r.MaxCompletionTokens != nil { // the newer name wins
		if g.MaxTokens, e = maxTokens("max_completion_tokens", r.MaxCompletionTokens); e != nil {
			return nil, e
		}
		g.MaxTokensParam = "max_completion_tokens"
	}
	if e := sampling(g, &r.rawCommon); e != nil {
		return nil, e
	}
	if e := streaming(g, r.Stream, r.StreamOptions); e != nil {
		return nil, e
	}
	if r.Logprobs != nil && *r.Logprobs {
		return nil, BadRequestCode("logprobs", CodeUnsupportedParameter, "logprobs are not supported by this server.")
	}
	if r.TopLogprobs != nil {
		return nil, BadRequestCode("top_logprobs", CodeUnsupportedParameter, "top_logprobs is not supported by this server.")
	}
	if g.Tools, e = decodeTools(r.Tools, r.ToolChoice); e != nil {
		return nil, e
	}
	if nonEmptyJSON(r.Functions) {
		return nil, BadRequestCode("functions", CodeUnsupportedParameter, "The deprecated 'functions' parameter is not supported by this server; send 'tools'.")
	}
	if nonNull(r.FunctionCall) {
		return nil, BadRequestCode("function_call", CodeUnsupportedParameter, "The deprecated 'function_call' parameter is not supported by this server; send 'tool_choice'.")
	}
	if r.ResponseFormat != nil && r.ResponseFormat.Type != "text" {
		return nil, BadRequestCode("response_format", CodeUnsupportedValue, "response_format %q is not supported (only text).", r.ResponseFormat.Type)
	}
	if e := r.extensions(g); e != nil {
		return nil, e
	}
	return g, nil
}

// decodeMessage validates messages[i] into a Message.
func decodeMessage(i int, m *rawMessage) (Message, *Error) {
	param := fmt.Sprintf("messages[%d]", i)
	if m.Role == nil {
		return Message{}, BadRequestCode(param+".role", CodeMissingRequiredParameter, "Message %d has no role.", i)
	}
	role := *m.Role
	if role == "function" {
		return Message{}, BadRequestCode(param+".role", CodeUnsupportedValue, "Role \"function\" (deprecated) is not supported; send tool calls and role \"tool\" messages.")
	}
	if !chatRoles[role] {
		return Message{}, BadRequestCode(param+".role", CodeInvalidValue, "Role %q is not supported (system, developer, user, assistant, tool).", role)
	}
	if c := m.Content.bad; c != nil {
		return Message{}, BadRequestCode(param+".content"+c.sub, c.code, "%s.", c.msg)
	}
	out := Message{Role: role, Content: m.Content.text}
	if m.Name != nil {
		out.Name = *m.Name
	}
	if nonNull(m.ToolCalls) {
		if role != "assistant" {
			return Message{}, BadRequestCode(param+".tool_calls", CodeUnsupportedParameter, "Only assistant messages may have tool_calls (message %d is %s).", i, role)
		}
		calls, e := decodeToolCalls(param+".tool_calls", m.ToolCalls)
		if e != nil {
			return Message{}, e
		}
		out.ToolCalls = calls
	}
	if role == "tool" {
		if m.ToolCallID == nil || *m.ToolCallID == "" {
			return Message{}, BadRequestCode(param+".tool_call_id", CodeMissingRequiredParameter, "A tool message must name the call it answers in tool_call_id.")
		}
		out.ToolCallID = *m.ToolCallID
	}
	if !m.Content.set && role != "assistant" {
		return Message{}, BadRequestCode(param+".content", CodeMissingRequiredParameter, "Message %d has no content.", i)
	}
	return out, nil
}

// rawToolCall is one entry of an assistant message's tool_calls.
type rawToolCall struct {
	ID       *string `json:"id"`
	Type     *string `json:"type"`
	Function *struct {
		Name      *string         `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// toolCallOut is a tool call as the chat template gets it.
type toolCallOut struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// decodeToolCalls validates an assistant message's tool_calls (an array of
// function calls whose arguments are a JSON string, or already an object)
// and returns them as compact JSON with each arguments string that holds a
// JSON object decoded into it; "" for an empty array.
func decodeToolCalls(param string, raw json.RawMessage) (string, *Error) {
	var calls []rawToolCall
	if err := json.Unmarshal(raw, &calls); err != nil {
		return "", BadRequestCode(param, CodeInvalidType, "tool_calls must be an array of tool call objects.")
	}
	if len(calls) == 0 {
		return "", nil
	}
	out := make([]toolCallOut, len(calls))
	for j, c := range calls {
		p := fmt.Sprintf("%s[%d]", param, j)
		if c.Type != nil && *c.Type != "function" {
			return "", BadRequestCode(p+".type", CodeUnsupportedValue, "Tool call type %q is not supported (only function).", *c.Type)
		}
		if c.Function == nil || c.Function.Name == nil || *c.Function.Name == "" {
			return "", BadRequestCode(p+".function.name", CodeMissingRequiredParameter, "Tool call %d has no function name.", j)
		}
		args, e := toolArguments(p+".function.arguments", c.Function.Arguments)
		if e != nil {
			return "", e
		}
		out[j] = toolCallOut{Type: "function", Function: toolFunction{Name: *c.Function.Name, Arguments: args}}
		if c.ID != nil {
			out[j].ID = *c.ID
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return "", BadRequestCode(param, CodeInvalidValue, "tool_calls cannot be encoded: %v.", err)
	}
	return string(b), nil
}

// toolArguments is a tool call's arguments for the template: the JSON
// object a JSON-string argument holds (compacted, key order kept), else the
// string itself; an object given directly is kept; absent or null is {}.
func toolArguments(param string, raw json.RawMessage) (json.RawMessage, *Error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return json.RawMessage("{}"), nil
	}
	var buf bytes.Buffer
	switch t[0] {
	case '{':
		if err := json.Compact(&buf, t); err != nil {
			return nil, BadRequestCode(param, CodeInvalidType, "arguments must be a JSON string.")
		}
		return buf.Bytes(), nil
	case '"':
		var str string
		if json.Unmarshal(t, &str) != nil {
			return nil, BadRequestCode(param, CodeInvalidType, "arguments must be a JSON string.")
		}
		if s := strings.TrimSpace(str); len(s) > 0 && s[0] == '{' && json.Compact(&buf, []byte(s)) == nil {
			return buf.Bytes(), nil
		}
		return t, nil // not an object: the template gets the string
	}
	return nil, BadRequestCode(param, CodeInvalidType, "arguments must be a JSON string.")
}

// decodeTools validates the chat request's tools and tool_choice: tools are
// function definitions, given to the chat template; tool_choice may be
// "none" or "auto" (the model is free to answer), since forcing a call
// ("required" or a named function) needs the output parsed into tool
// calls, which this server does not do. It returns the tools as compact
// JSON, nil when absent or empty.
func decodeTools(raw, choice json.RawMessage) (json.RawMessage, *Error) {
	if nonNull(choice) {
		var s string
		switch err := json.Unmarshal(choice, &s); {
		case err != nil:
			return nil, BadRequestCode("tool_choice", CodeUnsupportedValue,
				"tool_choice naming a function is not supported: this server does not parse the output into tool calls, so it cannot force one (use \"auto\" or \"none\").")
		case s == "required":
			return nil, BadRequestCode("tool_choice", CodeUnsupportedValue,
				"tool_choice \"required\" is not supported: this server does not parse the output into tool calls, so it cannot force one (use \"auto\" or \"none\").")
		case s != "auto" && s != "none":
			return nil, BadRequestCode("tool_choice", CodeInvalidValue, "tool_choice must be \"none\", \"auto\", \"required\" or a function, got %q.", s)
		}
	}
	if !nonNull(raw) {
		return nil, nil
	}
	var tools []struct {
		Type     *string `json:"type"`
		Function *struct {
			Name *string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &tools) != nil {
		return nil, BadRequestCode("tools", CodeInvalidType, "tools must be an array of tool objects.")
	}
	if len(tools) == 0 {
		return nil, nil
	}
	for j, tl := range tools {
		p := fmt.Sprintf("tools[%d]", j)
		if tl.Type == nil {
			return nil, BadRequestCode(p+".type", CodeMissingRequiredParameter, "Tool %d has no type.", j)
		}
		if *tl.Type != "function" {
			return nil, BadRequestCode(p+".type", CodeUnsupportedValue, "Tool type %q is not supported (only function).", *tl.Type)
		}
		if tl.Function == nil || tl.Function.Name == nil || *tl.Function.Name == "" {
			return nil, BadRequestCode(p+".function.name", CodeMissingRequiredParameter, "Tool %d has no function name.", j)
		}
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, BadRequestCode("tools", CodeInvalidType, "tools must be an array of tool objects.")
	}
	return buf.Bytes(), nil
}

// nonNull reports whether raw is present and not null.
func nonNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

// nonEmptyJSON reports whether raw is present and neither null nor [].
func nonEmptyJSON(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return false
	}
	var arr []json.RawMessage
	if json.Unmarshal(t, &arr) == nil && len(arr) == 0 {
		return false
	}
	return true
}

// DecodeCompletion decodes and validates the body of POST /v1/completions.
// The prompt is a string, a token array, or a one-element array of either;
// batched prompts are refused. Token ids are range-checked by the caller.
func DecodeCompletion(body []byte) (*Generation, *Error) {
	var r rawCompletion
	if e := unmarshal(body, &r); e != nil {
		return nil, e
	}
	if e := checkModel(r.Model); e != nil {
		return nil, e
	}
	g := &Generation{Operation: OperationTextCompletion, Model: *r.Model}
	if e := decodePrompt(g, r.Prompt); e != nil {
		return nil, e
	}
	var e *Error
	if g.MaxTokens, e = maxTokens("max_tokens", r.MaxTokens); e != nil {
		return nil, e
	}
	if r.MaxTokens != nil {
		g.MaxTokensParam = "max_tokens"
	}
	if g.MaxTokens == 0 {
		g.MaxTokens = 16 // the OpenAI default of the completions API
	}
	if e := sampling(g, &r.rawCommon); e != nil {
		return nil, e
	}
	if r.BestOf != nil && *r.BestOf != 1 {
		return nil, BadRequestCode("best_of", CodeUnsupportedValue, "Only best_of=1 is supported, got %d.", *r.BestOf)
	}
	if e := streaming(g, r.Stream, r.StreamOptions); e != nil {
		return nil, e
	}
	if r.Logprobs != nil {
		return nil, BadRequestCode("logprobs", CodeUnsupportedParameter, "logprobs are not supported by this server.")
	}
	if r.Suffix != nil && *r.Suffix != "" {
		return nil, BadRequestCode("suffix", CodeUnsupportedParameter, "suffix is not supported by this server.")
	}
	g.Echo = r.Echo != nil && *r.Echo
	if e := r.extensions(g); e != nil {
		return nil, e
	}
	return g, nil
}

func decodePrompt(g *Generation, raw json.RawMessage) *Error {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return BadRequestCode("prompt", CodeMissingRequiredParameter, "You must provide a prompt.")
	}
	if t[0] == '"' {
		if json.Unmarshal(t, &g.Prompt) != nil {
			return BadRequestCode("prompt", CodeInvalidType, "prompt must be a string, an array of token ids, or a one-element array of either.")
		}
		return nil
	}
	if t[0] != '[' {
		return BadRequestCode("prompt", CodeInvalidType, "prompt must be a string, an array of token ids, or a one-element array of either.")
	}
	var items []json.RawMessage
	if json.Unmarshal(t, &items) != nil {
		return BadRequestCode("prompt", CodeInvalidType, "prompt must be a string, an array of token ids, or a one-element array of either.")
	}
	if len(items) == 0 {
		return BadRequestCode("prompt", CodeEmptyArray, "prompt must not be empty.")
	}
	first := bytes.TrimSpace(items[0])
	if len(first) > 0 && (first[0] == '"' || first[0] == '[') {
		if len(items) != 1 {
			return BadRequestCode("prompt", CodeUnsupportedValue, "Batched prompts are not supported; send one prompt per request (got %d).", len(items))
		}
		return decodePrompt(g, first)
	}
	toks := make([]int32, len(items))
	for i, it := range items {
		var v int64
		if json.Unmarshal(it, &v) != nil || v < 0 || v > math.MaxInt32 {
			return BadRequestCode("prompt", CodeInvalidValue, "Token %d of the prompt is not a non-negative integer token id.", i)
		}
		toks[i] = int32(v)
	}
	g.PromptTokens = toks
	return nil
}

// DocumentInput is one document of POST /v1/documents.
type DocumentInput struct {
	// ID is the caller's name for the document, or "" (the server assigns one).
	ID string
	// Text is the document text (non-empty).
	Text string
}

// Documents is a decoded POST /v1/documents request.
type Documents struct {
	// Model is the requested model, or "" for the server's.
	Model string
	// Docs are the documents (1..MaxDocuments).
	Docs []DocumentInput
}

// DecodeDocuments decodes and validates the body of POST /v1/documents:
// {"model"?: string, "documents": [string | {"id"?: string, "text": string}, ...]}.
func DecodeDocuments(body []byte) (*Documents, *Error) {
	var r struct {
		Model     *string           `json:"model"`
		Documents []json.RawMessage `json:"documents"`
	}
	if e := unmarshal(body, &r); e != nil {
		return nil, e
	}
	d := &Documents{}
	if r.Model != nil {
		d.Model = *r.Model
	}
	if len(r.Documents) == 0 {
		if r.Documents == nil {
			return nil, BadRequestCode("documents", CodeMissingRequiredParameter, "You must provide documents: a non-empty array.")
		}
		return nil, BadRequestCode("documents", CodeEmptyArray, "documents must be a non-empty array.")
	}
	if len(r.Documents) > MaxDocuments {
		return nil, BadRequestCode("documents", CodeArrayAboveMaxLength, "At most %d documents per request, got %d.", MaxDocuments, len(r.Documents))
	}
	for i, raw := range r.Documents {
		param := fmt.Sprintf("documents[%d]", i)
		t := bytes.TrimSpace(raw)
		var doc DocumentInput
		switch {
		case len(t) > 0 && t[0] == '"':
			if json.Unmarshal(t, &doc.Text) != nil {
				return nil, BadRequestCode(param, CodeInvalidType, "Document %d is not a valid string.", i)
			}
		case len(t) > 0 && t[0] == '{':
			var o struct {
				ID   *string `json:"id"`
				Text *string `json:"text"`
			}
			if json.Unmarshal(t, &o) != nil || o.Text == nil {
				return nil, BadRequestCode(param, CodeInvalidType, "Document %d must be a string or an object with a string text.", i)
			}
			doc.Text = *o.Text
			if o.ID != nil {
				doc.ID = *o.ID
			}
		default:
			return nil, BadRequestCode(param, CodeInvalidType, "Document %d must be a string or an object with a string text.", i)
		}
		if doc.Text == "" {
			return nil, BadRequestCode(param, CodeInvalidValue, "Document %d is empty.", i)
		}
		d.Docs = append(d.Docs, doc)
	}
	return d, nil
}

// ChatMessages are msgs as a chat template takes them (tool calls, the
// call id a tool message answers and names included).
func ChatMessages(msgs []Message) []chat.Message {
	out := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		out[i] = chat.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
		if m.ToolCalls != "" {
			out[i].ToolCalls = json.RawMessage(m.ToolCalls)
		}
	}
	return out
}

// ChatPrompt renders chat messages into the prompt text of the engine's
// byte-level model (ChatPromptTools without tools).
func ChatPrompt(msgs []Message) string { return ChatPromptTools(msgs, nil) }

// ChatPromptTools renders chat messages and the request's tools into the
// prompt text of the engine's byte-level model:
//
//	[<|tools|>\ntools JSON\n] <|role|>\ncontent\n[<|tool_calls|>\ncalls JSON\n] ... <|assistant|>\n
//
// The tools block is there only when tools are given, and a tool_calls
// block only after an assistant message that made calls; a tool result is
// a message of role tool. Documents quoted in a message keep their bytes,
// so their tokens are the same wherever they appear (what non-prefix reuse
// relies on).
func ChatPromptTools(msgs []Message, tools json.RawMessage) string {
	var sb strings.Builder
	if len(tools) > 0 {
		sb.WriteString("<|tools|>\n")
		sb.Write(tools)
		sb.WriteString("\n")
	}
	for _, m := range msgs {
		sb.WriteString("<|")
		sb.WriteString(m.Role)
		sb.WriteString("|>\n")
		sb.WriteString(m.Content)
		sb.WriteString("\n")
		if m.ToolCalls != "" {
			sb.WriteString("<|tool_calls|>\n")
			sb.WriteString(m.ToolCalls)
			sb.WriteString("\n")
		}
	}
	sb.WriteString("<|assistant|>\n")
	return sb.String()
}

// rangeCode is the OpenAI code of a number v outside its range whose
// minimum is lo: below it, or above the maximum (NaN counts as above).
func rangeCode(v, lo float64) string {
	if v < lo {
		return CodeDecimalBelowMin
	}
	return CodeDecimalAboveMax
}
