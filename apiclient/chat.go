package apiclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
)

// errRequestTimeout is the cancel cause of a chat completion that ran past
// ChatRequest.Timeout.
var errRequestTimeout = errors.New("request timeout")

// ChatRequest is one streamed chat completion to send, generated greedily (temperature 0),
// with usage requested in the final chunk.
type ChatRequest struct {
	// Model is the model named in the request ("model"). Required by the engine.
	Model string
	// Messages are the chat messages ("messages"), sent as they are when not empty.
	Messages []Message
	// Content is the shortcut for a single user message, sent when Messages is empty.
	Content string
	// MaxTokens is "max_tokens"; 0 sends 0, which the engine refuses.
	MaxTokens int
	// IgnoreEOS sends "ignore_eos": true, so a successful request generates exactly
	// MaxTokens tokens. Default false: the field is not sent.
	IgnoreEOS bool
	// NoReuse sends the cacheblend extension's "reuse": false (with CacheBlend's other
	// settings): a full prefill with no KV-cache reuse. Default false.
	NoReuse bool
	// CacheBlend is the "cacheblend" request extension. Default nil: with a zero value and
	// NoReuse false, the extension is not sent and the engine uses its own settings.
	CacheBlend *CacheBlendOptions
	// Timeout bounds the request, streaming included; when it elapses the request fails
	// with KindTimeout. Default 0: only ctx (and the HTTP client) bound it.
	Timeout time.Duration
}

// Message is one chat message.
type Message struct {
	// Role is "system", "user" or "assistant".
	Role string `json:"role"`
	// Content is the message's text.
	Content string `json:"content"`
}

// CacheBlendOptions is the engine's "cacheblend" chat request extension; unset fields are
// not sent (the engine's defaults apply).
type CacheBlendOptions struct {
	// Reuse false asks for a full prefill with no KV-cache reuse; nil: not sent (reuse).
	Reuse *bool `json:"reuse,omitempty"`
	// RecomputeRatio is the share of reused tokens to recompute, in [0, 1]; nil: not sent.
	RecomputeRatio *float64 `json:"recompute_ratio,omitempty"`
	// Selection picks the recomputed tokens: "deviation" or "random"; "": not sent.
	Selection string `json:"selection,omitempty"`
	// QualityCheck asks the worker to check the request's reused KV against a full
	// prefill (usage.cacheblend.quality_sampled says whether it took the check).
	QualityCheck bool `json:"quality_check,omitempty"`
}

// ChatResult is one streamed chat completion as the client saw it. On failure it holds
// what was known when the request failed.
type ChatResult struct {
	// TraceID is the trace id of the traceparent the request carried.
	TraceID string
	// RequestID is the engine's X-Request-Id, else the first chunk's id; "" when neither
	// was received.
	RequestID string
	// Engine is the gateway's X-Cb-Engine response header: the host:port of the engine
	// (node) that served the request; "" when the request went to an engine directly.
	Engine string
	// Status is the HTTP status; 0 when no response was received.
	Status int
	// TTFT is the time from just before the request was sent to the first non-empty
	// content delta; valid when HasTTFT.
	TTFT    time.Duration
	HasTTFT bool
	// E2E is the time from just before the request was sent to the end of the stream (or
	// the failure); 0 when the request was not sent.
	E2E time.Duration
	// PromptTokens and OutputTokens come from the usage chunk when Usage; without one,
	// OutputTokens is the number of content deltas and PromptTokens is 0.
	PromptTokens int
	OutputTokens int
	Usage        bool
	// CacheBlend is the usage's "cacheblend" extension, nil without one.
	CacheBlend *UsageCacheBlend
	// Deltas are the non-empty content deltas, in order (as many as the content chunks).
	Deltas []string
}

// Text is the generated text: the content deltas joined.
func (r ChatResult) Text() string { return strings.Join(r.Deltas, "") }

// ChatStream sends q as a streamed chat completion (POST /v1/chat/completions) with its own
// traceparent from NewTraceparent, and reads the stream to data: [DONE]. A failure is an
// *Error: KindConnection (not sent, or the response could not be read), KindHTTP(status),
// KindStream, KindBadStream, KindTruncated, KindNoTokens (the stream carried no content),
// KindTimeout (q.Timeout elapsed) or KindCanceled (ctx ended first). Safe for concurrent use.
func (c *Client) ChatStream(ctx context.Context, q ChatRequest) (ChatResult, error) {
	if q.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, q.Timeout, errRequestTimeout)
		defer cancel()
	}
	tp, tid := NewTraceparent()
	msgs := q.Messages
	if len(msgs) == 0 {
		msgs = []Message{{Role: "user", Content: q.Content}}
	}
	body := map[string]any{
		"model":          q.Model,
		"messages":       msgs,
		"max_tokens":     q.MaxTokens,
		"temperature":    0,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if q.IgnoreEOS {
		body["ignore_eos"] = true
	}
	var cb CacheBlendOptions
	if q.CacheBlend != nil {
		cb = *q.CacheBlend
	}
	if q.NoReuse {
		cb.Reuse = new(false)
	}
	if cb != (CacheBlendOptions{}) {
		body["cacheblend"] = cb
	}
	res := ChatResult{TraceID: tid}
	var start time.Time
	fail := func(kind string, err error) (ChatResult, error) {
		if ctx.Err() != nil && (kind == KindConnection || kind == KindTruncated || kind == KindBadStream) {
			kind = KindCanceled
			if errors.Is(context.Cause(ctx), errRequestTimeout) {
				kind = KindTimeout
			}
		}
		if !start.IsZero() {
			res.E2E = time.Since(start)
		}
		return res, &Error{Kind: kind, Status: res.Status, Err: err}
	}
	hdr := http.Header{"Traceparent": {tp}, "Accept": {"text/event-stream"}}
	start = time.Now()
	resp, err := c.do(ctx, http.MethodPost, c.base+"/v1/chat/completions", body, hdr, true)
	if err != nil {
		return fail(KindConnection, err)
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.RequestID = resp.Header.Get("X-Request-Id")
	res.Engine = resp.Header.Get("X-Cb-Engine")
	if resp.StatusCode != http.StatusOK {
		return fail(KindHTTP(resp.StatusCode), httpError(resp))
	}
	sr, err := ReadStream(resp.Body, func() {
		res.TTFT, res.HasTTFT = time.Since(start), true
	})
	res.E2E = time.Since(start)
	if err == nil {
		// The rest of the chunked body (its last chunk) is read so that the
		// connection is reused: a body closed before its end costs the server
		// a new connection for the next request.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	}
	if res.RequestID == "" {
		res.RequestID = sr.ID
	}
	res.PromptTokens, res.OutputTokens, res.Usage, res.CacheBlend, res.Deltas = sr.PromptTokens, sr.CompletionTokens, sr.Usage, sr.CacheBlend, sr.Deltas
	if !sr.Usage {
		res.OutputTokens = sr.ContentChunks
	}
	if err != nil {
		var se *Error
		if errors.As(err, &se) {
			return fail(se.Kind, se.Err)
		}
		return fail(KindConnection, err)
	}
	if !res.HasTTFT {
		return fail(KindNoTokens, errors.New("the stream carried no content"))
	}
	return res, nil
}
