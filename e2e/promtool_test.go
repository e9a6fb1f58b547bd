package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPromtoolCheckMetricsOnEveryProcess lints the live /metrics of the
// three processes, after real traffic, with Prometheus' own promtool.
func TestPromtoolCheckMetricsOnEveryProcess(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not installed: run `make deps` (Debian package prometheus)")
	}
	e := startEnv(t, options{})
	e.ingest()
	e.chat("", ragPrompt(5, 2), 3)
	eps := e.stack.Endpoints()
	for name, url := range map[string]string{"cb-engine": eps.Engine.Metrics, "cb-worker": eps.Worker.Metrics, "cb-blend": eps.Blend.Metrics} {
		t.Run(name, func(t *testing.T) {
			body, err := httpGet(url)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(body, "cb_build_info") {
				t.Fatalf("%s: no cb_build_info in /metrics", url)
			}
			cmd := exec.Command(promtool, "check", "metrics")
			cmd.Stdin = strings.NewReader(body)
			out, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "" {
				t.Fatalf("promtool check metrics on %s: %v\n%s", url, err, out)
			}
		})
	}
}
