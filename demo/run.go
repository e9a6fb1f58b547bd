package demo

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/apiclient"
	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/loadgen"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// Defaults of Config.
const (
	DefaultRequests       = 4
	DefaultDocsPerRequest = 3
	DefaultMaxTokens      = 8
	DefaultTraceWait      = 30 * time.Second
)

// Config configures Run. API is required; zero values of the rest take the
// defaults above.
type Config struct {
	// API is the engine's base URL, e.g. http://127.0.0.1:8000.
	API string
	// APIKey is sent as a bearer token when set.
	APIKey string
	// Model is the served model name; default "cb-llama".
	Model string
	// QueryURL is a Jaeger-compatible query API holding the stack's traces
	// (the embedded collector or Jaeger). Empty: traces are not read and
	// the checks are reported as not run.
	QueryURL string
	// Requests is the number of RAG requests, each sent twice (with reuse
	// and as a full prefill).
	Requests int
	// DocsPerRequest is how many sample documents each prompt holds.
	DocsPerRequest int
	// MaxTokens is the number of tokens generated per request.
	MaxTokens int
	// Seed orders the documents of the prompts.
	Seed uint64
	// TraceWait bounds the wait for a request's trace to be complete in
	// the backend (export is batched).
	TraceWait time.Duration
	// Progress receives a progress bar; nil for none.
	Progress io.Writer
	// Shape is the served model's shape, for the model-only speedup
	// ceiling the report compares the median speedup with; zero: none.
	Shape Shape
	// QualityOff says why the stack's workers cannot check a request's
	// quality against a full prefill (e.g. "the workers run with
	// --quality-sample-rate 0"); "" (the default): every request with
	// reuse asks for the worker's online quality check ("cacheblend":
	// {"quality_check": true}) and the report shows its cb.quality figures
	// (read from QueryURL, waiting at most TraceWait for each).
	QualityOff string
}

// Shape is the shape of the served model that bounds the CacheBlend
// speedup.
type Shape struct {
	Layers      int     `json:"layers"`
	CheckLayer  int     `json:"check_layer"`
	RecompRatio float64 `json:"recomp_ratio"`
}

// Ceiling is the model-only TTFT speedup of CacheBlend when every prompt
// token is reused off the prefix, L/(cl+1+(L−cl−1)·r): the forward computes
// every token in layers 0..cl and the fraction r of them in the rest. 0 for
// a zero or inconsistent shape.
func (m Shape) Ceiling() float64 {
	l, cl, r := float64(m.Layers), float64(m.CheckLayer), m.RecompRatio
	if m.Layers <= 0 || m.CheckLayer < 0 || m.CheckLayer >= m.Layers || r < 0 || r > 1 {
		return 0
	}
	return l / (cl + 1 + (l-cl-1)*r)
}

// Median returns the median of xs (0 for none): loadgen's p50.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return float64(loadgen.Summarize(xs).P50)
}

// Result is one request of the demo, as written to --json.
type Result struct {
	RequestID    string   `json:"request_id"`
	TraceID      string   `json:"trace_id"`
	FullTraceID  string   `json:"full_trace_id"`
	Documents    []string `json:"documents"`
	PromptTokens int      `json:"prompt_tokens"`
	TTFTReuse    float64  `json:"ttft_reuse_s"`
	TTFTFull     float64  `json:"ttft_full_s"`
	Speedup      float64  `json:"speedup"`
	// The reuse request's statistics from its trace.
	TraceStats
	// Engine and FullEngine are the nodes that served the request with
	// reuse and its full-prefill baseline (the gateway's X-Cb-Engine:
	// the engine's host:port, also its service.instance.id on the trace
	// page); "" without a gateway.
	Engine     string `json:"engine,omitempty"`
	FullEngine string `json:"full_engine,omitempty"`
	// Check is the verdict on the reuse request's trace: "pass", "fail: …" or "not run: …".
	Check string `json:"check"`
	// FullLookup is the baseline's lookup outcome ("skipped": reuse off) and FullCheck the
	// verdict on its trace, like Check.
	FullLookup string `json:"full_lookup,omitempty"`
	FullCheck  string `json:"full_check"`
	// Quality is the worker's online check of the request with reuse against a full
	// prefill (its cb.quality span); nil when there is none, and QualityNote says why
	// ("not run: …", "not sampled: …", "dropped: …", "not found: …", "failed: …").
	Quality     *QualityCheck `json:"quality"`
	QualityNote string        `json:"quality_note,omitempty"`
	// Both requests decode greedily (temperature 0): Output and FullOutput are their
	// generated texts, SameOutput whether they are equal, MatchChunks how many leading
	// streamed chunks agree of OutputChunks (the request with reuse's; a chunk is a token,
	// or the tokens of one UTF-8 character).
	Output       string `json:"output"`
	FullOutput   string `json:"full_output"`
	SameOutput   bool   `json:"same_output"`
	MatchChunks  int    `json:"match_chunks"`
	OutputChunks int    `json:"output_chunks"`

	trace *tracecheck.Trace
}

