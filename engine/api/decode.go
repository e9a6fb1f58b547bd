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

// Message is one chat message with its content flattened to text.
type Message struct {
	Role    string
	Content string
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
	Functions           json.RawMessage `json:"functions"`
	ResponseFormat      *rawRespFormat  `json:"response_format"`
}

type rawStreamOpts struct {
	IncludeUsage *bool `json:"include_usage"`
}

type rawRespFormat struct {
	Type string `json:"type"`
}

type rawMessage struct {
	Role    *string        `json:"role"`
	Content messageContent `json:"content"`
	Name    *string        `json:"name"`
}

// messageContent is a string, an array of content parts, or null.
type messageContent struct {
	text string
	set  bool
	bad  string // non-empty: why the content is not acceptable
}

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
			c.bad = "content must be a string, an array of text parts, or null"
			return nil
		}
		c.set = true
		var sb strings.Builder
		for i, p := range parts {
			switch {
			case p.Type == nil:
				c.bad = fmt.Sprintf("content part %d has no type", i)
			case *p.Type != "text":
				c.bad = fmt.Sprintf("content part type %q is not supported (only text)", *p.Type)
			case p.Text == nil:
				c.bad = fmt.Sprintf("text content part %d has no text", i)
			default:
				sb.WriteString(*p.Text)
				continue
			}
			return nil
		}
		c.text = sb.String()
		return nil
	}
	c.bad = "content must be a string, an array of text parts, or null"
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
		return BadRequest("", "The request body is empty; expected a JSON object.")
	}
	if body[0] != '{' {
		return BadRequest("", "The request body must be a JSON object.")
	}
	if !utf8.Valid(body) {
		return BadRequest("", "The request body is not valid UTF-8.")
	}
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return BadRequest("", "Malformed JSON at byte %d: %v.", syn.Offset, syn)
	case errors.As(err, &typ):
		// encoding/json names a field of the embedded rawCommon with the
		// Go type as a path element; the parameter is the JSON name alone.
		field := strings.TrimPrefix(typ.Field, "rawCommon.")
		if field == "" {
			return BadRequest("", "Invalid type in the request body: %v.", err)
		}
		return BadRequest(field, "Invalid type for '%s': got %s.", field, typ.Value)
	default:
		return BadRequest("", "Malformed JSON: %v.", err)
	}
}

