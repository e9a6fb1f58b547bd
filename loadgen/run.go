package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cacheblend/cacheblend/apiclient"
)

// Why a run stopped issuing requests (Report.StoppedBy).
const (
	StoppedByRequests = "requests" // every one of Config.Requests was sent
	StoppedByDuration = "duration" // Config.Duration elapsed first
	StoppedByCanceled = "canceled" // the caller's context was cancelled
)

// Error kinds of a failed request (Result.ErrorKind, the keys of Report.Errors), as package
// apiclient classifies them. An HTTP error status is "http_<code>", e.g. "http_503".
const (
	KindConnection = apiclient.KindConnection // the request could not be sent or the response read
	KindTimeout    = apiclient.KindTimeout    // Config.RequestTimeout elapsed
	KindCanceled   = apiclient.KindCanceled   // the run was cancelled or its grace period ended
	KindStream     = apiclient.KindStream     // the stream carried an error event
	KindBadStream  = apiclient.KindBadStream  // an event that is not valid JSON, or an oversized line
	KindTruncated  = apiclient.KindTruncated  // the stream ended before data: [DONE]
	KindNoTokens   = apiclient.KindNoTokens   // the stream completed without any content
)

// errGraceOver is the cancel cause of requests still running when the grace period ended.
var errGraceOver = errors.New("the run's grace period ended")

// Result is one request of a run.
type Result struct {
	// Index is the request's number, 0-based, in issue order.
	Index int `json:"index"`
	// TraceID is the trace id of the traceparent the request carried.
	TraceID string `json:"trace_id"`
	// RequestID is the engine's request id (X-Request-Id, else the chunk id), when known.
	RequestID string `json:"request_id,omitempty"`
	// Documents are the corpus IDs in the prompt, in order; DocOffsets their byte offsets
	// in the user message; Prefix the filler bytes before them.
	Documents  []string `json:"documents"`
	DocOffsets []int    `json:"doc_offsets"`
	Prefix     int      `json:"prefix_bytes"`
	// Scheduled is the open-loop arrival time and Start the send time, both from the start
	// of the run (equal in a closed loop).
	Scheduled Seconds `json:"scheduled_s"`
	Start     Seconds `json:"start_s"`
	// Status is the HTTP status, 0 when none was received.
	Status int `json:"status"`
	// TTFT is the time to the first content delta; E2E to the end of the stream (or the
	// failure); TPOT is (E2E − TTFT)/(n − 1) for n ≥ 2 output tokens. Null when undefined.
	TTFT Seconds `json:"ttft_s"`
	TPOT Seconds `json:"tpot_s"`
	E2E  Seconds `json:"e2e_s"`
	// PromptTokens and OutputTokens come from the usage chunk (OutputTokens counts content
	// chunks when the stream had no usage; Usage is then false).
	PromptTokens int  `json:"prompt_tokens"`
	OutputTokens int  `json:"output_tokens"`
	Usage        bool `json:"usage"`
	// BlendReused counts the prompt tokens reused from stored chunks at
	// other positions (usage.cacheblend.non_prefix_hit_tokens), and
	// QualitySampled reports that the worker took the request for its
	// online quality check (usage.cacheblend.quality_sampled).
	BlendReused    int  `json:"blend_reused_tokens,omitempty"`
	QualitySampled bool `json:"quality_sampled,omitempty"`
	// ErrorKind (one of the Kind* constants or "http_<code>") and Error describe a failure.
	ErrorKind string `json:"error_kind,omitempty"`
	Error     string `json:"error,omitempty"`
}

// OK reports whether the request succeeded.
func (r *Result) OK() bool { return r.ErrorKind == "" }

// runner executes one run; its fields are fixed before the workers start, except the
// counters (atomics) and results (mu).
type runner struct {
	cfg     Config
	c       *apiclient.Client
	prompts promptGen
	start   time.Time

	sent, done, failed, inflight, delayed atomic.Int64

	mu      sync.Mutex
	results []Result
}