// TraceStats are the statistics a reuse request's trace holds (part of Result). Lookup is
// how its lookup ended (cb.request's lookup: "done" when the blend server answered), the
// numbers are those cb.request and cb.check carry, under the names of contract/spans.yaml;
// nil when the trace was not read.
type TraceStats struct {
	Lookup               string   `json:"lookup,omitempty"`
	HitRate              *float64 `json:"hit_rate"`
	HitTokens            *int64   `json:"hit_tokens"`
	RequestedTokens      *int64   `json:"requested_tokens"`
	PrefixHitTokens      *int64   `json:"prefix_hit_tokens"`
	NonPrefixHitTokens   *int64   `json:"non_prefix_hit_tokens"`
	PrefixCoverageTokens *int64   `json:"prefix_coverage_tokens"`
	NNonPrefixTokens     *int64   `json:"n_non_prefix_tokens"`
	ImpCount             *int64   `json:"imp_count"`
	// ForwardS is the time the worker's model spent on the reuse request's
	// prefill (the cb.model_forward spans that started before the end of
	// engine.prefill), nil when the trace was not read: TTFTReuse minus it
	// is what the serving path added (lookup, retrieve and scatter,
	// queueing, steps, the stream).
	ForwardS *float64 `json:"forward_s,omitempty"`
	// Spans counts the trace's spans and Services names its services, sorted.
	Spans    int      `json:"spans"`
	Services []string `json:"services"`
}

// Report is the demo's outcome.
type Report struct {
	Requests []Result `json:"requests"`
	// Nodes are the per-node totals of the requests with reuse, by engine,
	// when the demo ran through a gateway (cb demo --nodes N).
	Nodes []NodeStats `json:"nodes,omitempty"`
	// Endpoints is filled by the caller (the stack's endpoints file).
	Endpoints any `json:"endpoints,omitempty"`
	// UI is the trace page URL, when known.
	UI string `json:"ui,omitempty"`
	// MedianSpeedup is the median TTFT speedup with reuse over the
	// requests; Shape the served model's shape and Ceiling its model-only
	// speedup ceiling (Shape.Ceiling; 0 when the shape is not known).
	MedianSpeedup float64 `json:"median_speedup"`
	Shape         *Shape  `json:"model_shape,omitempty"`
	Ceiling       float64 `json:"ceiling,omitempty"`
	// QualityChecks counts the requests with a quality check's figures;
	// MeanFirstKL is their mean first-token KL (nats), nil without any, and
	// Top1Agree of Top1Positions their top-1 agreement. SameOutputs counts
	// the requests whose greedy output equals their baseline's.
	QualityChecks int      `json:"quality_checks"`
	MeanFirstKL   *float64 `json:"mean_first_kl"`
	Top1Agree     int      `json:"top1_agree"`
	Top1Positions int      `json:"top1_positions"`
	SameOutputs   int      `json:"same_outputs"`
}

// NodeStats is one node's share of the demo's requests with reuse.
type NodeStats struct {
	// Engine is the node's engine host:port (X-Cb-Engine).
	Engine string `json:"engine"`
	// Requests with reuse it served, and FullRequests full-prefill baselines.
	Requests     int `json:"requests"`
	FullRequests int `json:"full_requests"`
	// HitTokens over RequestedTokens of its requests with reuse (from their
	// traces); HitRate is nil when no trace reported them.
	HitTokens       int64    `json:"hit_tokens"`
	RequestedTokens int64    `json:"requested_tokens"`
	HitRate         *float64 `json:"hit_rate"`
}

