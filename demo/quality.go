package demo

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// QualityCheck is the worker's online quality check of a request with reuse: its
// cb.quality span (contract/spans.yaml), the root of its own trace, linked to the
// request's cb.model_forward. The worker prefilled the same prompt in full, off the
// request's path, and compared the next-token distributions over Positions output tokens,
// teacher-forced on the full prefill's greedy continuation.
type QualityCheck struct {
	// TraceID is the check's own trace.
	TraceID string `json:"trace_id"`
	// FirstKL is KL(full ‖ reuse) of the first output token's distribution, MeanKL its
	// mean over the positions, in nats.
	FirstKL float64 `json:"first_kl"`
	MeanKL  float64 `json:"mean_kl"`
	// Top1 is the share of positions whose most likely token agrees; GreedyMatch the
	// leading positions that agree.
	Top1        float64 `json:"top1"`
	GreedyMatch int     `json:"greedy_match"`
	Positions   int     `json:"positions"`
	// RecompRatio and Selected are the request's recompute ratio and the tokens it
	// recomputed; FullMs the check's full prefill time in milliseconds.
	RecompRatio float64 `json:"recomp_ratio"`
	Selected    int     `json:"selected"`
	FullMs      float64 `json:"full_ms"`
}

// errCheckFailed: the worker recorded the check, but it failed (cb.quality with error
// status).
var errCheckFailed = errors.New("the check failed")

// Top1Agree is the number of positions whose most likely token agrees.
func (q QualityCheck) Top1Agree() int { return int(q.Top1*float64(q.Positions) + 0.5) }

// findQuality looks for the cb.quality span of the request with reuse requestID, trace
// traceID: a search by the span's service, name and request_id (a Jaeger tag search, so it
// works against Jaeger too), keeping the span whose link points into traceID. nil, nil
// when there is none yet. found is true when the span is there: then q holds its figures,
// or err says why it has none (the check failed, or a figure is missing).
func findQuality(ctx context.Context, jc *jaeger.Client, service, requestID, traceID string, since time.Time) (q *QualityCheck, found bool, err error) {
	trs, err := jc.FindTraces(ctx, jaeger.Query{Service: service, Operation: spanname.CBQuality,
		Tags: map[string]string{"request_id": requestID}, Start: since, Limit: 20})
	if err != nil {
		return nil, false, err
	}
	want := jaeger.NormalizeTraceID(traceID)
	for _, tr := range trs {
		for i := range tr.Spans {
			s := &tr.Spans[i]
			if s.OperationName != spanname.CBQuality || !linksTo(s, want) {
				continue
			}
			if rid, _ := s.Tag("request_id"); rid.AsString() != requestID {
				continue
			}
			q, err := qualityOf(s)
			return q, true, err
		}
	}
	return nil, false, nil
}

// linksTo reports whether s has a link (FOLLOWS_FROM reference) into trace want
// (normalized).
func linksTo(s *jaeger.Span, want string) bool {
	for _, r := range s.References {
		if r.RefType == jaeger.FollowsFrom && jaeger.NormalizeTraceID(r.TraceID) == want {
			return true
		}
	}
	return false
}

// qualityOf reads a cb.quality span's figures; an error wrapping errCheckFailed when the
// check failed (the span has error status), another when a figure is missing.
func qualityOf(s *jaeger.Span) (*QualityCheck, error) {
	if e, ok := s.Tag("error"); ok && e.AsString() == "true" {
		msg, _ := s.Tag("otel.status_description")
		return nil, fmt.Errorf("%w: %s", errCheckFailed, msg.AsString())
	}
	q := &QualityCheck{TraceID: jaeger.NormalizeTraceID(s.TraceID)}
	floats := map[string]*float64{"first_kl": &q.FirstKL, "mean_kl": &q.MeanKL, "top1": &q.Top1,
		"recomp_ratio": &q.RecompRatio, "full_ms": &q.FullMs}
	ints := map[string]*int{"greedy_match": &q.GreedyMatch, "positions": &q.Positions, "selected": &q.Selected}
	for k, p := range floats {
		kv, ok := s.Tag(k)
		f, err := strconv.ParseFloat(kv.AsString(), 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("cb.quality without a numeric %s", k)
		}
		*p = f
	}
	for k, p := range ints {
		kv, ok := s.Tag(k)
		n, err := strconv.Atoi(kv.AsString())
		if !ok || err != nil {
			return nil, fmt.Errorf("cb.quality without an integer %s", k)
		}
		*p = n
	}
	return q, nil
}