// Run sends the configured load to cfg.API and returns its report. It waits for /health,
// ingests the corpus when cfg.Ingest, scrapes cfg.MetricsURL (unless SkipServerCheck),
// issues requests until cfg.Requests were sent or cfg.Duration elapsed, waits up to
// cfg.Grace for those in flight, then scrapes again and fills Report.Server.
//
// A bad Config is an error wrapping ErrConfig; an unhealthy engine or a failed ingest is an
// error with no report. Failed requests are not errors of Run: they are counted in the
// report (see Report.Err). When ctx is cancelled mid-run, Run returns the partial report
// (StoppedBy "canceled", no server check) together with ctx's error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	hc := cfg.HTTPClient
	if hc == nil {
		tr := &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        cfg.Concurrency + 4,
			MaxIdleConnsPerHost: cfg.Concurrency + 4,
			IdleConnTimeout:     30 * time.Second,
		}
		defer tr.CloseIdleConnections()
		hc = &http.Client{Transport: tr}
	}
	c := apiclient.New(cfg.API, apiclient.Config{APIKey: cfg.APIKey, HTTPClient: hc})

	if err := c.WaitHealthy(ctx, cfg.HealthWait); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	if cfg.Ingest {
		ictx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
		err := c.Ingest(ictx, cfg.Documents)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
	}
	var before scrape
	var beforeErr error
	if !cfg.SkipServerCheck {
		before, beforeErr = scrapeMetrics(ctx, c, cfg.MetricsURL)
	}

	r := &runner{
		cfg: cfg, c: c,
		prompts: promptGen{docs: cfg.Documents, k: cfg.DocsPerRequest, maxPrefix: cfg.MaxPrefix, seed: cfg.Seed},
		start:   time.Now(),
	}
	stopProgress := r.startProgress()
	stoppedBy := r.execute(ctx)
	stopProgress()

	rep := r.report(stoppedBy)
	if ctx.Err() != nil {
		return rep, fmt.Errorf("loadgen: run cancelled: %w", ctx.Err())
	}
	if !cfg.SkipServerCheck {
		if beforeErr != nil {
			rep.Server = &ServerCheck{MetricsURL: cfg.MetricsURL, RequestsSent: rep.Sent, Error: beforeErr.Error()}
		} else {
			rep.Server = crossCheck(ctx, c, cfg.MetricsURL, before, rep.Sent, rep.TTFT, cfg.SettleTimeout)
		}
	}
	return rep, nil
}

// execute issues the requests and waits for them; it returns why issuing stopped.
func (r *runner) execute(ctx context.Context) string {
	// Requests run under hard (the grace period's end); new ones start only under issue.
	hard, cancelHard := context.WithDeadlineCause(ctx, r.start.Add(r.cfg.Duration+r.cfg.Grace), errGraceOver)
	defer cancelHard()
	issue, cancelIssue := context.WithDeadline(hard, r.start.Add(r.cfg.Duration))
	defer cancelIssue()
	if r.cfg.Rate > 0 {
		r.openLoop(issue, hard)
	} else {
		r.closedLoop(issue, hard)
	}
	switch {
	case ctx.Err() != nil:
		return StoppedByCanceled
	case int(r.sent.Load()) >= r.cfg.Requests:
		return StoppedByRequests
	default:
		return StoppedByDuration
	}
}

// closedLoop runs Concurrency workers, each sending its next request when the previous ends.
func (r *runner) closedLoop(issue, hard context.Context) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Go(func() {
			for issue.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= r.cfg.Requests {
					return
				}
				r.one(hard, i, time.Since(r.start))
			}
		})
	}
	wg.Wait()
}

// openLoop starts requests at their arrival times, at most Concurrency in flight; an arrival
// finding no free slot waits for one and is counted as delayed.
func (r *runner) openLoop(issue, hard context.Context) {
	slots := make(chan struct{}, r.cfg.Concurrency)
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x10ad))
	var wg sync.WaitGroup
	defer wg.Wait()
	atSec := 0.0 // arrival time in seconds: a float, so a tiny rate cannot overflow a Duration
	for i := range r.cfg.Requests {
		if i > 0 {
			gap := 1 / r.cfg.Rate
			if r.cfg.Poisson {
				gap = rng.ExpFloat64() / r.cfg.Rate
			}
			atSec += gap
		}
		if atSec >= r.cfg.Duration.Seconds() {
			return // the next arrival falls after the run's duration
		}
		at := time.Duration(atSec * float64(time.Second))
		if !sleepUntil(issue, r.start.Add(at)) {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			r.delayed.Add(1)
			select {
			case slots <- struct{}{}:
			case <-issue.Done():
				return
			}
		}
		sched := at
		wg.Go(func() {
			defer func() { <-slots }()
			r.one(hard, i, sched)
		})
	}
}

