package demo

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/cacheblend/cacheblend/apiclient"
)

// chatRequest is one of the demo's requests (greedy, ignore_eos, the usage chunk asked
// for: apiclient.ChatStream's).
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

// chatClient sends the demo's chat requests to one engine (or gateway).
type chatClient struct {
	base, apiKey string
	hc           *http.Client
}

// stream sends q with apiclient.ChatStream (a fresh traceparent) and reads the stream to
// its end.
func (c *chatClient) stream(ctx context.Context, q chatRequest) (chatResult, error) {
	cl := apiclient.New(c.base, apiclient.Config{APIKey: c.apiKey, HTTPClient: c.hc})
	sent := time.Now()
	g, err := cl.ChatStream(ctx, apiclient.ChatRequest{Model: q.model, Content: q.content, MaxTokens: q.maxTokens,
		IgnoreEOS: true, NoReuse: q.noReuse, CacheBlend: &apiclient.CacheBlendOptions{QualityCheck: q.qualityCheck}})
	res := chatResult{traceID: g.TraceID, requestID: g.RequestID, engine: g.Engine, sent: sent, ttft: g.TTFT,
		promptTokens: g.PromptTokens, tokens: g.Deltas}
	if cb := g.CacheBlend; cb != nil {
		res.qualitySampled, res.nonPrefixHit = cb.QualitySampled, cb.NonPrefixHitTokens
	}
	if err != nil {
		return res, fmt.Errorf("chat: %w", err)
	}
	return res, nil
}
