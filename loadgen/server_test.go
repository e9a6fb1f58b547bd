package loadgen

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// expo renders the request-duration and TTFT histograms in the text format: one success
// series of chat, one queue_full series, and a TTFT series per model.
func expo(okC []float64, failC float64, ttftA, ttftB []float64) string {
	var sb strings.Builder
	w := func(format string, args ...any) { sb.WriteString(sprintf(format, args...)) }
	w("# HELP gen_ai_server_request_duration_seconds d\n# TYPE gen_ai_server_request_duration_seconds histogram\n")
	for i, le := range []string{"0.1", "1", "+Inf"} {
		w(`gen_ai_server_request_duration_seconds_bucket{error_type="",gen_ai_operation_name="chat",gen_ai_request_model="m",le="%s"} %g`+"\n", le, okC[i])
	}
	w(`gen_ai_server_request_duration_seconds_sum{error_type="",gen_ai_operation_name="chat",gen_ai_request_model="m"} 1` + "\n")
	w(`gen_ai_server_request_duration_seconds_count{error_type="",gen_ai_operation_name="chat",gen_ai_request_model="m"} %g`+"\n", okC[2])
	for _, le := range []string{"0.1", "1", "+Inf"} {
		w(`gen_ai_server_request_duration_seconds_bucket{error_type="queue_full",gen_ai_operation_name="chat",gen_ai_request_model="m",le="%s"} %g`+"\n", le, failC)
	}
	w(`gen_ai_server_request_duration_seconds_sum{error_type="queue_full",gen_ai_operation_name="chat",gen_ai_request_model="m"} 0` + "\n")
	w(`gen_ai_server_request_duration_seconds_count{error_type="queue_full",gen_ai_operation_name="chat",gen_ai_request_model="m"} %g`+"\n", failC)
	w("# HELP gen_ai_server_time_to_first_token_seconds t\n# TYPE gen_ai_server_time_to_first_token_seconds histogram\n")
	for model, c := range map[string][]float64{"a": ttftA, "b": ttftB} {
		for i, le := range []string{"0.1", "0.25", "0.5", "+Inf"} {
			w(`gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_operation_name="chat",gen_ai_request_model="%s",le="%s"} %g`+"\n", model, le, c[i])
		}
		w(`gen_ai_server_time_to_first_token_seconds_sum{gen_ai_operation_name="chat",gen_ai_request_model="%s"} 1`+"\n", model)
		w(`gen_ai_server_time_to_first_token_seconds_count{gen_ai_operation_name="chat",gen_ai_request_model="%s"} %g`+"\n", model, c[3])
	}
	return sb.String()
}

func mustParse(t *testing.T, s string) scrape {
	t.Helper()
	sc, err := parseMetrics(strings.NewReader(s))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, s)
	}
	return sc
}

func TestHistogramAcrossLabelSets(t *testing.T) {
	sc := mustParse(t, expo([]float64{3, 5, 6}, 2, []float64{1, 2, 3, 3}, []float64{0, 4, 4, 5}))
	b, n := sc.histogram(MetricTTFT, nil)
	if n != 8 || !slices.Equal(b, bk(0.1, 1, 0.25, 6, 0.5, 7, inf, 8)) {
		t.Errorf("TTFT summed: %v count %v", b, n)
	}
	b, n = sc.histogram(MetricRequestDuration, successOnly)
	if n != 6 || !slices.Equal(b, bk(0.1, 3, 1, 5, inf, 6)) {
		t.Errorf("successful durations: %v count %v", b, n)
	}
	if _, n = sc.histogram(MetricRequestDuration, failuresOnly); n != 2 {
		t.Errorf("failed count %v", n)
	}
	if b, n = sc.histogram("absent", nil); b != nil || n != 0 {
		t.Errorf("absent family: %v %v", b, n)
	}
}