// Summarize fills Nodes from Requests: the routing of every request and
// each node's token-weighted hit rate. No-op when no request carries an
// engine (no gateway).
func (r *Report) Summarize() {
	r.Nodes = nil
	by := map[string]*NodeStats{}
	get := func(e string) *NodeStats {
		n := by[e]
		if n == nil {
			n = &NodeStats{Engine: e}
			by[e] = n
		}
		return n
	}
	for _, q := range r.Requests {
		if q.FullEngine != "" {
			get(q.FullEngine).FullRequests++
		}
		if q.Engine == "" {
			continue
		}
		n := get(q.Engine)
		n.Requests++
		if q.HitTokens != nil && q.RequestedTokens != nil {
			n.HitTokens += *q.HitTokens
			n.RequestedTokens += *q.RequestedTokens
		}
	}
	for _, n := range by {
		if n.RequestedTokens > 0 {
			f := float64(n.HitTokens) / float64(n.RequestedTokens)
			n.HitRate = &f
		}
		r.Nodes = append(r.Nodes, *n)
	}
	slices.SortFunc(r.Nodes, func(a, b NodeStats) int { return strings.Compare(a.Engine, b.Engine) })
}

// summarizeQuality fills the quality totals from Requests.
func (r *Report) summarizeQuality() {
	r.QualityChecks, r.MeanFirstKL, r.Top1Agree, r.Top1Positions, r.SameOutputs = 0, nil, 0, 0, 0
	var kl float64
	for _, q := range r.Requests {
		if q.SameOutput {
			r.SameOutputs++
		}
		if q.Quality == nil {
			continue
		}
		r.QualityChecks++
		kl += q.Quality.FirstKL
		r.Top1Agree += q.Quality.Top1Agree()
		r.Top1Positions += q.Quality.Positions
	}
	if r.QualityChecks > 0 {
		m := kl / float64(r.QualityChecks)
		r.MeanFirstKL = &m
	}
}

// ChecksPassed reports whether the traces of every request, with reuse and
// its full-prefill baseline, passed the contract check (false when the
// checks did not run).
func (r *Report) ChecksPassed() bool {
	if len(r.Requests) == 0 {
		return false
	}
	for _, q := range r.Requests {
		if q.Check != "pass" || q.FullCheck != "pass" {
			return false
		}
	}
	return true
}

// questions end the RAG prompts.
var questions = []string{
	"Question: which technique in these documents shortens the time to the first token, and why?",
	"Question: how do the documents above keep memory use bounded?",
	"Question: what does each document say about measuring latency?",
	"Question: summarise the documents above in one sentence each.",
}

// Prompt builds the user message of a RAG request: the documents, then
// the question.
func Prompt(docs []Document, question string) string {
	var sb strings.Builder
	sb.WriteString("Answer using only these documents.\n\n")
	for _, d := range docs {
		sb.WriteString(d.Text)
		sb.WriteString("\n\n")
	}
	sb.WriteString(question)
	return sb.String()
}

