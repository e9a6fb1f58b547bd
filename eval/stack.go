package eval

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/apiclient"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/loadgen"
	"github.com/cacheblend/cacheblend/model"
)

// Defaults of a zero Stack.
const (
	// DefaultRepeats is how often each prompt is sent per configuration.
	DefaultRepeats = 3
	// DefaultMaxTokens is the tokens generated per request (the first
	// one's time is measured; a token may decode to no text yet).
	DefaultMaxTokens = 4
	// DefaultRequestTimeout bounds one request.
	DefaultRequestTimeout = 2 * time.Minute
	// DefaultWarmup is the untimed request pairs sent first.
	DefaultWarmup = 2
)

// Stack is a running stack whose time to first token Run measures (Config.Stack).
// The stack should serve the model Run evaluates, store no generated prompts
// (cb engine --no-store: every reuse then comes from the documents computed
// alone, as in the in-process blend), blend whatever its blend gate says
// (cb worker --blend-gate on) and check no quality online (cb worker
// --quality-sample-rate=0, whose background full prefills would share the
// CPU with the measured requests). Zero fields take the defaults. Not safe
// for concurrent use (one measurement at a time).
//
// Every configuration sends each prompt Repeats times with the configuration's
// "cacheblend" settings and as many times as a full prefill ("reuse": false),
// interleaved pair by pair (which of the two goes first alternates), streaming,
// and takes the client-side time to the first non-empty content delta. Each
// request's system message starts with its own number: no prompt is sent
// twice, so none is served from the engine's prefix cache (a full prefill
// commits its blocks there too); only the few template tokens before the
// number are. A measured request that reused no token off the prefix
// (usage.cacheblend.non_prefix_hit_tokens 0), or a full prefill that reused
// any, fails the run: the figure would not be CacheBlend's.
type Stack struct {
	// API is the engine's (or gateway's) base URL. Required.
	API string
	// APIKey is sent as a bearer token when set.
	APIKey string
	// Model is the served model name; default defaults.Model.
	Model string
	// Repeats is how often each prompt is sent per configuration, with
	// reuse and as a full prefill; default DefaultRepeats.
	Repeats int
	// MaxTokens is generated per request; default DefaultMaxTokens.
	MaxTokens int
	// Warmup is the untimed request pairs sent before measuring; default
	// DefaultWarmup (negative: none).
	Warmup int
	// Timeout bounds one request; default DefaultRequestTimeout.
	Timeout time.Duration
	// HTTPClient sends the requests; default a client of its own (its
	// idle connections closed at the end of Run) without a timeout (Timeout
	// bounds each request).
	HTTPClient *http.Client
	// Progress receives one line per configuration; nil for none.
	Progress io.Writer
}

// StackInfo describes a stack measurement (Report.Stack).
type StackInfo struct {
	// Repeats is how often each prompt was sent per configuration with
	// reuse and as a full prefill; MaxTokens the tokens generated per
	// request.
	Repeats   int `json:"repeats"`
	MaxTokens int `json:"max_tokens"`
	// PromptTokens is the mean prompt length the stack reported.
	PromptTokens float64 `json:"mean_prompt_tokens"`
}

// StackPoint is one configuration's figures on the stack (part of Point).
type StackPoint struct {
	// Requests is how many requests were timed with reuse (as many were
	// as a full prefill).
	Requests int `json:"stack_requests,omitempty"`
	// FullTTFTMs and BlendTTFTMs are the median client-side times to the
	// first token of the full prefills and of the requests with reuse;
	// TTFTSpeedup is FullTTFTMs / BlendTTFTMs.
	FullTTFTMs  float64 `json:"full_ttft_ms,omitempty"`
	BlendTTFTMs float64 `json:"blend_ttft_ms,omitempty"`
	TTFTSpeedup float64 `json:"ttft_speedup,omitempty"`
	// PrefixHitTokens and NonPrefixHitTokens are the means of the requests'
	// usage.cacheblend: reused as an exact prefix, and loaded from the
	// stored documents at other positions.
	PrefixHitTokens    float64 `json:"prefix_hit_tokens,omitempty"`
	NonPrefixHitTokens float64 `json:"non_prefix_hit_tokens,omitempty"`
}