func TestServerCheckFromScrapes(t *testing.T) {
	before := mustParse(t, expo([]float64{3, 5, 6}, 2, []float64{1, 2, 3, 3}, []float64{0, 4, 4, 5}))
	// The run adds 10 successes (TTFT: 1 ≤ 0.1, 8 in (0.1, 0.25], 1 in (0.25, 0.5]) and 1 failure.
	after := mustParse(t, expo([]float64{8, 15, 16}, 3, []float64{2, 9, 10, 10}, []float64{0, 5, 7, 8}))
	for _, tc := range []struct {
		name      string
		sent      int
		clientP95 float64
		matches   bool
		within    bool
	}{
		{"agreeing", 11, 0.3, true, true},
		{"client one bucket below", 11, 0.2, true, true},
		{"client one bucket above", 11, 0.7, true, true},
		{"client two buckets below", 11, 0.09, true, false},
		{"server counted fewer", 12, 0.3, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := &ServerCheck{RequestsSent: tc.sent}
			if err := sc.fill(before, after, Summary{Quantiles: Quantiles{P95: Seconds(tc.clientP95)}}); err != nil {
				t.Fatal(err)
			}
			if sc.RequestsCounted != 11 || sc.ServerErrors != 1 || sc.CountMatches != tc.matches {
				t.Errorf("counted %d errors %d matches %v", sc.RequestsCounted, sc.ServerErrors, sc.CountMatches)
			}
			// TTFT deltas: C = 1, 8, 10, 10 → rank 9.5 in (0.25, 0.5] holding 2: 0.25 + 0.25·1.5/2.
			if sc.TTFT.Count != 10 || !slices.Equal(sc.TTFT.Buckets, bk(0.1, 1, 0.25, 8, 0.5, 10, inf, 10)) ||
				!sameFloat(float64(sc.TTFT.P95), 0.4375) {
				t.Errorf("TTFT %+v", sc.TTFT)
			}
			// rank 5 in (0.1, 0.25] holding 7, 4 in.
			if !sameFloat(float64(sc.TTFT.P50), 0.1+0.15*4/7) {
				t.Errorf("TTFT p50 %v", sc.TTFT.P50)
			}
			if sc.E2E.Count != 10 || sc.ServerP95Bucket != "(0.25, 0.5]" || sc.P95Window != "(0.1, +Inf]" {
				t.Errorf("e2e %d bucket %s window %s", sc.E2E.Count, sc.ServerP95Bucket, sc.P95Window)
			}
			if sc.P95WithinOneBucket != tc.within {
				t.Errorf("client p95 %v in %s: within = %v", tc.clientP95, sc.ClientP95Bucket, sc.P95WithinOneBucket)
			}
		})
	}
}

func TestServerCheckDetectsReset(t *testing.T) {
	before := mustParse(t, expo([]float64{8, 15, 16}, 3, []float64{2, 9, 10, 10}, []float64{0, 5, 5, 8}))
	after := mustParse(t, expo([]float64{3, 5, 6}, 2, []float64{1, 2, 3, 3}, []float64{0, 4, 4, 5}))
	err := (&ServerCheck{}).fill(before, after, Summary{})
	if !errors.Is(err, ErrCounterReset) {
		t.Fatalf("fill after a restart: %v", err)
	}
	if _, err := deltaBuckets(bk(0.1, 1, inf, 1), bk(inf, 2)); !errors.Is(err, ErrCounterReset) {
		t.Errorf("vanished bucket: %v", err)
	}
	d, err := deltaBuckets(nil, bk(0.1, 1, inf, 2))
	if err != nil || !slices.Equal(d, bk(0.1, 1, inf, 2)) {
		t.Errorf("delta from nothing: %v %v", d, err)
	}
}

func TestServerCheckNoObservations(t *testing.T) {
	sc := mustParse(t, expo([]float64{3, 5, 6}, 2, []float64{1, 2, 3, 3}, []float64{0, 4, 4, 5}))
	c := &ServerCheck{}
	if err := c.fill(sc, sc, Summary{Quantiles: Quantiles{P95: 0.2}}); err != nil {
		t.Fatal(err)
	}
	if c.RequestsCounted != 0 || !c.CountMatches || !math.IsNaN(float64(c.ServerP95)) || c.P95WithinOneBucket || c.ServerP95Bucket != "" {
		t.Errorf("check over no requests: %+v", c)
	}
}

func FuzzParseMetrics(f *testing.F) {
	f.Add(expo([]float64{3, 5, 6}, 2, []float64{1, 2, 3, 3}, []float64{0, 4, 4, 5}))
	f.Add("# TYPE gen_ai_server_request_duration_seconds histogram\ngen_ai_server_request_duration_seconds_count 1e300\n")
	f.Fuzz(func(t *testing.T, in string) {
		sc, err := parseMetrics(strings.NewReader(in))
		if err != nil {
			return
		}
		c := &ServerCheck{}
		_ = c.fill(sc, sc, Summary{Quantiles: Quantiles{P95: 0.1}})
		_ = c.fill(scrape{}, sc, Summary{Quantiles: Quantiles{P95: 0.1}})
	})
}
