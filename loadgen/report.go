package loadgen

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Errors Report.Err joins; callers test them with errors.Is.
var (
	// ErrRequestsFailed: at least one request failed.
	ErrRequestsFailed = errors.New("loadgen: some requests failed")
	// ErrCountMismatch: the server counted a different number of requests than were sent.
	ErrCountMismatch = errors.New("loadgen: the server's request count differs from the requests sent")
	// ErrServerCheck: the server's metrics could not be read, so nothing was cross-checked.
	ErrServerCheck = errors.New("loadgen: the server cross-check did not run")
)

// Report is the outcome of a run, written by Print and WriteJSON. Latencies are in seconds.
// Its methods only read it and may run concurrently; do not mutate it meanwhile. Its parts
// are embedded, so their fields are the report's in Go and in JSON.
type Report struct {
	Settings
	Outcome
	// TTFT, TPOT and E2E summarise the client's measurements of successful requests.
	Latencies[Summary]
	// QualitySampled splits the TTFT of the successful requests reused
	// through CacheBlend by whether the worker took them for its online
	// quality check; nil when it took none.
	QualitySampled *QualitySplit `json:"quality_sampled,omitempty"`
	// Server is the cross-check against /metrics; nil when it was skipped.
	Server *ServerCheck `json:"server,omitempty"`
	// Requests are every request sent, by Index.
	Requests []Result `json:"requests"`
}

// QualitySplit is the TTFT of the requests the worker took for its online
// quality check (usage.cacheblend.quality_sampled) and of the other
// requests that reused chunks (non_prefix_hit_tokens > 0): a check must
// not slow the request it samples.
type QualitySplit struct {
	Sampled Summary `json:"sampled_ttft"`
	Others  Summary `json:"others_ttft"`
}

// Settings are a run's settings, defaults applied (part of Report).
type Settings struct {
	API            string  `json:"api"`
	Model          string  `json:"model"`
	Mode           string  `json:"mode"` // "closed loop" or "open loop"
	Concurrency    int     `json:"concurrency"`
	Rate           float64 `json:"rate"`
	Poisson        bool    `json:"poisson"`
	RequestLimit   int     `json:"request_limit"`
	DurationLimit  Seconds `json:"duration_limit_s"`
	MaxTokens      int     `json:"max_tokens"`
	DocsPerRequest int     `json:"docs_per_request"`
	Corpus         int     `json:"corpus_documents"`
	MaxPrefix      int     `json:"max_prefix_bytes"`
	Reuse          bool    `json:"reuse"`
	Ingested       bool    `json:"ingested"`
	Seed           uint64  `json:"seed"`
}

