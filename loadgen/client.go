package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Error kinds of a failed request (Result.ErrorKind, the keys of Report.Errors). An HTTP
// error status is "http_<code>", e.g. "http_503".
const (
	KindConnection = "connection"   // the request could not be sent or the response read
	KindTimeout    = "timeout"      // Config.RequestTimeout elapsed
	KindCanceled   = "canceled"     // the run was cancelled or its grace period ended
	KindStream     = "stream_error" // the stream carried an error event
	KindBadStream  = "bad_stream"   // an event that is not valid JSON, or an oversized line
	KindTruncated  = "truncated"    // the stream ended before data: [DONE]
	KindNoTokens   = "no_tokens"    // the stream completed without any content
)

// errRequestTimeout is the cancel cause of a request that ran past Config.RequestTimeout;
// errGraceOver that of requests still running when the grace period ended.
var (
	errRequestTimeout = errors.New("request timeout")
	errGraceOver      = errors.New("the run's grace period ended")
)

// requestError is a failed request with its kind and HTTP status (0 when none).
type requestError struct {
	kind   string
	status int
	err    error
}

func (e *requestError) Error() string { return e.kind + ": " + e.err.Error() }
func (e *requestError) Unwrap() error { return e.err }

// client speaks the engine's OpenAI-compatible API. Safe for concurrent use.
type client struct {
	base   string
	apiKey string
	http   *http.Client
}

// newTraceparent returns a fresh sampled W3C traceparent and its trace id.
func newTraceparent() (traceparent, traceID string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	b[0] |= 1  // never all-zero
	b[16] |= 1 // never all-zero
	tid := hex.EncodeToString(b[:16])
	return "00-" + tid + "-" + hex.EncodeToString(b[16:]) + "-01", tid
}

func (c *client) do(ctx context.Context, method, url string, body any, hdr http.Header, auth bool) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth && c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	return c.http.Do(req)
}

// httpError describes a non-2xx response with the start of its body.
func httpError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	msg := strings.TrimSpace(string(b))
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	return fmt.Errorf("HTTP %d: %s", resp.StatusCode, msg)
}