// ErrNotReused is the cause of a run whose request with reuse reused
// nothing off the prefix, or whose full prefill reused something.
var ErrNotReused = errors.New("eval: the stack did not serve the request as configured")

func (s *Stack) withDefaults() Stack {
	c := *s
	c.Model = cmp.Or(c.Model, defaults.Model)
	defaults.Positive(&c.Repeats, DefaultRepeats)
	defaults.Positive(&c.MaxTokens, DefaultMaxTokens)
	defaults.Positive(&c.Timeout, DefaultRequestTimeout)
	if c.Warmup == 0 {
		c.Warmup = DefaultWarmup
	}
	return c
}

// stackPrompt is one prompt of the workload as chat text: the documents
// (cut as the in-process prompts cut them) in the order of docIndex, then
// question i.
type stackPrompt struct {
	docs     []string
	question string
}

// stackPrompts are the workload's prompts as text, and the documents to
// ingest (each cut to MaxDocTokens when p can decode).
func stackPrompts(cfg Config, p Prompts) ([]stackPrompt, []apiclient.Document) {
	texts := slices.Clone(cfg.Documents)
	if p.Decode != nil {
		for i, t := range docTokens(cfg, p) {
			if len(t) < len(p.Encode(texts[i])) {
				texts[i] = p.Decode(t)
			}
		}
	}
	docs := make([]apiclient.Document, len(texts))
	for i, t := range texts {
		docs[i] = apiclient.Document{ID: fmt.Sprintf("eval-%d", i), Text: t}
	}
	out := make([]stackPrompt, cfg.Prompts)
	for i := range out {
		out[i].question = cfg.Questions[i%len(cfg.Questions)]
		for j := range cfg.Docs {
			out[i].docs = append(out[i].docs, texts[docIndex(cfg, i, j)])
		}
	}
	return out, docs
}

// messages are the chat messages of prompt q sent as request number n:
// the in-process layout (a system message, then the documents and the
// question in a user message), the documents separated by blank lines,
// and n first, so that no two requests share more than the template's
// opening tokens.
func (q stackPrompt) messages(n int) []apiclient.Message {
	return []apiclient.Message{
		{Role: "system", Content: fmt.Sprintf("[%06d] Answer from the documents.", n)},
		{Role: "user", Content: "Documents:\n" + strings.Join(q.docs, "\n\n") + "\nQuestion: " + q.question},
	}
}

// blendSettings is the "cacheblend" extension of a request with reuse at
// ratio r with rule.
func blendSettings(r float64, rule model.Selection) *apiclient.CacheBlendOptions {
	sel := "deviation"
	if rule == model.SelectRandom {
		sel = "random"
	}
	return &apiclient.CacheBlendOptions{RecomputeRatio: &r, Selection: sel}
}

