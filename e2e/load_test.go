package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/internal/freeport"
	"github.com/cacheblend/cacheblend/stack"
)

// startPrometheus runs the Debian prometheus binary on a free loopback port
// scraping targets (host:port) every second; it is stopped when the test
// ends.
func startPrometheus(t *testing.T, targets ...string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not installed: run `make deps` (Debian package prometheus)")
	}
	dir := t.TempDir()
	var quoted []string
	for _, tg := range targets {
		quoted = append(quoted, strconv.Quote(tg))
	}
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: cb\n    static_configs:\n      - targets: [%s]\n", strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ports, err := freeport.Ports(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var logs syncWriter
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	base := "http://" + addr
	if err := stack.WaitHealthy(context.Background(), base+"/-/ready", 30*time.Second); err != nil {
		t.Fatalf("prometheus: %v\n%s", err, logs.String())
	}
	return base
}

// promQuery runs an instant query and returns the single sample's value.
func promQuery(t *testing.T, base, q string) (float64, bool) {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string
		Error  string
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.Status != "success" {
		t.Fatalf("query %s: %v %s", q, err, b)
	}
	if len(r.Data.Result) != 1 {
		return 0, false
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	f, err := strconv.ParseFloat(s, 64)
	return f, err == nil
}

func bucketIndex(bounds []float64, v float64) int {
	for i, b := range bounds {
		if v <= b {
			return i
		}
	}
	return len(bounds)
}

// TestLoadThousandRequestsScrapedByPrometheus drives the stack with cb load
// (1,000 requests at concurrency 32) while a live Prometheus scrapes the
// engine: every request is answered, the engine counts exactly the
// requests sent, and Prometheus' histogram_quantile(0.95) of TTFT agrees
// with the load generator's client-side p95 within one bucket. The worker
// runs a smaller model so the run takes about a minute on 2 cores (the
// serving path is the same; the demo measures the default model).
func TestLoadThousandRequestsScrapedByPrometheus(t *testing.T) {
	const n = 1000
	e := startEnv(t, options{workerArgs: []string{"--layers=4", "--dim=64", "--heads=4", "--kv-heads=2", "--ffn-dim=128"}})
	prom := startPrometheus(t, strings.TrimPrefix(e.api, "http://"))
	out := filepath.Join(t.TempDir(), "load.json")
	cmd := exec.Command(cbBin, "load", "--api", e.api, "--requests", strconv.Itoa(n), "--concurrency", "32", "--docs", "1",
		"--max-tokens", "4", "--ingest", "--quiet", "--json", out, "--duration", "8m")
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
		TTFT      struct {
			P95 float64 `json:"p95_s"`
		} `json:"ttft"`
		Server struct {
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
	if rep.Sent != n || rep.Succeeded != n || rep.Failed != 0 {
		t.Fatalf("sent %d, succeeded %d, failed %d", rep.Sent, rep.Succeeded, rep.Failed)
	}
	if !rep.Server.CountMatches || rep.Server.RequestsCounted != n {
		t.Fatalf("server counted %d of %d", rep.Server.RequestsCounted, rep.Server.RequestsSent)
	}
	if !rep.Server.P95WithinOneBucket {
		t.Fatalf("client and server TTFT p95 disagree:\n%s", so.String())
	}

	// Peak resident memory of each process over the run.
	for _, st := range e.stack.Supervisor().Status() {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.PID)); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, "VmHWM:") {
					t.Logf("peak RSS %s (pid %d): %s", st.Name, st.PID, strings.TrimSpace(strings.TrimPrefix(l, "VmHWM:")))
				}
			}
		}
	}
	// Prometheus, after a scrape that follows the run.
	time.Sleep(2500 * time.Millisecond)
	count, ok := promQuery(t, prom, `sum(gen_ai_server_request_duration_seconds_count)`)
	if !ok || int(count) != n {
		t.Fatalf("Prometheus counts %v requests (ok %v), want %d", count, ok, n)
	}
	p95, ok := promQuery(t, prom, `histogram_quantile(0.95, sum by (le) (gen_ai_server_time_to_first_token_seconds_bucket))`)
	if !ok {
		t.Fatal("no TTFT quantile from Prometheus")
	}
	inst, err := contract.Instruments()
	if err != nil {
		t.Fatal(err)
	}
	ttft, _ := inst.Lookup("gen_ai_server_time_to_first_token_seconds")
	ci, si := bucketIndex(ttft.Buckets, rep.TTFT.P95), bucketIndex(ttft.Buckets, p95)
	t.Logf("TTFT p95: client %.3fs (bucket %d), Prometheus histogram_quantile %.3fs (bucket %d)", rep.TTFT.P95, ci, p95, si)
	if ci < si-1 || ci > si+1 {
		t.Fatalf("client p95 %.3fs and Prometheus p95 %.3fs are more than one bucket apart", rep.TTFT.P95, p95)
	}
}
