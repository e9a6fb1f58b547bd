package e2e

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/stack"
)

// openMetricsPython is the Debian package python3-prometheus-client's
// interpreter (scripts/deps.sh installs it); its OpenMetrics parser is
// strict (one family per name, metadata before samples, # EOF).
const openMetricsPython = "/usr/bin/python3"

// strictParse reads an OpenMetrics exposition on stdin and prints the
// number of families and of samples carrying an exemplar; it fails on any
// exposition a strict parser refuses.
const strictParse = `
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
fams = exemplars = 0
for f in text_string_to_metric_families(sys.stdin.read()):
    fams += 1
    exemplars += sum(1 for s in f.samples if s.exemplar is not None)
print(fams, exemplars)
`

// scrapeOpenMetrics GETs url negotiating OpenMetrics and returns the body.
func scrapeOpenMetrics(t *testing.T, url string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/openmetrics-text") {
		t.Fatalf("GET %s: %s, Content-Type %q", url, resp.Status, resp.Header.Get("Content-Type"))
	}
	return string(body)
}

// parseStrict parses an OpenMetrics exposition with the strict parser and
// returns its family and exemplar counts.
func parseStrict(t *testing.T, body string) (families, exemplars int) {
	t.Helper()
	cmd := exec.Command(openMetricsPython, "-c", strictParse)
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("strict OpenMetrics parse failed: %v\n%s", err, out)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		t.Fatalf("parser output %q", out)
	}
	families, _ = strconv.Atoi(f[0])
	exemplars, _ = strconv.Atoi(f[1])
	return families, exemplars
}

// TestStrictOpenMetricsOnEveryProcess negotiates OpenMetrics with the live
// /metrics of every kind of process (engine, worker, blend server,
// gateway, trace collector) after real traffic and parses each exposition
// with a strict OpenMetrics parser; the engine's and the gateway's keep
// their exemplars (the traced requests' trace ids on latency buckets).
func TestStrictOpenMetricsOnEveryProcess(t *testing.T) {
	if _, err := exec.Command(openMetricsPython, "-c", "import prometheus_client.openmetrics.parser").CombinedOutput(); err != nil {
		t.Fatal("the strict OpenMetrics parser is not installed: run `make deps` (Debian package python3-prometheus-client)")
	}
	e := startEnv(t, options{})
	sup := stack.NewSupervisor(stack.Config{Logs: e.logs, ReadyTimeout: 60 * time.Second})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = sup.Shutdown(ctx)
	})
	gw, err := sup.Start(context.Background(), stack.Spec{Name: "cb-gateway", Path: cbBin,
		Env:  []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + "http://" + e.col.OTLPAddr() + "/v1/traces", "OTEL_BSP_SCHEDULE_DELAY=100"},
		Args: []string{"gateway", "--addr", "127.0.0.1:0", "--engine", e.api}})
	if err != nil {
		t.Fatal(err)
	}
	if err := stack.WaitHealthy(context.Background(), gw.Values["api"]+"/health", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	tr, err := sup.Start(context.Background(), stack.Spec{Name: "cb-traces", Path: cbBin,
		Args: []string{"traces", "--otlp-addr", "127.0.0.1:0", "--ui-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	e.ingest()
	e.chat("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ragPrompt(5, 2), 3)
	saved := e.api
	e.api = gw.Values["api"] // one request through the gateway too
	e.chat("00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-01", ragPrompt(1, 3), 3)
	e.api = saved

	eps := e.stack.Endpoints()
	for _, tc := range []struct {
		name, url     string
		wantExemplars bool
	}{
		{"cb-engine", eps.Engine.Metrics, true},
		{"cb-worker", eps.Worker.Metrics, false},
		{"cb-blend", eps.Blend.Metrics, false},
		{"cb-gateway", gw.Values["metrics"], true},
		{"cb-traces", tr.Values["metrics"], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.url == "" {
				t.Fatal("no /metrics address")
			}
			body := scrapeOpenMetrics(t, tc.url)
			fams, exemplars := parseStrict(t, body)
			t.Logf("%s: %d families, %d exemplars", tc.url, fams, exemplars)
			if fams == 0 || !strings.Contains(body, "cb_build_info") {
				t.Fatalf("%s: an empty exposition", tc.url)
			}
			if tc.wantExemplars && exemplars == 0 {
				t.Fatalf("%s: no exemplars in the OpenMetrics exposition", tc.url)
			}
		})
	}
}
