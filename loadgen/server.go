package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cacheblend/cacheblend/apiclient"
)

// Server instruments read by the cross-check (contract/instruments.yaml).
const (
	MetricTTFT            = "gen_ai_server_time_to_first_token_seconds"
	MetricTPOT            = "gen_ai_server_time_per_output_token_seconds"
	MetricRequestDuration = "gen_ai_server_request_duration_seconds"
)

// ErrCounterReset means a server histogram went down between the scrapes before and after
// the run: the server restarted, so the deltas mean nothing.
var ErrCounterReset = errors.New("loadgen: server histogram decreased during the run (restart?)")

// ServerQuantiles are a server histogram's quantiles over the run, estimated with
// HistogramQuantile from the bucket deltas between the scrapes before and after the run.
// They are NaN (null) when the histogram gained no observation.
type ServerQuantiles struct {
	// Count is the number of observations the run added.
	Count int `json:"count"`
	Quantiles
	// Buckets are the cumulative bucket deltas, summed across label sets, +Inf last.
	Buckets []Bucket `json:"buckets,omitempty"`
}

// ServerCheck is the cross-check of a run against the engine's /metrics, from a scrape
// before and after the run.
type ServerCheck struct {
	// MetricsURL is the endpoint scraped.
	MetricsURL string `json:"metrics_url"`
	// Error is set when the endpoint could not be read or parsed, or a counter went down;
	// the other fields are then unset.
	Error string `json:"error,omitempty"`

	// RequestsSent is the number of requests the run sent.
	RequestsSent int `json:"requests_sent"`
	// RequestsCounted is the delta of gen_ai_server_request_duration_seconds_count summed
	// across every label set (all operations, models and error types).
	RequestsCounted int `json:"requests_counted"`
	// CountMatches is RequestsCounted == RequestsSent.
	CountMatches bool `json:"count_matches"`
	// ServerErrors is the part of RequestsCounted with a non-empty error_type.
	ServerErrors int `json:"server_errors"`
	// SettleWait is how long the post-run scrape was repeated until the count settled.
	SettleWait Seconds `json:"settle_wait_s"`

	// The server's quantiles over the run: time to first token, time per output token,
	// and request duration of successful requests (error_type "").
	Latencies[ServerQuantiles]

	// ClientP95 and ServerP95 are the client's and the server's TTFT p95.
	ClientP95 Seconds `json:"client_ttft_p95_s"`
	ServerP95 Seconds `json:"server_ttft_p95_s"`
	// ServerP95Bucket and ClientP95Bucket are the TTFT buckets holding each p95, as
	// "(lower, upper]"; P95Window is the server's bucket with one neighbour on each side.
	ServerP95Bucket string `json:"server_ttft_p95_bucket"`
	ClientP95Bucket string `json:"client_ttft_p95_bucket"`
	P95Window       string `json:"ttft_p95_window"`
	// P95WithinOneBucket is true when the client p95 lies in P95Window.
	P95WithinOneBucket bool `json:"ttft_p95_within_one_bucket"`
}

// scrape is one parsed /metrics exposition.
type scrape map[string]*dto.MetricFamily

// scrapeMetrics reads url with c (the API key goes only to the engine's own /metrics) and
// parses it in the Prometheus text format.
func scrapeMetrics(ctx context.Context, c *apiclient.Client, url string) (scrape, error) {
	body, err := c.Metrics(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("loadgen: scrape %s: %w", url, err)
	}
	defer body.Close()
	return parseMetrics(io.LimitReader(body, 64<<20))
}

// parseMetrics parses a Prometheus text exposition.
func parseMetrics(r io.Reader) (scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("loadgen: parse metrics: %w", err)
	}
	return fams, nil
}

// labelFilter selects the label sets a histogram is summed over; nil keeps all.
type labelFilter func(labels []*dto.LabelPair) bool

// successOnly keeps label sets whose error_type is empty or absent.
func successOnly(labels []*dto.LabelPair) bool {
	for _, l := range labels {
		if l.GetName() == "error_type" {
			return l.GetValue() == ""
		}
	}
	return true
}

// failuresOnly keeps label sets with a non-empty error_type.
func failuresOnly(labels []*dto.LabelPair) bool { return !successOnly(labels) }

// histogram sums the cumulative buckets and the count of the histogram family name over
// the label sets keep selects (as sum by (le)). A missing family is an empty histogram.
func (s scrape) histogram(name string, keep labelFilter) (buckets []Bucket, count float64) {
	mf := s[name]
	if mf == nil {
		return nil, 0
	}
	byBound := map[float64]float64{}
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		if h == nil || (keep != nil && !keep(m.GetLabel())) {
			continue
		}
		n := float64(h.GetSampleCount())
		if h.SampleCountFloat != nil {
			n = h.GetSampleCountFloat()
		}
		count += n
		hasInf := false
		for _, b := range h.GetBucket() {
			c := float64(b.GetCumulativeCount())
			if b.CumulativeCountFloat != nil {
				c = b.GetCumulativeCountFloat()
			}
			ub := b.GetUpperBound()
			byBound[ub] += c
			hasInf = hasInf || math.IsInf(ub, 1)
		}
		if !hasInf {
			byBound[math.Inf(1)] += n
		}
	}
	for ub, c := range byBound {
		buckets = append(buckets, Bucket{UpperBound: ub, Count: c})
	}
	slices.SortFunc(buckets, func(a, b Bucket) int { return cmp.Compare(a.UpperBound, b.UpperBound) })
	return buckets, count
}