// waitQuality waits, at most wait, for the cb.quality span of a request with reuse the
// worker took for its check (the checker runs after the request, and the span is exported
// in a batch), and returns its figures, or why there are none.
func waitQuality(ctx context.Context, jc *jaeger.Client, service string, r chatResult, wait time.Duration) (*QualityCheck, error) {
	deadline := time.Now().Add(wait)
	since := r.sent.Add(-time.Minute) // the worker's clock may lag the demo's a little
	for {
		q, found, err := findQuality(ctx, jc, service, r.requestID, r.traceID, since)
		if found {
			return q, err
		}
		if time.Now().After(deadline) {
			if err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("no cb.quality span linked to trace %s within %s", r.traceID, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// qualityReader asks for and reads the requests' quality checks; its zero value (no
// trace query URL) reads none.
type qualityReader struct {
	jc      *jaeger.Client
	service string        // of cb.quality (contract/spans.yaml)
	off     string        // why no check is asked for; "" when they are
	wait    time.Duration // for each check
}

// newQualityReader returns the reader of cfg: checks are asked for when the traces can be
// read (QueryURL) and the workers can check (QualityOff is "").
func newQualityReader(cfg Config) (*qualityReader, error) {
	q := &qualityReader{wait: cfg.TraceWait}
	switch {
	case cfg.QueryURL == "":
		q.off = "no trace query URL"
		return q, nil
	case cfg.QualityOff != "":
		q.off = cfg.QualityOff
		return q, nil
	}
	spec, err := contract.Spans()
	if err != nil {
		return nil, err
	}
	q.service = tracestoreWorker
	if s, ok := spec.Lookup(spanname.CBQuality); ok && s.Service != "" {
		q.service = s.Service
	}
	if q.jc, err = jaeger.NewClient(cfg.QueryURL, jaeger.ClientConfig{HTTPClient: &http.Client{Timeout: 10 * time.Second}}); err != nil {
		return nil, err
	}
	return q, nil
}

// tracestoreWorker is the worker's service name, should the contract not name cb.quality's.
const tracestoreWorker = "cb-worker"

// on reports whether requests ask for the check.
func (q *qualityReader) on() bool { return q.off == "" }

// read returns the check of the request with reuse r, or a note saying why there is none.
func (q *qualityReader) read(ctx context.Context, r chatResult) (*QualityCheck, string) {
	switch {
	case !q.on():
		return nil, "not run: " + q.off
	case !r.qualitySampled && r.nonPrefixHit == 0:
		return nil, "not sampled: nothing was reused off the prefix (no blend to check; is blending off for the model?)"
	case !r.qualitySampled:
		return nil, "dropped: the worker did not take the check (its checker was busy or within its CPU budget, --quality-budget; or it is off: --quality-sample-rate 0, tensor-parallel)"
	}
	c, err := waitQuality(ctx, q.jc, q.service, r, q.wait)
	switch {
	case errors.Is(err, errCheckFailed):
		return nil, "failed: " + err.Error()
	case err != nil:
		return nil, "not found: " + err.Error()
	}
	return c, ""
}

// compareOutputs sets r's greedy-output comparison from the streamed content chunks of
// the request with reuse and of its baseline.
func (r *Result) compareOutputs(reuse, full []string) {
	r.Output, r.FullOutput = strings.Join(reuse, ""), strings.Join(full, "")
	r.SameOutput = r.Output == r.FullOutput
	r.OutputChunks = len(reuse)
	r.MatchChunks = 0
	for r.MatchChunks < min(len(reuse), len(full)) && reuse[r.MatchChunks] == full[r.MatchChunks] {
		r.MatchChunks++
	}
}
