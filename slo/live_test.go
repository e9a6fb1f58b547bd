package slo_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"gopkg.in/yaml.v3"

	"github.com/cacheblend/cacheblend/slo"
)

// promServer is a real Prometheus started by a test: loopback, a free port, storage in a
// temporary directory, the committed rules loaded, exemplar storage on.
type promServer struct {
	url    string
	cmd    *exec.Cmd
	logs   *syncBuffer
	client *http.Client
	done   chan struct{}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// jobsNotRead are the scrape jobs of processes whose metrics neither the
// SLO rules nor the dashboard read (the gateway counts nothing the engines
// do not; the collector's own runtime metrics): the test scrapes an empty
// registry for them.
var jobsNotRead = []string{"cb-gateway", "cb-traces"}

// emptyTarget serves an empty /metrics until the test ends and returns its
// host:port.
func emptyTarget(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(prometheus.NewRegistry(), promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// liveConfig derives the test configuration from the committed deploy/prometheus/prometheus.yml:
// the same jobs, pointed at the test's servers, with 1 s scrape and rule intervals and the
// committed rule file by absolute path.
func liveConfig(t *testing.T, targets map[string]string) []byte {
	t.Helper()
	var cfg map[string]any
	if err := yaml.Unmarshal(mustRead(t, repoPath(t, "deploy/prometheus/prometheus.yml")), &cfg); err != nil {
		t.Fatalf("deploy/prometheus/prometheus.yml: %v", err)
	}
	global, _ := cfg["global"].(map[string]any)
	if global == nil {
		t.Fatal("prometheus.yml: no global section")
	}
	global["scrape_interval"], global["evaluation_interval"], global["scrape_timeout"] = "1s", "1s", "1s"
	rules, _ := cfg["rule_files"].([]any)
	if !slices.Equal(rules, []any{"slo-rules.yml"}) {
		t.Fatalf("prometheus.yml: rule_files %v, want [slo-rules.yml]", rules)
	}
	cfg["rule_files"] = []any{repoPath(t, rulesFile)}
	scrapes, _ := cfg["scrape_configs"].([]any)
	var jobs []string
	for _, s := range scrapes {
		sc, _ := s.(map[string]any)
		job, _ := sc["job_name"].(string)
		addr, ok := targets[job]
		if !ok && slices.Contains(jobsNotRead, job) {
			addr, ok = emptyTarget(t), true
		}
		if !ok {
			t.Fatalf("prometheus.yml: job %q is not one of the processes %v", job, targets)
		}
		jobs = append(jobs, job)
		sc["static_configs"] = []any{map[string]any{"targets": []any{addr}}}
	}
	for job := range targets {
		if !slices.Contains(jobs, job) {
			t.Fatalf("prometheus.yml: no scrape job %q", job)
		}
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startPrometheus runs the prometheus binary until the test ends.
func startPrometheus(t *testing.T, config []byte) *promServer {
	t.Helper()
	bin := needTool(t, "prometheus")
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, config, 0o600); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for attempt := range 3 {
		addr := freePort(t)
		logs := &syncBuffer{}
		cmd := exec.Command(bin,
			"--config.file="+cfgPath,
			"--storage.tsdb.path="+filepath.Join(dir, fmt.Sprintf("data%d", attempt)),
			"--web.listen-address="+addr,
			"--enable-feature=exemplar-storage",
			"--log.level=warn",
		)
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatalf("start prometheus: %v", err)
		}
		p := &promServer{url: "http://" + addr, cmd: cmd, logs: logs, done: make(chan struct{}),
			client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
		go func() { _ = cmd.Wait(); close(p.done) }()
		if lastErr = p.waitReady(30 * time.Second); lastErr == nil {
			t.Cleanup(p.stop)
			return p
		}
		p.stop()
	}
	t.Fatalf("prometheus did not become ready: %v", lastErr)
	return nil
}

func (p *promServer) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("prometheus exited: %s", p.logs.String())
		default:
		}
		resp, err := p.client.Get(p.url + "/-/ready")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %s", timeout, p.logs.String())
}

// stop sends SIGTERM and waits for the exit (SIGKILL after 10 s).
func (p *promServer) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.client.CloseIdleConnections()
}

type apiResponse struct {
	Status    string          `json:"status"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Warnings  []string        `json:"warnings"`
	Data      json.RawMessage `json:"data"`
}

func (p *promServer) api(path string, params url.Values) (json.RawMessage, error) {
	var resp *http.Response
	var err error
	if params == nil {
		resp, err = p.client.Get(p.url + path)
	} else {
		resp, err = p.client.PostForm(p.url+path, params)
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	if len(r.Warnings) > 0 {
		return nil, fmt.Errorf("%s: warnings %v", path, r.Warnings)
	}
	return r.Data, nil
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s sample) float() float64 {
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// query runs an instant query and returns its vector (scalars are returned as one sample).
func (p *promServer) query(expr string) ([]sample, error) {
	data, err := p.api("/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return nil, err
	}
	var res struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		return nil, err
	}
	switch res.ResultType {
	case "vector":
		var v []sample
		err := json.Unmarshal(res.Result, &v)
		return v, err
	case "scalar":
		var s sample
		err := json.Unmarshal(res.Result, &s.Value)
		return []sample{s}, err
	default:
		return nil, fmt.Errorf("result type %s", res.ResultType)
	}
}

// waitFor polls cond until it holds, failing the test after timeout with the last reason.
func waitFor(t *testing.T, p *promServer, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s: %s\nprometheus log:\n%s", what, last, p.logs.String())
}

// rateInterval replaces Grafana's $__rate_interval in dashboard expressions.
const rateInterval = "1m"

// grafanaExpr turns a dashboard expression into plain PromQL ($node, the per-node row's
// variable, becomes every instance); any other $variable is an error.
func grafanaExpr(expr string) (string, error) {
	out := strings.ReplaceAll(expr, "$__rate_interval", rateInterval)
	out = strings.ReplaceAll(out, `"$node"`, `".+"`)
	if i := strings.Index(out, "$"); i >= 0 {
		return "", fmt.Errorf("unsupported variable at %q", out[i:])
	}
	return out, nil
}

// TestLivePrometheus runs the real Prometheus against the three processes' /metrics (all four
// facades with recorded traffic) with the committed scrape config and rules, then runs every
// PromQL expression of the rules and of the Grafana dashboard through /api/v1/query.
func TestLivePrometheus(t *testing.T) {
	procs := stack(t)
	targets := map[string]string{}
	for _, p := range procs {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", p.handler)
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		targets[p.job] = strings.TrimPrefix(srv.URL, "http://")
	}
	prom := startPrometheus(t, liveConfig(t, targets))

	// Three scrapes of every target (three batches recorded), ingested, and the recording
	// rules evaluated over them.
	waitFor(t, prom, 45*time.Second, "three scrapes per target and the recording rules", func() (bool, string) {
		for _, p := range procs {
			if n := p.Batches(); n < 3 {
				return false, fmt.Sprintf("%s scraped %d times", p.job, n)
			}
		}
		v, err := prom.query(`count_over_time(up{job=~"cb-.*"}[5m]) >= 3`)
		if err != nil || len(v) != len(procs)+len(jobsNotRead) {
			return false, fmt.Sprintf("ingested scrapes: %v %v", v, err)
		}
		v, err = prom.query(`slo:sli_error:ratio_rate5m >= 0`)
		if err != nil || len(v) != 4 { // ttft, tpot, availability, quality
			return false, fmt.Sprintf("recorded error ratios: %v %v", v, err)
		}
		return true, ""
	})
	for _, p := range procs {
		if err := p.Err(); err != nil {
			t.Fatal(err)
		}
	}
	v, err := prom.query(`up{job=~"cb-.*"} == 1`)
	if err != nil || len(v) != len(procs)+len(jobsNotRead) {
		t.Fatalf("targets up: %v %v", v, err)
	}

	t.Run("rules", func(t *testing.T) {
		set, inst := contractSets(t)
		file, err := slo.Build(set, inst)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, g := range file.Groups {
			for _, r := range g.Rules {
				n++
				if _, err := prom.query(r.Expr); err != nil {
					t.Errorf("%s %s%s: %v\n%s", g.Name, r.Record, r.Alert, err, r.Expr)
				}
			}
		}
		// Prometheus loaded every rule and evaluates them without error.
		data, err := prom.api("/api/v1/rules", nil)
		if err != nil {
			t.Fatal(err)
		}
		var rules struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := json.Unmarshal(data, &rules); err != nil {
			t.Fatal(err)
		}
		loaded := 0
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				loaded++
				if r.Health != "ok" || r.LastError != "" {
					t.Errorf("rule %s/%s: health %q, error %q", g.Name, r.Name, r.Health, r.LastError)
				}
			}
		}
		if loaded != n {
			t.Errorf("Prometheus loaded %d rules, the generator makes %d", loaded, n)
		}
	})

	t.Run("slo values", func(t *testing.T) {
		// One identical batch per scrape, so every window's ratio is the batch's ratio.
		checks := []struct {
			expr string
			want float64
		}{
			{`slo:sli_error:ratio_rate5m{slo="ttft"}`, expectedTTFTErrorRatio()},
			{`slo:sli_error:ratio_rate3d{slo="ttft"}`, expectedTTFTErrorRatio()},
			{`slo:sli_error:ratio_rate1h{slo="availability"}`, expectedAvailabilityErrorRatio()},
			{`slo:sli_error:ratio_rate1h / on(slo) slo:error_budget:ratio`, 0}, // checked below
		}
		for _, c := range checks[:3] {
			v, err := prom.query(c.expr)
			if err != nil || len(v) != 1 {
				t.Fatalf("%s: %v %v", c.expr, v, err)
			}
			if got := v[0].float(); math.Abs(got-c.want) > 1e-9 {
				t.Errorf("%s = %v, want %v", c.expr, got, c.want)
			}
		}
		v, err := prom.query(checks[3].expr)
		if err != nil || len(v) != 4 {
			t.Fatalf("burn rates: %v %v", v, err)
		}
		for _, s := range v {
			switch s.Metric["slo"] {
			case "availability":
				if want := expectedAvailabilityErrorRatio() / 0.005; math.Abs(s.float()-want) > 1e-6 {
					t.Errorf("availability burn rate %v, want %v", s.float(), want)
				}
			case "quality": // 1 of 20 checks above 0.01 nats, a budget of 5 %
				if want := (1.0 / qualityChecks) / 0.05; math.Abs(s.float()-want) > 1e-6 {
					t.Errorf("quality burn rate %v, want %v", s.float(), want)
				}
			}
		}
		// The recorded traffic burns the availability budget at 16.7× (2 of 24 inference requests
		// 5xx): it pages. TTFT burns at 5× (4 of 16 above 0.5 s): a ticket, not a page.
		waitFor(t, prom, 10*time.Second, "the alerts", func() (bool, string) {
			v, err := prom.query(`ALERTS{alertstate="firing"}`)
			if err != nil {
				return false, err.Error()
			}
			var got []string
			for _, s := range v {
				got = append(got, s.Metric["alertname"]+"/"+s.Metric["slo"])
			}
			slices.Sort(got)
			want := []string{"CacheblendSLOBurnRatePage/availability", "CacheblendSLOBurnRateTicket/availability",
				"CacheblendSLOBurnRateTicket/tpot", "CacheblendSLOBurnRateTicket/ttft"}
			return slices.Equal(got, want), fmt.Sprintf("firing %v, want %v", got, want)
		})
	})

	t.Run("dashboard", func(t *testing.T) {
		dash := loadDashboard(t)
		n := 0
		for _, pt := range dash.targets() {
			expr, err := grafanaExpr(pt.target.Expr)
			if err != nil {
				t.Errorf("panel %q %s: %v", pt.panel, pt.target.RefID, err)
				continue
			}
			n++
			v, err := prom.query(expr)
			if err != nil {
				t.Errorf("panel %q %s: %v\n%s", pt.panel, pt.target.RefID, err, expr)
				continue
			}
			// Every panel shows data with the recorded traffic.
			if len(v) == 0 {
				t.Errorf("panel %q %s: empty result\n%s", pt.panel, pt.target.RefID, expr)
			}
		}
		if n < 30 {
			t.Fatalf("only %d dashboard expressions", n)
		}
		// A few values: the TTFT p95 lies in the bucket the recorded TTFTs put it in, and the
		// prefix and non-prefix hit rates add up to the total.
		p95, err := prom.query(fmt.Sprintf(`histogram_quantile(0.95, sum by (le) (rate(gen_ai_server_time_to_first_token_seconds_bucket[%s])))`, rateInterval))
		if err != nil || len(p95) != 1 {
			t.Fatalf("TTFT p95: %v %v", p95, err)
		}
		// 16 TTFTs per batch, the largest 3 s: the 95th percentile (rank 15.2) is in (2.5, 5].
		if got := p95[0].float(); !(got > 2.5 && got <= 5) {
			t.Errorf("TTFT p95 = %v, want in the (2.5, 5] bucket", got)
		}
		legs, err := prom.query(fmt.Sprintf(`sum by (leg) (rate(lmcache_blend_lookup_hit_tokens_total[%[1]s])) / ignoring(leg) group_left() sum(rate(lmcache_blend_lookup_requested_tokens_total[%[1]s]))`, rateInterval))
		if err != nil || len(legs) != 2 {
			t.Fatalf("hit rate by leg: %v %v", legs, err)
		}
		var prefix, nonPrefix, requested float64
		for i := range 12 {
			prefix += float64(256 * (i % 3))
			nonPrefix += float64(300 + 50*i)
			requested += 1500
		}
		for _, s := range legs {
			want := prefix / requested
			if s.Metric["leg"] == "non_prefix" {
				want = nonPrefix / requested
			}
			if math.Abs(s.float()-want) > 1e-9 {
				t.Errorf("hit rate %s = %v, want %v", s.Metric["leg"], s.float(), want)
			}
		}
	})

	t.Run("exemplars", func(t *testing.T) {
		// The latency histograms' exemplars reach Prometheus with the request's trace id: the
		// dashboard's exemplar links resolve to traces that were recorded.
		now := time.Now()
		recorded := map[string]bool{}
		for _, p := range procs {
			for _, id := range p.TraceIDs() {
				recorded[id] = true
			}
		}
		for _, metric := range []string{
			"gen_ai_server_time_to_first_token_seconds_bucket",
			"cb_worker_forward_duration_seconds_bucket",
			"lmcache_blend_lookup_duration_seconds_bucket",
		} {
			data, err := prom.api("/api/v1/query_exemplars", url.Values{
				"query": {metric},
				"start": {strconv.FormatInt(now.Add(-5*time.Minute).Unix(), 10)},
				"end":   {strconv.FormatInt(now.Add(time.Minute).Unix(), 10)},
			})
			if err != nil {
				t.Fatalf("%s: %v", metric, err)
			}
			var res []struct {
				Exemplars []struct {
					Labels map[string]string `json:"labels"`
				} `json:"exemplars"`
			}
			if err := json.Unmarshal(data, &res); err != nil {
				t.Fatal(err)
			}
			found := 0
			for _, s := range res {
				for _, e := range s.Exemplars {
					id := e.Labels["trace_id"]
					if !recorded[id] || len(e.Labels["span_id"]) != 16 {
						t.Errorf("%s: exemplar %v is not a recorded trace", metric, e.Labels)
					}
					found++
				}
			}
			if found == 0 {
				t.Errorf("%s: no exemplars stored", metric)
			}
		}
	})
	if t.Failed() {
		t.Logf("prometheus log:\n%s", prom.logs.String())
	}
}
