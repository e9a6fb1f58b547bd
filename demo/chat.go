package demo

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/apiclient"
)

// The demo's chat requests. apiclient.ChatStream sends neither the cacheblend
// extension's "quality_check" nor returns the generated text and usage.cacheblend, so the
// demo sends its requests here: the same body (greedy: temperature 0, ignore_eos, the usage
// chunk asked for) and headers, and apiclient.ReadStream to read the stream, its errors and
// the time to the first token; the text and the usage extension are read from a copy of
// the stream afterwards.

// maxStreamCopy bounds the copy of a stream kept for its text and usage (a stream past it
// is an error): far more than the demo's few tokens.
const maxStreamCopy = 16 << 20

// chatRequest is one of the demo's requests.
type chatRequest struct {
	model, content string
	maxTokens      int
	// noReuse sends {"reuse": false}: the full-prefill baseline.
	noReuse bool
	// qualityCheck sends {"quality_check": true}: the worker checks the request's reused
	// KV against a full prefill (when it takes the check).
	qualityCheck bool
}

// chatResult is what the demo reads of one streamed completion.
type chatResult struct {
	traceID, requestID, engine string
	sent                       time.Time
	ttft                       time.Duration
	promptTokens               int
	// tokens are the content deltas, in order: one per generated token, or the tokens of
	// one UTF-8 character.
	tokens []string
	// qualitySampled is usage.cacheblend.quality_sampled: the worker took the check;
	// nonPrefixHit is usage.cacheblend.non_prefix_hit_tokens (what was blended).
	qualitySampled bool
	nonPrefixHit   int
}

// text is the generated text.
func (r chatResult) text() string { return strings.Join(r.tokens, "") }

// chatClient sends the demo's chat requests to one engine (or gateway).
type chatClient struct {
	base, apiKey string
	hc           *http.Client
}

// stream sends q as a streamed chat completion with a fresh traceparent and reads the
// stream to its end.
func (c *chatClient) stream(ctx context.Context, q chatRequest) (chatResult, error) {
	ext := map[string]any{}
	if q.noReuse {
		ext["reuse"] = false
	}
	if q.qualityCheck {
		ext["quality_check"] = true
	}
	body := map[string]any{
		"model":          q.model,
		"messages":       []map[string]string{{"role": "user", "content": q.content}},
		"max_tokens":     q.maxTokens,
		"temperature":    0,
		"ignore_eos":     true,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if len(ext) > 0 {
		body["cacheblend"] = ext
	}
	b, err := json.Marshal(body)
	if err != nil {
		return chatResult{}, fmt.Errorf("chat: encode: %w", err)
	}
	tp, tid := apiclient.NewTraceparent()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.base, "/")+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return chatResult{}, fmt.Errorf("chat: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Traceparent", tp)
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	res := chatResult{traceID: tid, sent: time.Now()}
	resp, err := c.hc.Do(req)
	if err != nil {
		return res, fmt.Errorf("chat: %w", err)
	}
	defer resp.Body.Close()
	res.requestID, res.engine = resp.Header.Get("X-Request-Id"), resp.Header.Get("X-Cb-Engine")
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return res, fmt.Errorf("chat: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	var cp bytes.Buffer
	sr, err := apiclient.ReadStream(io.TeeReader(io.LimitReader(resp.Body, maxStreamCopy), &cp), func() {
		res.ttft = time.Since(res.sent)
	})
	if err != nil {
		return res, fmt.Errorf("chat: %w", err)
	}
	if sr.ContentChunks == 0 {
		return res, fmt.Errorf("chat: the stream carried no content")
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096)) // the last chunk: the connection is reused
	res.requestID = cmp.Or(res.requestID, sr.ID)
	res.promptTokens = sr.PromptTokens
	res.tokens, res.qualitySampled, res.nonPrefixHit = streamExtras(cp.Bytes())
	return res, nil
}

// streamExtras reads, from a stream apiclient.ReadStream accepted, the content deltas and
// usage.cacheblend's quality_sampled and non_prefix_hit_tokens.
func streamExtras(stream []byte) (tokens []string, qualitySampled bool, nonPrefixHit int) {
	sc := bufio.NewScanner(bytes.NewReader(stream))
	sc.Buffer(make([]byte, 0, 64<<10), maxStreamCopy)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimPrefix(data, []byte(" "))
		if string(data) == "[DONE]" {
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CacheBlend *struct {
					QualitySampled bool `json:"quality_sampled"`
					NonPrefixHit   int  `json:"non_prefix_hit_tokens"`
				} `json:"cacheblend"`
			} `json:"usage"`
		}
		if json.Unmarshal(data, &chunk) != nil {
			continue // ReadStream accepted the stream: not reached
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content != "" {
				tokens = append(tokens, ch.Delta.Content)
			}
		}
		if u := chunk.Usage; u != nil && u.CacheBlend != nil {
			qualitySampled, nonPrefixHit = u.CacheBlend.QualitySampled, u.CacheBlend.NonPrefixHit
		}
	}
	return tokens, qualitySampled, nonPrefixHit
}