// deltaBuckets returns after − before per bound. A bound of before missing from after, or a
// count that went down, is ErrCounterReset.
func deltaBuckets(before, after []Bucket) ([]Bucket, error) {
	prev := make(map[float64]float64, len(before))
	for _, b := range before {
		prev[b.UpperBound] = b.Count
	}
	out := make([]Bucket, 0, len(after))
	for _, b := range after {
		p, ok := prev[b.UpperBound]
		delete(prev, b.UpperBound)
		d := b.Count
		if ok {
			d -= p
		}
		if d < 0 {
			return nil, fmt.Errorf("%w: bucket le=%s went from %v to %v", ErrCounterReset, formatBound(b.UpperBound), p, b.Count)
		}
		out = append(out, Bucket{UpperBound: b.UpperBound, Count: d})
	}
	for ub := range prev {
		return nil, fmt.Errorf("%w: bucket le=%s disappeared", ErrCounterReset, formatBound(ub))
	}
	return out, nil
}

// histogramDelta is the run's part of a histogram: bucket and count deltas.
func histogramDelta(before, after scrape, name string, keep labelFilter) ([]Bucket, int, error) {
	bb, bc := before.histogram(name, keep)
	ab, ac := after.histogram(name, keep)
	if ac < bc {
		return nil, 0, fmt.Errorf("%w: %s_count went from %v to %v", ErrCounterReset, name, bc, ac)
	}
	d, err := deltaBuckets(bb, ab)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", name, err)
	}
	return d, int(math.Round(ac - bc)), nil
}

// crossCheck scrapes url after the run, repeating every 100 ms for up to settle until the
// server has counted sent requests, and compares the deltas to the client's numbers.
func crossCheck(ctx context.Context, c *apiclient.Client, url string, before scrape, sent int, clientTTFT Summary, settle time.Duration) *ServerCheck {
	sc := &ServerCheck{MetricsURL: url, RequestsSent: sent}
	t0 := time.Now()
	var after scrape
	for {
		var err error
		after, err = scrapeMetrics(ctx, c, url)
		if err != nil {
			sc.Error = err.Error()
			return sc
		}
		_, n, err := histogramDelta(before, after, MetricRequestDuration, nil)
		if err != nil {
			sc.Error = err.Error()
			return sc
		}
		if n >= sent || time.Since(t0) >= settle {
			break
		}
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			sc.Error = fmt.Sprintf("loadgen: cross-check: %v", ctx.Err())
			return sc
		}
	}
	sc.SettleWait = Seconds(time.Since(t0).Seconds())
	if err := sc.fill(before, after, clientTTFT); err != nil {
		*sc = ServerCheck{MetricsURL: url, RequestsSent: sent, Error: err.Error()}
	}
	return sc
}

// fill computes the check from the two scrapes.
func (sc *ServerCheck) fill(before, after scrape, clientTTFT Summary) error {
	var err error
	if _, sc.RequestsCounted, err = histogramDelta(before, after, MetricRequestDuration, nil); err != nil {
		return err
	}
	if _, sc.ServerErrors, err = histogramDelta(before, after, MetricRequestDuration, failuresOnly); err != nil {
		return err
	}
	sc.CountMatches = sc.RequestsCounted == sc.RequestsSent
	for _, h := range []struct {
		dst  *ServerQuantiles
		name string
		keep labelFilter
	}{
		{&sc.TTFT, MetricTTFT, nil},
		{&sc.TPOT, MetricTPOT, nil},
		{&sc.E2E, MetricRequestDuration, successOnly},
	} {
		b, n, err := histogramDelta(before, after, h.name, h.keep)
		if err != nil {
			return err
		}
		*h.dst = ServerQuantiles{Count: n, Buckets: b, Quantiles: quantilesOf(func(q float64) float64 { return HistogramQuantile(q, b) })}
	}
	sc.ClientP95, sc.ServerP95 = clientTTFT.P95, sc.TTFT.P95
	bounds := make([]float64, len(sc.TTFT.Buckets))
	for i, b := range sc.TTFT.Buckets {
		bounds[i] = b.UpperBound
	}
	si := bucketIndex(float64(sc.ServerP95), bounds)
	ci := bucketIndex(float64(sc.ClientP95), bounds)
	if si >= 0 {
		sc.ServerP95Bucket = bucketRange(bounds, si, si)
		sc.P95Window = bucketRange(bounds, si-1, si+1)
	}
	if ci >= 0 {
		sc.ClientP95Bucket = bucketRange(bounds, ci, ci)
	}
	sc.P95WithinOneBucket = si >= 0 && ci >= 0 && ci >= si-1 && ci <= si+1
	return nil
}
