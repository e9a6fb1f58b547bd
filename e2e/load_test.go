package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadEveryRequestAnsweredAndCounted drives the stack with cb load at
// concurrency 32: every request is answered, the engine counts exactly the
// requests sent, and client and server TTFT p95 agree within a bucket. (The
// 1,000-request run of the README is the same command with --requests 1000.)
func TestLoadEveryRequestAnsweredAndCounted(t *testing.T) {
	e := startEnv(t, options{})
	out := filepath.Join(t.TempDir(), "load.json")
	cmd := exec.Command(cbBin, "load", "--api", e.api, "--requests", "160", "--concurrency", "32", "--docs", "1",
		"--max-tokens", "4", "--ingest", "--quiet", "--json", out, "--duration", "4m")
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		t.Fatalf("cb load: %v\n%s\n%s", err, so.String(), se.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Sent      int `json:"sent"`
		Succeeded int `json:"succeeded"`
		Failed    int `json:"failed"`
		Server    struct {
			RequestsSent       int  `json:"requests_sent"`
			RequestsCounted    int  `json:"requests_counted"`
			CountMatches       bool `json:"count_matches"`
			P95WithinOneBucket bool `json:"ttft_p95_within_one_bucket"`
		} `json:"server"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", so.String())
	if rep.Sent != 160 || rep.Succeeded != 160 || rep.Failed != 0 {
		t.Fatalf("sent %d, succeeded %d, failed %d", rep.Sent, rep.Succeeded, rep.Failed)
	}
	if !rep.Server.CountMatches || rep.Server.RequestsCounted != 160 {
		t.Fatalf("server counted %d of %d", rep.Server.RequestsCounted, rep.Server.RequestsSent)
	}
	if !rep.Server.P95WithinOneBucket {
		t.Fatalf("client and server TTFT p95 disagree:\n%s", so.String())
	}
}