func checkModel(m *string) *Error {
	if m == nil || strings.TrimSpace(*m) == "" {
		return BadRequest("model", "You must provide a model parameter.")
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
		return BadRequest("stop", "stop must be a string, an array of strings, or null.")
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
			return BadRequest("stream_options", "stream_options is only allowed when stream is true.")
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
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true}

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
	if len(r.Messages) == 0 {
		return nil, BadRequestCode("messages", CodeEmptyArray, "messages must be a non-empty array.")
	}
	if len(r.Messages) > MaxMessages {
		return nil, BadRequestCode("messages", CodeArrayAboveMaxLength, "At most %d messages are allowed, got %d.", MaxMessages, len(r.Messages))
	}
	g.Messages = make([]Message, 0, len(r.Messages))
	for i, m := range r.Messages {
		param := fmt.Sprintf("messages[%d]", i)
		if m.Role == nil {
			return nil, BadRequest(param+".role", "Message %d has no role.", i)
		}
		if !chatRoles[*m.Role] {
			return nil, BadRequest(param+".role", "Role %q is not supported (system, developer, user, assistant).", *m.Role)
		}
		if m.Content.bad != "" {
			return nil, BadRequest(param+".content", "%s.", m.Content.bad)
		}
		if !m.Content.set && *m.Role != "assistant" {
			return nil, BadRequest(param+".content", "Message %d has no content.", i)
		}
		g.Messages = append(g.Messages, Message{Role: *m.Role, Content: m.Content.text})
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
	if nonEmptyJSON(r.Tools) {
		return nil, BadRequestCode("tools", CodeUnsupportedParameter, "Tools are not supported by this server.")
	}
	if nonEmptyJSON(r.Functions) {
		return nil, BadRequestCode("functions", CodeUnsupportedParameter, "Functions are not supported by this server.")
	}
	if r.ResponseFormat != nil && r.ResponseFormat.Type != "text" {
		return nil, BadRequestCode("response_format", CodeUnsupportedValue, "response_format %q is not supported (only text).", r.ResponseFormat.Type)
	}
	if e := r.extensions(g); e != nil {
		return nil, e
	}
	return g, nil
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
		return BadRequest("prompt", "You must provide a prompt.")
	}
	if t[0] == '"' {
		if json.Unmarshal(t, &g.Prompt) != nil {
			return BadRequest("prompt", "prompt must be a string, an array of token ids, or a one-element array of either.")
		}
		return nil
	}
	if t[0] != '[' {
		return BadRequest("prompt", "prompt must be a string, an array of token ids, or a one-element array of either.")
	}
	var items []json.RawMessage
	if json.Unmarshal(t, &items) != nil {
		return BadRequest("prompt", "prompt must be a string, an array of token ids, or a one-element array of either.")
	}
	if len(items) == 0 {
		return BadRequest("prompt", "prompt must not be empty.")
	}
	first := bytes.TrimSpace(items[0])
	if len(first) > 0 && (first[0] == '"' || first[0] == '[') {
		if len(items) != 1 {
			return BadRequest("prompt", "Batched prompts are not supported; send one prompt per request (got %d).", len(items))
		}
		return decodePrompt(g, first)
	}
	toks := make([]int32, len(items))
	for i, it := range items {
		var v int64
		if json.Unmarshal(it, &v) != nil || v < 0 || v > math.MaxInt32 {
			return BadRequest("prompt", "Token %d of the prompt is not a non-negative integer token id.", i)
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
		return nil, BadRequest("documents", "documents must be a non-empty array.")
	}
	if len(r.Documents) > MaxDocuments {
		return nil, BadRequest("documents", "At most %d documents per request, got %d.", MaxDocuments, len(r.Documents))
	}
	for i, raw := range r.Documents {
		param := fmt.Sprintf("documents[%d]", i)
		t := bytes.TrimSpace(raw)
		var doc DocumentInput
		switch {
		case len(t) > 0 && t[0] == '"':
			if json.Unmarshal(t, &doc.Text) != nil {
				return nil, BadRequest(param, "Document %d is not a valid string.", i)
			}
		case len(t) > 0 && t[0] == '{':
			var o struct {
				ID   *string `json:"id"`
				Text *string `json:"text"`
			}
			if json.Unmarshal(t, &o) != nil || o.Text == nil {
				return nil, BadRequest(param, "Document %d must be a string or an object with a string text.", i)
			}
			doc.Text = *o.Text
			if o.ID != nil {
				doc.ID = *o.ID
			}
		default:
			return nil, BadRequest(param, "Document %d must be a string or an object with a string text.", i)
		}
		if doc.Text == "" {
			return nil, BadRequest(param, "Document %d is empty.", i)
		}
		d.Docs = append(d.Docs, doc)
	}
	return d, nil
}

// ChatMessages are msgs as a chat template takes them.
func ChatMessages(msgs []Message) []chat.Message {
	out := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		out[i] = chat.Message{Role: m.Role, Content: m.Content}
	}
	return out
}

// ChatPrompt renders chat messages into the prompt text of the engine's
// byte-level model:
//
//	<|role|>\ncontent\n ... <|assistant|>\n
//
// Documents quoted in a message keep their bytes, so their tokens are the
// same wherever they appear (what non-prefix reuse relies on).
func ChatPrompt(msgs []Message) string {
	var sb strings.Builder
	for _, m := range msgs {
		sb.WriteString("<|")
		sb.WriteString(m.Role)
		sb.WriteString("|>\n")
		sb.WriteString(m.Content)
		sb.WriteString("\n")
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
