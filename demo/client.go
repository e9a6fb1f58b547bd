package demo

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

// client speaks the engine's OpenAI-compatible API.
type client struct {
	base   string
	apiKey string
	http   *http.Client
}

// genResult is one streamed chat completion as the client saw it.
type genResult struct {
	ID           string
	TraceID      string
	TTFT         time.Duration
	E2E          time.Duration
	Text         string
	OutputTokens int
	PromptTokens int
}

func newTraceparent() (traceparent, traceID string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	b[0] |= 1  // never all-zero
	b[16] |= 1 // never all-zero
	tid := hex.EncodeToString(b[:16])
	return "00-" + tid + "-" + hex.EncodeToString(b[16:]) + "-01", tid
}

func (c *client) do(ctx context.Context, method, path string, body any, hdr map[string]string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return c.http.Do(req)
}

func apiError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return fmt.Errorf("%s: HTTP %d: %s", resp.Request.URL.Path, resp.StatusCode, strings.TrimSpace(string(b)))
}

// waitHealthy polls /health until it answers 200 (the worker is ready).
func (c *client) waitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := c.do(ctx, http.MethodGet, "/health", nil, nil)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			return fmt.Errorf("demo: engine not healthy after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
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
	}{}
	for _, d := range docs {
		body.Documents = append(body.Documents, doc{ID: d.ID, Text: d.Text})
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/documents", body, nil)
	if err != nil {
		return fmt.Errorf("demo: ingest documents: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("demo: ingest documents: %w", apiError(resp))
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// chat sends one streamed chat completion with its own traceparent and
// measures the time to the first content token.
func (c *client) chat(ctx context.Context, model, content string, maxTokens int, reuse bool) (genResult, error) {
	tp, tid := newTraceparent()
	body := map[string]any{
		"model":          model,
		"messages":       []map[string]string{{"role": "user", "content": content}},
		"max_tokens":     maxTokens,
		"temperature":    0,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"ignore_eos":     true,
	}
	if !reuse {
		body["cacheblend"] = map[string]any{"reuse": false}
	}
	res := genResult{TraceID: tid}
	start := time.Now()
	resp, err := c.do(ctx, http.MethodPost, "/v1/chat/completions", body, map[string]string{"traceparent": tp})
	if err != nil {
		return res, fmt.Errorf("demo: chat: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return res, fmt.Errorf("demo: chat: %w", apiError(resp))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var text strings.Builder
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			break
		}
		var chunk struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return res, fmt.Errorf("demo: bad SSE chunk %q: %w", data, err)
		}
		if chunk.Error != nil {
			return res, fmt.Errorf("demo: stream failed: %s", chunk.Error.Message)
		}
		if res.ID == "" {
			res.ID = chunk.ID
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content != "" && res.TTFT == 0 {
				res.TTFT = time.Since(start)
			}
			text.WriteString(ch.Delta.Content)
		}
		if chunk.Usage != nil {
			res.PromptTokens, res.OutputTokens = chunk.Usage.PromptTokens, chunk.Usage.CompletionTokens
		}
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("demo: read stream: %w", err)
	}
	res.E2E = time.Since(start)
	res.Text = text.String()
	if res.TTFT == 0 {
		return res, errors.New("demo: the stream carried no token")
	}
	return res, nil
}