// waitHealthy polls /health every 200 ms until it answers 200 or timeout elapses.
func (c *client) waitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := c.do(ctx, http.MethodGet, c.base+"/health", nil, nil, true)
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("loadgen: wait for engine health: %w", ctx.Err())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("loadgen: engine not healthy after %s: %w", timeout, err)
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// ingest stores the documents for reuse (POST /v1/documents).
func (c *client) ingest(ctx context.Context, docs []Document) error {
	type doc struct {
		ID   string `json:"id"`
		Text string `json:"text"`
	}
	body := struct {
		Documents []doc `json:"documents"`
	}{Documents: make([]doc, len(docs))}
	for i, d := range docs {
		body.Documents[i] = doc{ID: d.ID, Text: d.Text}
	}
	resp, err := c.do(ctx, http.MethodPost, c.base+"/v1/documents", body, nil, true)
	if err != nil {
		return fmt.Errorf("loadgen: ingest documents: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("loadgen: ingest documents: %w", httpError(resp))
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// chatRequest is one streamed chat completion to send.
type chatRequest struct {
	model     string
	content   string
	maxTokens int
	noReuse   bool
}

// chatResult is one streamed chat completion as the client saw it.
type chatResult struct {
	traceID      string
	requestID    string
	status       int
	ttft, e2e    time.Duration
	hasTTFT      bool
	promptTokens int
	outputTokens int
	usage        bool
}

// chat sends one streamed chat completion with its own traceparent and measures the time
// from just before the request is sent to the first content delta, and to the end of the
// stream. A failure is a *requestError.
func (c *client) chat(ctx context.Context, q chatRequest) (chatResult, error) {
	tp, tid := newTraceparent()
	body := map[string]any{
		"model":          q.model,
		"messages":       []map[string]string{{"role": "user", "content": q.content}},
		"max_tokens":     q.maxTokens,
		"temperature":    0,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"ignore_eos":     true,
	}
	if q.noReuse {
		body["cacheblend"] = map[string]any{"reuse": false}
	}
	res := chatResult{traceID: tid}
	var start time.Time
	fail := func(kind string, err error) (chatResult, error) {
		if ctx.Err() != nil && (kind == KindConnection || kind == KindTruncated || kind == KindBadStream) {
			kind = KindCanceled
			if errors.Is(context.Cause(ctx), errRequestTimeout) {
				kind = KindTimeout
			}
		}
		if !start.IsZero() {
			res.e2e = time.Since(start)
		}
		return res, &requestError{kind: kind, status: res.status, err: err}
	}
	hdr := http.Header{"Traceparent": {tp}, "Accept": {"text/event-stream"}}
	start = time.Now()
	resp, err := c.do(ctx, http.MethodPost, c.base+"/v1/chat/completions", body, hdr, true)
	if err != nil {
		return fail(KindConnection, err)
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	res.requestID = resp.Header.Get("X-Request-Id")
	if resp.StatusCode != http.StatusOK {
		return fail(fmt.Sprintf("http_%d", resp.StatusCode), httpError(resp))
	}
	sr, err := readStream(resp.Body, func() {
		res.ttft, res.hasTTFT = time.Since(start), true
	})
	res.e2e = time.Since(start)
	if res.requestID == "" {
		res.requestID = sr.id
	}
	res.promptTokens, res.outputTokens, res.usage = sr.promptTokens, sr.completionTokens, sr.usage
	if !sr.usage {
		res.outputTokens = sr.contentChunks
	}
	if err != nil {
		var se *streamError
		if errors.As(err, &se) {
			return fail(se.kind, err)
		}
		return fail(KindConnection, err)
	}
	if !res.hasTTFT {
		return fail(KindNoTokens, errors.New("the stream carried no content"))
	}
	return res, nil
}

// streamError is a malformed or failed event stream.
type streamError struct {
	kind string
	msg  string
}

func (e *streamError) Error() string { return e.msg }

// streamResult is what an event stream carried.
type streamResult struct {
	id                             string
	contentChunks                  int
	usage                          bool
	promptTokens, completionTokens int
}

// maxLine bounds one SSE line.
const maxLine = 1 << 20

// readStream reads an OpenAI chat-completion event stream up to data: [DONE], calling
// onContent once, at the first non-empty content delta. It returns a *streamError for an
// error event (KindStream), an event that is not JSON or a line over 1 MiB (KindBadStream)
// and a stream that ends before [DONE] (KindTruncated); read errors are returned as is.
func readStream(r io.Reader, onContent func()) (streamResult, error) {
	var res streamResult
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	seen := false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // comments, event:, id:, retry: and blank lines
		}
		data = bytes.TrimPrefix(data, []byte(" "))
		if string(data) == "[DONE]" {
			return res, nil
		}
		var chunk struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return res, &streamError{kind: KindBadStream, msg: fmt.Sprintf("bad event %.80q: %v", data, err)}
		}
		if chunk.Error != nil {
			return res, &streamError{kind: KindStream, msg: fmt.Sprintf("error event: %s (%s)", chunk.Error.Message, chunk.Error.Type)}
		}
		if res.id == "" {
			res.id = chunk.ID
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content == nil || *ch.Delta.Content == "" {
				continue
			}
			res.contentChunks++
			if !seen {
				seen = true
				if onContent != nil {
					onContent()
				}
			}
		}
		if u := chunk.Usage; u != nil {
			if u.PromptTokens < 0 || u.CompletionTokens < 0 {
				return res, &streamError{kind: KindBadStream, msg: fmt.Sprintf("negative usage %+v", *u)}
			}
			res.usage, res.promptTokens, res.completionTokens = true, u.PromptTokens, u.CompletionTokens
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return res, &streamError{kind: KindBadStream, msg: "an event line over 1 MiB"}
		}
		return res, fmt.Errorf("read stream: %w", err)
	}
	return res, &streamError{kind: KindTruncated, msg: "the stream ended before data: [DONE]"}
}