// measure ingests the documents, then times every configuration.
func (s *Stack) measure(ctx context.Context, cfg Config, p Prompts, configs []configuration) (StackInfo, []StackPoint, error) {
	c := s.withDefaults()
	if c.API == "" {
		return StackInfo{}, nil, errors.New("eval: no stack API URL")
	}
	if c.HTTPClient == nil { // its own connections, closed at the end
		tr := http.DefaultTransport.(*http.Transport).Clone()
		defer tr.CloseIdleConnections()
		c.HTTPClient = &http.Client{Transport: tr}
	}
	cl := apiclient.New(c.API, apiclient.Config{APIKey: c.APIKey, HTTPClient: c.HTTPClient})
	if err := cl.WaitHealthy(ctx, 60*time.Second); err != nil {
		return StackInfo{}, nil, fmt.Errorf("eval: %w", err)
	}
	prompts, docs := stackPrompts(cfg, p)
	if err := cl.Ingest(ctx, docs); err != nil {
		return StackInfo{}, nil, fmt.Errorf("eval: %w", err)
	}
	info := StackInfo{Repeats: c.Repeats, MaxTokens: c.MaxTokens}
	n, pairs := 0, 0 // request and pair numbers: every prompt sent is unique
	pair := func(q stackPrompt, conf configuration) (full, blend timed, err error) {
		pairs++
		for k := range 2 {
			if (pairs+k)%2 == 0 { // alternate which of the pair goes first
				full, err = c.send(ctx, cl, q.messages(n), &apiclient.CacheBlendOptions{Reuse: new(false)})
			} else {
				blend, err = c.send(ctx, cl, q.messages(n), blendSettings(conf.ratio, conf.rule))
			}
			n++
			if err != nil {
				return full, blend, err
			}
		}
		return full, blend, nil
	}
	for w := range max(c.Warmup, 0) {
		if _, _, err := pair(prompts[w%len(prompts)], configuration{0.15, model.SelectDeviation}); err != nil {
			return info, nil, fmt.Errorf("eval: warm-up: %w", err)
		}
	}
	var out []StackPoint
	var promptTokens, measured int
	for _, conf := range configs {
		var fulls, blends []float64
		var sp StackPoint
		for range c.Repeats {
			for i, q := range prompts {
				full, blend, err := pair(q, conf)
				if err != nil {
					return info, nil, fmt.Errorf("eval: prompt %d at ratio %g (%v): %w", i, conf.ratio, conf.rule, err)
				}
				if full.usage.PrefixHitTokens+full.usage.NonPrefixHitTokens != 0 {
					return info, nil, fmt.Errorf("%w: prompt %d's full prefill reused %d prefix and %d non-prefix tokens", ErrNotReused, i, full.usage.PrefixHitTokens, full.usage.NonPrefixHitTokens)
				}
				if blend.usage.NonPrefixHitTokens <= 0 {
					return info, nil, fmt.Errorf("%w: prompt %d at ratio %g (%v) reused no token off the prefix (usage.cacheblend %+v): are the documents stored, is blending on (cb worker --blend-gate)?",
						ErrNotReused, i, conf.ratio, conf.rule, blend.usage)
				}
				fulls = append(fulls, ms(full.ttft))
				blends = append(blends, ms(blend.ttft))
				sp.PrefixHitTokens += float64(blend.usage.PrefixHitTokens)
				sp.NonPrefixHitTokens += float64(blend.usage.NonPrefixHitTokens)
				promptTokens += blend.promptTokens
				measured++
			}
		}
		sp.Requests = len(blends)
		sp.PrefixHitTokens /= float64(sp.Requests)
		sp.NonPrefixHitTokens /= float64(sp.Requests)
		sp.FullTTFTMs, sp.BlendTTFTMs = median(fulls), median(blends)
		if sp.BlendTTFTMs > 0 {
			sp.TTFTSpeedup = sp.FullTTFTMs / sp.BlendTTFTMs
		}
		if c.Progress != nil {
			rule := conf.rule.String()
			if conf.ratio == 0 {
				rule = "full_reuse"
			}
			fmt.Fprintf(c.Progress, "stack: ratio %.2f %-10s TTFT full %.1f ms, with reuse %.1f ms: %.2fx (%d pairs)\n",
				conf.ratio, rule, sp.FullTTFTMs, sp.BlendTTFTMs, sp.TTFTSpeedup, sp.Requests)
		}
		out = append(out, sp)
	}
	if measured > 0 {
		info.PromptTokens = float64(promptTokens) / float64(measured)
	}
	return info, out, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// median is loadgen's p50 of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return float64(loadgen.Summarize(xs).P50)
}

// timed is one streamed request as measured: its time to the first content
// token, prompt tokens and usage.cacheblend.
type timed struct {
	ttft         time.Duration
	promptTokens int
	usage        apiclient.UsageCacheBlend
}

// send streams one chat completion with the "cacheblend" extension blend
// and times its first content token (apiclient.ChatStream's TTFT).
func (s *Stack) send(ctx context.Context, cl *apiclient.Client, msgs []apiclient.Message, blend *apiclient.CacheBlendOptions) (timed, error) {
	g, err := cl.ChatStream(ctx, apiclient.ChatRequest{Model: s.Model, Messages: msgs, MaxTokens: s.MaxTokens,
		IgnoreEOS: true, CacheBlend: blend, Timeout: s.Timeout})
	if err != nil {
		return timed{}, fmt.Errorf("chat: %w", err)
	}
	if g.CacheBlend == nil {
		return timed{}, errors.New("chat: no usage.cacheblend in the stream")
	}
	return timed{ttft: g.TTFT, promptTokens: g.PromptTokens, usage: *g.CacheBlend}, nil
}