// Run ingests the sample documents and runs the requests, each with reuse
// and as a full prefill, then reads the traces of both and checks them
// against contract/spans.yaml.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.API == "" {
		return nil, errors.New("demo: no engine API URL")
	}
	cfg.Model = cmp.Or(cfg.Model, defaults.Model)
	if cfg.Requests <= 0 {
		cfg.Requests = DefaultRequests
	}
	if cfg.DocsPerRequest <= 0 {
		cfg.DocsPerRequest = DefaultDocsPerRequest
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = DefaultMaxTokens
	}
	if cfg.TraceWait <= 0 {
		cfg.TraceWait = DefaultTraceWait
	}
	hc := &http.Client{Timeout: 5 * time.Minute}
	c := apiclient.New(cfg.API, apiclient.Config{APIKey: cfg.APIKey, HTTPClient: hc})
	if err := c.WaitHealthy(ctx, 60*time.Second); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	chat := &chatClient{base: cfg.API, apiKey: cfg.APIKey, hc: hc}
	qc, err := newQualityReader(cfg)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	docs := Documents()
	cfg.DocsPerRequest = min(cfg.DocsPerRequest, len(docs))
	bar := newProgress(cfg.Progress, 1+2*cfg.Requests)
	bar.step("ingesting documents")
	if err := c.Ingest(ctx, docs); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xcb))
	rep := &Report{}
	var speedups []float64
	for i := range cfg.Requests {
		// Documents in varying order and positions: a random subset,
		// shuffled, so each appears at offsets it was not stored at.
		perm := rng.Perm(len(docs))[:cfg.DocsPerRequest]
		picked := make([]Document, len(perm))
		ids := make([]string, len(perm))
		for j, k := range perm {
			picked[j], ids[j] = docs[k], docs[k].ID
		}
		q := chatRequest{model: cfg.Model, content: Prompt(picked, questions[i%len(questions)]), maxTokens: cfg.MaxTokens,
			qualityCheck: qc.on()}
		bar.step(fmt.Sprintf("request %d/%d with reuse", i+1, cfg.Requests))
		reuse, err := chat.stream(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		// The check runs on the worker after the request: waited for here, so that it
		// does not share the machine with the baseline's prefill (and slow it).
		check, note := qc.read(ctx, reuse)
		bar.step(fmt.Sprintf("request %d/%d full prefill", i+1, cfg.Requests))
		q.noReuse, q.qualityCheck = true, false
		full, err := chat.stream(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		speedups = append(speedups, full.ttft.Seconds()/reuse.ttft.Seconds())
		res := Result{
			RequestID: reuse.requestID, TraceID: reuse.traceID, FullTraceID: full.traceID, Documents: ids,
			PromptTokens: reuse.promptTokens,
			TTFTReuse:    reuse.ttft.Seconds(), TTFTFull: full.ttft.Seconds(), Speedup: speedups[i],
			Engine: reuse.engine, FullEngine: full.engine,
			Quality: check, QualityNote: note,
		}
		res.compareOutputs(reuse.tokens, full.tokens)
		rep.Requests = append(rep.Requests, res)
	}
	bar.done()
	rep.MedianSpeedup = Median(speedups)
	rep.summarizeQuality()
	if c := cfg.Shape.Ceiling(); c > 0 {
		m := cfg.Shape
		rep.Shape, rep.Ceiling = &m, c
	}
	if cfg.QueryURL == "" {
		for i := range rep.Requests {
			rep.Requests[i].Check = "not run: no trace query URL"
			rep.Requests[i].FullCheck = rep.Requests[i].Check
		}
	} else {
		err = readTraces(ctx, cfg, rep)
	}
	rep.Summarize()
	return rep, err
}

// expectedSpans are what a complete reuse trace holds, once every
// process's batch has been exported.
var expectedSpans = []string{spanname.CBRequest, spanname.CBLookup, spanname.CBExecute, spanname.CBScatter, spanname.CBPartial}

// expectedBaselineSpans are what a complete full-prefill trace holds: no
// lookup, no reuse.
var expectedBaselineSpans = []string{spanname.CBRequest, spanname.CBExecute, spanname.CBModelForward}

// readTraces waits for the traces of each request, with reuse and its
// baseline, to be complete in the backend, then fills in the statistics
// and the contract checks.
func readTraces(ctx context.Context, cfg Config, rep *Report) error {
	jc, err := jaeger.NewClient(cfg.QueryURL, jaeger.ClientConfig{HTTPClient: &http.Client{Timeout: 10 * time.Second}})
	if err != nil {
		return err
	}
	spec, err := contract.Spans()
	if err != nil {
		return err
	}
	for i := range rep.Requests {
		r := &rep.Requests[i]
		tr, err := waitTrace(ctx, jc, r.TraceID, expectedSpans, cfg.TraceWait)
		if err != nil {
			r.Check = "not run: " + err.Error()
		} else {
			r.trace = tr
			fill(r, tr)
			r.Check = verdict(tr, spec)
		}
		full, err := waitTrace(ctx, jc, r.FullTraceID, expectedBaselineSpans, cfg.TraceWait)
		if err != nil {
			r.FullCheck = "not run: " + err.Error()
			continue
		}
		r.FullLookup = stringAttr(full, spanname.CBRequest, "lookup")
		r.FullCheck = verdict(full, spec)
	}
	return nil
}

// verdict checks one trace against the contract: "pass" or "fail: …".
func verdict(tr *tracecheck.Trace, spec *contract.SpanSet) string {
	res := tracecheck.Check([]tracecheck.Trace{*tr}, spec)
	if res.OK() {
		return "pass"
	}
	var msgs []string
	for _, t := range res.Traces {
		for _, v := range t.Violations {
			msgs = append(msgs, v.String())
		}
	}
	return "fail: " + strings.Join(msgs, "; ")
}

// stringAttr is the string attribute key of the first span named name, or "".
func stringAttr(t *tracecheck.Trace, name, key string) string {
	for i := range t.Spans {
		if t.Spans[i].Name == name {
			if v, ok := t.Spans[i].Attributes[key]; ok && v.Type == tracecheck.ValueString {
				return v.Str
			}
		}
	}
	return ""
}

func waitTrace(ctx context.Context, jc *jaeger.Client, traceID string, want []string, wait time.Duration) (*tracecheck.Trace, error) {
	deadline := time.Now().Add(wait)
	var last error
	for {
		jt, err := jc.Trace(ctx, traceID)
		if err == nil {
			trs, cerr := tracecheck.FromJaeger(jt)
			if cerr == nil && len(trs) == 1 && complete(&trs[0], want) {
				return &trs[0], nil
			}
			last = fmt.Errorf("trace %s incomplete", traceID)
		} else {
			last = err
		}
		if time.Now().After(deadline) {
			return nil, last
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// complete reports whether t holds a span of every name in want.
func complete(t *tracecheck.Trace, want []string) bool {
	for _, n := range want {
		if !slices.ContainsFunc(t.Spans, func(s tracecheck.Span) bool { return s.Name == n }) {
			return false
		}
	}
	return true
}

// numAttr is the numeric attribute key of s as a T, nil when it is absent or not a number.
func numAttr[T int64 | float64](s *tracecheck.Span, key string) *T {
	f, ok := s.Attributes[key].Number() // an absent key's zero Value is not a number
	if !ok {
		return nil
	}
	n := T(f)
	return &n
}

// prefillForward sums the cb.model_forward spans of t that started before
// engine.prefill ended (the prefill's forwards); false without
// engine.prefill.
func prefillForward(t *tracecheck.Trace) (time.Duration, bool) {
	var end time.Time
	for i := range t.Spans {
		if t.Spans[i].Name == spanname.EnginePrefill {
			end = t.Spans[i].End
		}
	}
	if end.IsZero() {
		return 0, false
	}
	var d time.Duration
	for i := range t.Spans {
		if s := &t.Spans[i]; s.Name == spanname.CBModelForward && s.Start.Before(end) {
			d += s.Duration()
		}
	}
	return d, true
}

// fill sets r's trace statistics (and its request id, when cb.request has one) from t.
func fill(r *Result, t *tracecheck.Trace) {
	r.Spans = len(t.Spans)
	if d, ok := prefillForward(t); ok {
		f := d.Seconds()
		r.ForwardS = &f
	}
	for i := range t.Spans {
		s := &t.Spans[i]
		r.Services = append(r.Services, s.Service)
		switch s.Name {
		case spanname.CBRequest:
			r.HitRate = numAttr[float64](s, "hit_rate")
			r.HitTokens = numAttr[int64](s, "hit_tokens")
			r.RequestedTokens = numAttr[int64](s, "requested_tokens")
			r.PrefixHitTokens = numAttr[int64](s, "prefix_hit_tokens")
			r.NonPrefixHitTokens = numAttr[int64](s, "non_prefix_hit_tokens")
			r.PrefixCoverageTokens = numAttr[int64](s, "prefix_coverage_tokens")
			r.NNonPrefixTokens = numAttr[int64](s, "n_non_prefix_tokens")
			r.Lookup = s.Attributes["lookup"].Str
			r.RequestID = cmp.Or(s.Attributes["request_id"].Str, r.RequestID)
		case spanname.CBCheck:
			r.ImpCount = numAttr[int64](s, "imp_count")
		}
	}
	slices.Sort(r.Services)
	r.Services = slices.Compact(r.Services)
}

// Print writes the human report: the table, the text waterfall of the
// slowest request, and the check verdicts.
func (r *Report) Print(w io.Writer) {
	routed := len(r.Nodes) > 0
	node := func(e string) string {
		if !routed {
			return ""
		}
		return fmt.Sprintf(" %-21s", cmp.Or(e, "-"))
	}
	fmt.Fprintf(w, "\n%-4s %-26s %10s %10s %8s %-13s %-6s %9s %8s %8s %10s %5s %6s %-8s%s\n",
		"#", "request", "ttft reuse", "ttft full", "speedup", "KL · top-1", "output", "overhead", "hit", "prefix", "non-prefix", "imp", "spans", "services", node("node"))
	for i, q := range r.Requests {
		fmt.Fprintf(w, "%-4d %-26s %9.0fms %9.0fms %7.2fx %-13s %-6s %9s %8s %8s %10s %5s %6d %-8d%s\n",
			i+1, short(q.RequestID, 26), q.TTFTReuse*1000, q.TTFTFull*1000, q.Speedup, qualityCell(q), outputCell(q), overhead(q),
			pct(q.HitRate), num(q.PrefixHitTokens), num(q.NonPrefixHitTokens), num(q.ImpCount), q.Spans, len(q.Services), node(q.Engine))
	}
	if len(r.Requests) > 0 {
		fmt.Fprintf(w, "\nMedian TTFT speedup with reuse: %.2fx", r.MedianSpeedup)
		if r.Ceiling > 0 {
			fmt.Fprintf(w, "; model-only ceiling L/(cl+1+(L-cl-1)·r) = %.2fx (L=%d, cl=%d, r=%.2f): %.2f of it",
				r.Ceiling, r.Shape.Layers, r.Shape.CheckLayer, r.Shape.RecompRatio, r.MedianSpeedup/r.Ceiling)
		}
		if r.MeanFirstKL != nil {
			fmt.Fprintf(w, "; quality: mean first-token KL %.4f over %d checks, top-1 %d/%d", *r.MeanFirstKL, r.QualityChecks, r.Top1Agree, r.Top1Positions)
		} else {
			fmt.Fprint(w, "; quality: no check")
		}
		fmt.Fprintf(w, "; greedy output = the full prefill's in %d/%d\n", r.SameOutputs, len(r.Requests))
		fmt.Fprintln(w, "(overhead: the reuse request's TTFT beyond its prefill's cb.model_forward time, and its share of the TTFT)")
		fmt.Fprintln(w, "(KL · top-1: the worker's check of the reuse request against a full prefill of the same prompt (cb.quality):")
		fmt.Fprintln(w, " KL(full ‖ reuse) of the first output token in nats, and the output positions whose most likely token")
		fmt.Fprintln(w, " agrees; output: \"same\" when the greedy output equals the full prefill's, else its leading streamed tokens that do)")
		for i, q := range r.Requests {
			if q.Quality == nil && q.QualityNote != "" {
				fmt.Fprintf(w, "  %d. quality %s\n", i+1, q.QualityNote)
			}
		}
	}
	if routed {
		fmt.Fprintln(w, "\nRouting — the node (engine) that served each request with reuse, and its hit rate:")
		fmt.Fprintf(w, "  %-21s %8s %8s %12s %8s\n", "node", "requests", "baseline", "hit tokens", "hit")
		for _, n := range r.Nodes {
			fmt.Fprintf(w, "  %-21s %8d %8d %12s %8s\n", n.Engine, n.Requests, n.FullRequests,
				fmt.Sprintf("%d/%d", n.HitTokens, n.RequestedTokens), pct(n.HitRate))
		}
	}
	var slow *Result
	for i := range r.Requests {
		if q := &r.Requests[i]; q.trace != nil && (slow == nil || q.TTFTReuse > slow.TTFTReuse) {
			slow = q
		}
	}
	if slow != nil {
		fmt.Fprintf(w, "\nWhere the time went — the slowest request with reuse (%s, trace %s):\n", slow.RequestID, slow.TraceID)
		Waterfall(w, slow.trace, 48)
	}
	fmt.Fprintln(w, "\nTrace checks against contract/spans.yaml (with reuse, then the full-prefill baseline):")
	for i, q := range r.Requests {
		fmt.Fprintf(w, "  %d. %s  %s\n", i+1, q.TraceID, q.Check)
		fmt.Fprintf(w, "     %s  %s\n", q.FullTraceID, q.FullCheck)
	}
	if r.UI != "" {
		fmt.Fprintf(w, "\nTrace page: %s\n", r.UI)
	}
}

// WriteJSON writes the report as JSON to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func pct(f *float64) string {
	if f == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", *f*100)
}

func num(n *int64) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}

// Waterfall writes a text waterfall of t: one line per span in tree order,
// with its service, start offset, duration and a bar of width columns.
func Waterfall(w io.Writer, t *tracecheck.Trace, width int) {
	if t == nil || len(t.Spans) == 0 {
		return
	}
	ids := map[string]bool{}
	for _, s := range t.Spans {
		ids[s.SpanID] = true
	}
	var roots []*tracecheck.Span
	kids := map[string][]*tracecheck.Span{}
	t0, t1 := t.Spans[0].Start, t.Spans[0].End
	for i := range t.Spans {
		s := &t.Spans[i]
		if ids[s.ParentSpanID] {
			kids[s.ParentSpanID] = append(kids[s.ParentSpanID], s)
		} else {
			roots = append(roots, s)
		}
		if s.Start.Before(t0) {
			t0 = s.Start
		}
		if s.End.After(t1) {
			t1 = s.End
		}
	}
	byStart := func(a, b *tracecheck.Span) int { return a.Start.Compare(b.Start) }
	slices.SortFunc(roots, byStart)
	total := t1.Sub(t0)
	if total <= 0 {
		total = time.Nanosecond
	}
	var walk func(s *tracecheck.Span, depth int)
	walk = func(s *tracecheck.Span, depth int) {
		a := int(float64(s.Start.Sub(t0)) / float64(total) * float64(width))
		b := int(float64(s.End.Sub(t0)) / float64(total) * float64(width))
		b = max(b, a+1)
		bar := strings.Repeat(" ", min(a, width)) + strings.Repeat("█", max(0, min(b, width)-min(a, width)))
		name := strings.Repeat("  ", depth) + s.Name
		fmt.Fprintf(w, "  %-34s %-10s %8.1fms %8.1fms |%-*s|\n", short(name, 34), s.Service,
			float64(s.Start.Sub(t0).Microseconds())/1000, float64(s.Duration().Microseconds())/1000, width, bar)
		ks := kids[s.SpanID]
		slices.SortFunc(ks, byStart)
		for _, k := range ks {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
}

// progress draws a one-line progress bar.
type progress struct {
	w     io.Writer
	n, i  int
	start time.Time
}

func newProgress(w io.Writer, n int) *progress { return &progress{w: w, n: n, start: time.Now()} }

func (p *progress) step(what string) {
	if p.w == nil {
		return
	}
	p.i++
	const width = 30
	fill := p.i * width / p.n
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d %-36s %5.1fs", strings.Repeat("#", fill), strings.Repeat(".", width-fill), p.i, p.n, what, time.Since(p.start).Seconds())
}

func (p *progress) done() {
	if p.w != nil {
		fmt.Fprintf(p.w, "\r[%s] %d/%d %-36s %5.1fs\n", strings.Repeat("#", 30), p.n, p.n, "done", time.Since(p.start).Seconds())
	}
}

// qualityCell renders a request's quality check for the table: first-token KL and top-1
// agreement, else the first word of why there is none ("dropped", "not sampled", …).
func qualityCell(q Result) string {
	if c := q.Quality; c != nil {
		return fmt.Sprintf("%.4f %d/%d", c.FirstKL, c.Top1Agree(), c.Positions)
	}
	note, _, _ := strings.Cut(q.QualityNote, ":")
	return cmp.Or(note, "-")
}

// outputCell renders the greedy-output comparison: "same", else the leading streamed
// chunks that agree.
func outputCell(q Result) string {
	if q.SameOutput {
		return "same"
	}
	return fmt.Sprintf("%d/%d", q.MatchChunks, q.OutputChunks)
}

// overhead renders the serving path's share of a reuse request's TTFT:
// TTFT minus the prefill's forward time, in ms and percent; "-" without a
// trace.
func overhead(q Result) string {
	if q.ForwardS == nil || q.TTFTReuse <= 0 {
		return "-"
	}
	o := q.TTFTReuse - *q.ForwardS
	return fmt.Sprintf("%.0fms %.0f%%", o*1000, 100*o/q.TTFTReuse)
}
