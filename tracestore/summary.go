package tracestore

import (
	"slices"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/contract/spanname"
)

// Attribute and event names the request index reads.
const (
	// AttrRequestID is the request id attribute carried by every cb.* span.
	AttrRequestID = "request_id"
	// AttrTTFT is an optional attribute of the engine's SERVER span: the time to first token
	// in seconds (int or double).
	AttrTTFT = "gen_ai.server.time_to_first_token"
	// EventFirstToken is an optional event on the engine's SERVER span marking the first
	// token.
	EventFirstToken = "first_token"
)

// RequestSummary is one row of the request index (/api/requests).
type RequestSummary struct {
	// RequestID is the request_id of cb.request, else of the root, else of any span; "" if
	// none carries one.
	RequestID string `json:"request_id"`
	TraceID   string `json:"trace_id"`
	// Root is the root span's name and RootService its service.
	Root        string `json:"root"`
	RootService string `json:"root_service"`
	// StartUnixMicro is the root's start.
	StartUnixMicro int64 `json:"start_us"`
	// DurationMs is the root's duration in milliseconds.
	DurationMs float64 `json:"duration_ms"`
	// TTFTMs is the time to first token in milliseconds, nil when the trace does not say:
	// from the root's gen_ai.server.time_to_first_token attribute (seconds), else its
	// first_token event, else the end of engine.prefill (the prefill runs through the first
	// sampled token). TTFTSource names which.
	TTFTMs     *float64 `json:"ttft_ms"`
	TTFTSource string   `json:"ttft_source,omitempty"`
	// RequestReuse is the lookup outcome and the reuse figures of cb.request.
	RequestReuse
	// Services that recorded spans, sorted.
	Services []string `json:"services"`
	NSpans   int      `json:"n_spans"`
	// Error is true when any span has status ERROR or the root has error.type.
	Error bool `json:"error"`
	// NegativeSpans counts spans that end before they start (a clock problem at the
	// sender); their durations, DurationMs included, are negative as recorded, never
	// repaired.
	NegativeSpans int `json:"negative_spans,omitempty"`
	// Truncated is true when the store refused some of the trace's spans because the trace
	// alone exceeded a store limit (MaxSpans or MaxBytes): the trace is incomplete.
	Truncated bool `json:"truncated,omitempty"`
}

// RequestReuse is how a request's lookup ended and what it reused, from cb.request under
// the names of contract/spans.yaml (Lookup: e.g. "done" or "skipped"); nil (or "") when
// absent.
type RequestReuse struct {
	Lookup               string   `json:"lookup,omitempty"`
	HitRate              *float64 `json:"hit_rate"`
	HitTokens            *int64   `json:"hit_tokens,omitempty"`
	PrefixHitTokens      *int64   `json:"prefix_hit_tokens,omitempty"`
	NonPrefixHitTokens   *int64   `json:"non_prefix_hit_tokens,omitempty"`
	PrefixCoverageTokens *int64   `json:"prefix_coverage_tokens,omitempty"`
	NNonPrefixTokens     *int64   `json:"n_non_prefix_tokens,omitempty"`
	RequestedTokens      *int64   `json:"requested_tokens,omitempty"`
}

// counts returns the token counts by the cb.request attribute they come from.
func (r *RequestReuse) counts() map[string]**int64 {
	return map[string]**int64{"hit_tokens": &r.HitTokens, "prefix_hit_tokens": &r.PrefixHitTokens,
		"non_prefix_hit_tokens": &r.NonPrefixHitTokens, "prefix_coverage_tokens": &r.PrefixCoverageTokens,
		"n_non_prefix_tokens": &r.NNonPrefixTokens, "requested_tokens": &r.RequestedTokens}
}

// clone returns a copy that shares nothing mutable with s.
func (s RequestSummary) clone() RequestSummary {
	s.TTFTMs, s.HitRate = clonePtr(s.TTFTMs), clonePtr(s.HitRate)
	for _, p := range s.counts() {
		*p = clonePtr(*p)
	}
	s.Services = slices.Clone(s.Services)
	return s
}

// clonePtr returns a pointer to a copy of *p, nil for a nil p.
func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// summarize computes the index row of one trace in O(n log n) for n spans (the tree's
// children are sorted); no spans give the zero row.
func summarize(spans []*span) RequestSummary {
	if len(spans) == 0 {
		return RequestSummary{}
	}
	t := buildTree(spans)
	root := spans[t.root]
	s := RequestSummary{
		TraceID:        root.traceID.String(),
		Root:           root.name,
		RootService:    root.res.service,
		StartUnixMicro: root.start / 1000,
		DurationMs:     float64(root.duration()) / 1e6,
		NSpans:         len(spans),
	}
	s.RequestID, _ = requestID(spans)
	_, s.Error = root.attrs.get("error.type")
	services := make(map[string]struct{})
	for _, sp := range spans {
		if _, seen := services[sp.res.service]; !seen {
			services[sp.res.service] = struct{}{}
			s.Services = append(s.Services, sp.res.service)
		}
		if sp.status == ptrace.StatusCodeError {
			s.Error = true
		}
		if sp.end < sp.start {
			s.NegativeSpans++
		}
	}
	slices.Sort(s.Services)

	s.TTFTMs, s.TTFTSource = ttft(t)
	if i := slices.IndexFunc(spans, func(sp *span) bool { return sp.name == spanname.CBRequest }); i >= 0 {
		s.RequestReuse = reuseOf(spans[i])
	}
	return s
}

// ttft finds the time to first token of a trace and where it comes from (see
// RequestSummary.TTFTMs); nil when the trace does not say.
func ttft(t *tree) (*float64, string) {
	root := t.spans[t.root]
	ms := func(ns int64) *float64 { f := float64(ns) / 1e6; return &f }
	if v, ok := root.attrs.get(AttrTTFT); ok {
		if f, ok := v.number(); ok {
			f *= 1e3
			return &f, "attribute"
		}
	}
	for _, ev := range root.events {
		if ev.name == EventFirstToken || ev.name == "gen_ai.first_token" {
			return ms(ev.time - root.start), "event"
		}
	}
	for _, c := range t.children[t.root] {
		if sp := t.spans[c]; sp.name == spanname.EnginePrefill && sp.res.service == root.res.service {
			return ms(sp.end - root.start), spanname.EnginePrefill
		}
	}
	return nil, ""
}

// reuseOf reads the reuse figures of a cb.request span.
func reuseOf(sp *span) RequestReuse {
	var r RequestReuse
	if v, ok := sp.attrs.get("lookup"); ok && v.t == valString {
		r.Lookup = v.s
	}
	if v, ok := sp.attrs.get("hit_rate"); ok {
		if f, ok := v.number(); ok {
			r.HitRate = &f
		}
	}
	for key, p := range r.counts() {
		if v, ok := sp.attrs.get(key); ok && v.t == valInt {
			*p = &v.i
		}
	}
	return r
}

// requestID finds the request id of a trace: cb.request's, else the root-most span's.
func requestID(spans []*span) (string, bool) {
	fallback, found := "", false
	for _, sp := range spans {
		v, ok := sp.attrs.get(AttrRequestID)
		if !ok || v.t != valString || v.s == "" {
			continue
		}
		if sp.name == spanname.CBRequest {
			return v.s, true
		}
		if !found || sp.parentID.IsEmpty() {
			fallback, found = v.s, true
		}
	}
	return fallback, found
}