// Outcome is what a run did: when and how long, the requests it sent and their tokens (part
// of Report).
type Outcome struct {
	// StartedAt is when the first request could start; Elapsed the run's wall time until
	// the last request ended; StoppedBy one of the StoppedBy* constants.
	StartedAt time.Time `json:"started_at"`
	Elapsed   Seconds   `json:"elapsed_s"`
	StoppedBy string    `json:"stopped_by"`

	// Sent = Succeeded + Failed. Delayed counts open-loop arrivals that waited for a slot.
	Sent      int `json:"sent"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Delayed   int `json:"delayed"`
	// Errors counts failed requests by Result.ErrorKind.
	Errors map[string]int `json:"errors"`

	// RequestRate is successful requests per second of Elapsed; OutputTokenRate their
	// output tokens per second. PromptTokens sums every request's, OutputTokens the
	// successful ones'.
	RequestRate     float64 `json:"request_rate"`
	OutputTokenRate float64 `json:"output_token_rate"`
	PromptTokens    int64   `json:"prompt_tokens"`
	OutputTokens    int64   `json:"output_tokens"`
}

// Err returns nil when every request succeeded and the server (when checked) counted
// exactly the requests sent; otherwise it joins ErrRequestsFailed, ErrCountMismatch and
// ErrServerCheck as they apply, with the numbers. A TTFT p95 outside one bucket of the
// server's is reported but is not an error.
func (r *Report) Err() error {
	var errs []error
	if r.Failed > 0 {
		errs = append(errs, fmt.Errorf("%w: %d of %d (%s)", ErrRequestsFailed, r.Failed, r.Sent, r.errorList()))
	}
	if s := r.Server; s != nil {
		switch {
		case s.Error != "":
			errs = append(errs, fmt.Errorf("%w: %s", ErrServerCheck, s.Error))
		case !s.CountMatches:
			errs = append(errs, fmt.Errorf("%w: counted %d, sent %d", ErrCountMismatch, s.RequestsCounted, s.RequestsSent))
		}
	}
	return errors.Join(errs...)
}

// errorList writes Errors as "kind: n, ..." sorted by kind.
func (r *Report) errorList() string {
	kinds := slices.Sorted(maps.Keys(r.Errors))
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s: %d", k, r.Errors[k])
	}
	return strings.Join(parts, ", ")
}

// WriteJSON writes the report as indented JSON to path ("-" is standard output).
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("loadgen: encode report: %w", err)
	}
	b = append(b, '\n')
	if path == "-" {
		_, err = os.Stdout.Write(b)
	} else {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		return fmt.Errorf("loadgen: write report: %w", err)
	}
	return nil
}

// ms formats seconds as milliseconds, "-" when undefined.
func ms(s Seconds) string {
	f := float64(s)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "-"
	}
	return fmt.Sprintf("%.1fms", f*1000)
}

// Print writes the report for a terminal: settings, counts, the client's latency
// percentiles beside the server's, and the cross-check's verdicts. Write errors are ignored.
func (r *Report) Print(w io.Writer) {
	reuse := "reuse on"
	if !r.Reuse {
		reuse = "reuse off (full prefill)"
	}
	load := fmt.Sprintf("%s, concurrency %d", r.Mode, r.Concurrency)
	if r.Rate > 0 {
		arr := "evenly spaced"
		if r.Poisson {
			arr = "Poisson"
		}
		load = fmt.Sprintf("%s at %g req/s (%s), at most %d in flight", r.Mode, r.Rate, arr, r.Concurrency)
	}
	fmt.Fprintf(w, "cb load → %s (model %s): %s\n", r.API, r.Model, load)
	fmt.Fprintf(w, "  prompts: %d of %d documents, filler prefix 0–%d bytes, max_tokens %d, %s\n",
		r.DocsPerRequest, r.Corpus, r.MaxPrefix, r.MaxTokens, reuse)
	fmt.Fprintf(w, "  sent %d (limit %d, %.0fs)  ok %d  failed %d", r.Sent, r.RequestLimit, float64(r.DurationLimit), r.Succeeded, r.Failed)
	if r.Failed > 0 {
		fmt.Fprintf(w, " (%s)", r.errorList())
	}
	fmt.Fprintf(w, "  stopped by %s after %.2fs\n", r.StoppedBy, float64(r.Elapsed))
	fmt.Fprintf(w, "  %.2f req/s  %.1f output tok/s", r.RequestRate, r.OutputTokenRate)
	if r.Delayed > 0 {
		fmt.Fprintf(w, "  %d arrivals delayed by the in-flight limit", r.Delayed)
	}
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tn\tp50\tp90\tp95\tp99\tmax\t")
	row := func(name string, n int, q Quantiles, maxCol string) {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", name, n, ms(q.P50), ms(q.P90), ms(q.P95), ms(q.P99), maxCol)
	}
	checked := r.Server != nil && r.Server.Error == ""
	for i, name := range []string{"TTFT", "TPOT", "E2E"} {
		c := r.Latencies.all()[i]
		row(name+" client", c.N, c.Quantiles, ms(c.Max))
		if checked {
			s := r.Server.Latencies.all()[i]
			row(name+" server", s.Count, s.Quantiles, "-")
		}
	}
	if q := r.QualitySampled; q != nil {
		row("TTFT quality-sampled", q.Sampled.N, q.Sampled.Quantiles, ms(q.Sampled.Max))
		row("TTFT other reuse", q.Others.N, q.Others.Quantiles, ms(q.Others.Max))
	}
	_ = tw.Flush()

	s := r.Server
	switch {
	case s == nil:
		fmt.Fprintln(w, "server cross-check: skipped")
		return
	case s.Error != "":
		fmt.Fprintf(w, "server cross-check (%s): FAILED: %s\n", s.MetricsURL, s.Error)
		return
	}
	fmt.Fprintf(w, "server cross-check (%s; server quantiles by histogram_quantile over the run's bucket deltas):\n", s.MetricsURL)
	verdict := "OK"
	if !s.CountMatches {
		verdict = "MISMATCH"
	}
	fmt.Fprintf(w, "  requests: counted %d (%d with error_type), sent %d: %s\n", s.RequestsCounted, s.ServerErrors, s.RequestsSent, verdict)
	if s.ClientP95Bucket == "" || s.ServerP95Bucket == "" {
		fmt.Fprintf(w, "  TTFT p95: not compared (client %s, server %s: no first token on one side)\n", ms(s.ClientP95), ms(s.ServerP95))
		return
	}
	within := "yes"
	if !s.P95WithinOneBucket {
		within = "NO"
	}
	fmt.Fprintf(w, "  TTFT p95: client %s in %s, server %s in %s; client within %s: %s\n",
		ms(s.ClientP95), s.ClientP95Bucket, ms(s.ServerP95), s.ServerP95Bucket, s.P95Window, within)
}