// sleepUntil waits until t; false when ctx ended first (or had ended).
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// one sends request i and records its result.
func (r *runner) one(ctx context.Context, i int, scheduled time.Duration) {
	p := r.prompts.build(i)
	r.sent.Add(1)
	r.inflight.Add(1)
	nan := Seconds(math.NaN())
	res := Result{
		Index: i, Documents: p.docs, DocOffsets: p.offsets, Prefix: p.prefix,
		Scheduled: Seconds(scheduled.Seconds()), Start: Seconds(time.Since(r.start).Seconds()),
		TTFT: nan, TPOT: nan, E2E: nan,
	}
	g, err := r.c.ChatStream(ctx, apiclient.ChatRequest{
		Model: r.cfg.Model, Content: p.content, MaxTokens: r.cfg.MaxTokens,
		IgnoreEOS: true, NoReuse: r.cfg.NoReuse, Timeout: r.cfg.RequestTimeout,
	})
	r.inflight.Add(-1)
	res.TraceID, res.RequestID, res.Status = g.TraceID, g.RequestID, g.Status
	res.PromptTokens, res.OutputTokens, res.Usage = g.PromptTokens, g.OutputTokens, g.Usage
	if cb := g.CacheBlend; cb != nil {
		res.BlendReused, res.QualitySampled = cb.NonPrefixHitTokens, cb.QualitySampled
	}
	if g.E2E > 0 {
		res.E2E = Seconds(g.E2E.Seconds())
	}
	if err != nil {
		res.ErrorKind, res.Error = KindConnection, err.Error()
		if re, ok := errors.AsType[*apiclient.Error](err); ok {
			res.ErrorKind = re.Kind
		}
		r.failed.Add(1)
	} else {
		res.TTFT = Seconds(g.TTFT.Seconds())
		if n := g.OutputTokens; n >= 2 {
			res.TPOT = Seconds((g.E2E - g.TTFT).Seconds() / float64(n-1))
		}
	}
	r.done.Add(1)
	r.mu.Lock()
	r.results = append(r.results, res)
	r.mu.Unlock()
}

// report builds the Report from the finished run.
func (r *runner) report(stoppedBy string) *Report {
	elapsed := time.Since(r.start)
	r.mu.Lock()
	results := slices.Clone(r.results)
	r.mu.Unlock()
	slices.SortFunc(results, func(a, b Result) int { return a.Index - b.Index })
	cfg := r.cfg
	rep := &Report{Requests: results, Settings: Settings{
		API: cfg.API, Model: cfg.Model, Mode: "closed loop", Concurrency: cfg.Concurrency, Rate: cfg.Rate,
		Poisson: cfg.Poisson, RequestLimit: cfg.Requests, DurationLimit: Seconds(cfg.Duration.Seconds()),
		MaxTokens: cfg.MaxTokens, DocsPerRequest: cfg.DocsPerRequest, Corpus: len(cfg.Documents),
		MaxPrefix: cfg.MaxPrefix, Reuse: !cfg.NoReuse, Ingested: cfg.Ingest, Seed: cfg.Seed,
	}, Outcome: Outcome{
		StartedAt: r.start.UTC(), Elapsed: Seconds(elapsed.Seconds()), StoppedBy: stoppedBy,
		Sent: len(results), Delayed: int(r.delayed.Load()), Errors: map[string]int{},
	}}
	if cfg.Rate > 0 {
		rep.Mode = "open loop"
	}
	var ttft, tpot, e2e, sampled, others []float64
	for i := range results {
		q := &results[i]
		rep.PromptTokens += int64(q.PromptTokens)
		if !q.OK() {
			rep.Failed++
			rep.Errors[q.ErrorKind]++
			continue
		}
		rep.Succeeded++
		rep.OutputTokens += int64(q.OutputTokens)
		ttft = append(ttft, float64(q.TTFT))
		switch {
		case q.QualitySampled:
			sampled = append(sampled, float64(q.TTFT))
		case q.BlendReused > 0:
			others = append(others, float64(q.TTFT))
		}
		e2e = append(e2e, float64(q.E2E))
		if !math.IsNaN(float64(q.TPOT)) {
			tpot = append(tpot, float64(q.TPOT))
		}
	}
	rep.TTFT, rep.TPOT, rep.E2E = Summarize(ttft), Summarize(tpot), Summarize(e2e)
	if len(sampled) > 0 {
		rep.QualitySampled = &QualitySplit{Sampled: Summarize(sampled), Others: Summarize(others)}
	}
	if s := elapsed.Seconds(); s > 0 {
		rep.RequestRate = float64(rep.Succeeded) / s
		rep.OutputTokenRate = float64(rep.OutputTokens) / s
	}
	return rep
}
