package slo_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runTool runs a Prometheus tool with a deadline and returns its combined output.
func runTool(t *testing.T, stdin io.Reader, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, needTool(t, name), args...)
	cmd.Dir = repoPath(t, ".")
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// scrapeText fetches a process's /metrics through metrics.Handler in the text format 0.0.4
// (the format promtool check metrics reads).
func scrapeText(t *testing.T, p *process) []byte {
	t.Helper()
	srv := httptest.NewServer(p.handler)
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("%s: GET /metrics: %s %q\n%s", p.job, resp.Status, resp.Header.Get("Content-Type"), body)
	}
	return body
}

// Every process's exposition, with recorded data in every instrument, passes
// `promtool check metrics` (parse and lint) without a single finding.
func TestPromtoolCheckMetrics(t *testing.T) {
	for _, p := range stack(t) {
		t.Run(p.job, func(t *testing.T) {
			// Two scrapes: the second one holds two batches and the running totals moved.
			scrapeText(t, p)
			body := scrapeText(t, p)
			if err := p.Err(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(body, []byte(`cb_build_info{service="`+p.service+`"`)) {
				t.Fatalf("no cb_build_info for %s in the exposition", p.service)
			}
			out, err := runTool(t, bytes.NewReader(body), "promtool", "check", "metrics")
			if err != nil || strings.TrimSpace(out) != "" {
				t.Fatalf("promtool check metrics on %s: %v\n%s", p.job, err, out)
			}
		})
	}
}

// The committed rule file is valid for Prometheus.
func TestPromtoolCheckRules(t *testing.T) {
	out, err := runTool(t, nil, "promtool", "check", "rules", filepath.Join("deploy", "prometheus", "slo-rules.yml"))
	if err != nil || !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// The committed scrape configuration is valid and finds the rule file.
func TestPromtoolCheckConfig(t *testing.T) {
	out, err := runTool(t, nil, "promtool", "check", "config", filepath.Join("deploy", "prometheus", "prometheus.yml"))
	if err != nil || !strings.Contains(out, "1 rule files found") {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}

// The promtool unit tests of deploy/prometheus/tests pass: the page alert fires on a burn
// just above 14.4× (and on 8×, through the 6h/30m pair), not at 1×, not without traffic, and
// stops when the short windows are clean.
func TestPromtoolTestRules(t *testing.T) {
	files, err := filepath.Glob(repoPath(t, filepath.Join("deploy", "prometheus", "tests", "*.yml")))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("want the availability and latency unit tests in deploy/prometheus/tests, found %v", files)
	}
	out, err := runTool(t, nil, "promtool", append([]string{"test", "rules"}, files...)...)
	if err != nil || strings.Contains(out, "FAILED") {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	for _, want := range []string{"alertname: CacheblendSLOBurnRatePage", "exp_alerts: []"} {
		for _, f := range files {
			if data := mustRead(t, f); !bytes.Contains(data, []byte(want)) {
				t.Errorf("%s does not test %q", filepath.Base(f), want)
			}
		}
	}
}
