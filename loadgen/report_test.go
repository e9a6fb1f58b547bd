package loadgen

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func TestReportErr(t *testing.T) {
	for _, tc := range []struct {
		name string
		rep  Report
		want []error
	}{
		{"clean", Report{Outcome: Outcome{Sent: 3}, Server: &ServerCheck{CountMatches: true}}, nil},
		{"clean without check", Report{Outcome: Outcome{Sent: 3}}, nil},
		{"failures", Report{Outcome: Outcome{Sent: 3, Failed: 1, Errors: map[string]int{"http_503": 1}}, Server: &ServerCheck{CountMatches: true}}, []error{ErrRequestsFailed}},
		{"mismatch", Report{Outcome: Outcome{Sent: 3}, Server: &ServerCheck{RequestsSent: 3, RequestsCounted: 2}}, []error{ErrCountMismatch}},
		{"scrape failed", Report{Outcome: Outcome{Sent: 3}, Server: &ServerCheck{Error: "refused"}}, []error{ErrServerCheck}},
		{"both", Report{Outcome: Outcome{Sent: 3, Failed: 2, Errors: map[string]int{"timeout": 2}}, Server: &ServerCheck{RequestsSent: 3, RequestsCounted: 5}},
			[]error{ErrRequestsFailed, ErrCountMismatch}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rep.Err()
			if (err == nil) != (len(tc.want) == 0) {
				t.Fatalf("Err = %v, want %v", err, tc.want)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("Err = %v, want %v in it", err, w)
				}
			}
		})
	}
}

func TestReportPrintWithoutData(t *testing.T) {
	nan := Seconds(math.NaN())
	rep := &Report{Settings: Settings{API: "http://x", Mode: "open loop", Rate: 2, Poisson: true},
		Latencies: Latencies[Summary]{TTFT: Summary{Quantiles: Quantiles{P50: nan, P90: nan, P95: nan, P99: nan}, Max: nan}},
		Server:    &ServerCheck{MetricsURL: "http://x/metrics", Error: "connection refused"}}
	var sb strings.Builder
	rep.Print(&sb)
	out := sb.String()
	for _, want := range []string{"open loop at 2 req/s (Poisson)", "TTFT client", "FAILED: connection refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("Print lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "NaN") {
		t.Errorf("Print shows NaN:\n%s", out)
	}
}

func TestProgressLine(t *testing.T) {
	r := &runner{cfg: Config{Requests: 10, Duration: time.Hour}, start: time.Now()}
	r.done.Store(5)
	r.failed.Store(1)
	r.inflight.Store(2)
	line := r.progressLine()
	if !strings.HasPrefix(line, "[###############...............] 5/10 done  1 failed  2 in flight") || len(line) < 100 {
		t.Errorf("progress line %q", line)
	}
	var sb strings.Builder
	r.cfg.Progress = &sb
	stop := r.startProgress()
	stop()
	if out := sb.String(); !strings.HasPrefix(out, "\r[") || !strings.HasSuffix(out, "\n") {
		t.Errorf("progress output %q", out)
	}
}
