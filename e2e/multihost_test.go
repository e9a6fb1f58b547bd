package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/demo"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/internal/netns"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// Ports of the multi-host topology, as deploy/README.md documents them.
const (
	mhGatewayPort = 8080
	mhEnginePort  = 8000
	mhWorkerPort  = 50061
	mhBlendPort   = 50051
	mhWorkerMet   = 9101
	mhBlendMet    = 9102
	mhTracesMet   = 9103
	mhOTLPPort    = 4318
	mhUIPort      = 16686
	mhRedisPort   = 6379
)

// Short bounds of the test's gateway (deploy/README.md gives the defaults).
const (
	mhRequestTimeout = 20 * time.Second
	mhIdleTimeout    = 3 * time.Second
	mhHealthInterval = 250 * time.Millisecond
)

// mhProc is one process of the multi-host topology.
type mhProc struct {
	name string
	cmd  *exec.Cmd
	logs *syncWriter
	done chan struct{}
}

// multiHost is the running topology: five network namespaces (gw, node-a,
// node-b, decode and their switch), the processes on them, and the
// operator's CA.
type multiHost struct {
	t                   *testing.T
	net                 *netns.Net
	gw, a, b, dec       *netns.Host
	client              *http.Client // dials from the gw host
	procs               []*mhProc
	redis               *mhProc
	pki, dir            string
	idleTimeoutSupport  bool
	requests, failovers int
	mu                  sync.Mutex
}

// TestMultiHost runs the topology of deploy/README.md ("Several hosts") on
// network namespaces: host gw (cb gateway, redis-server, cb traces), hosts
// node-a and node-b (cb engine --role prefill, cb worker, cb blend sharing
// the Redis fleet tier), host decode (cb engine --role decode, cb worker),
// mutual TLS from per-host certificates of `cb certs init` / `cb certs
// issue`. Every process is the built cb binary started inside its host's
// namespace (ip netns exec) with the README's flags and environment
// variables. Faults are injected per host: a link down, SIGSTOP of Redis.
func TestMultiHost(t *testing.T) {
	t0 := time.Now()
	m := startMultiHost(t)
	t.Logf("five hosts and %d processes up in %v", len(m.procs), time.Since(t0).Round(time.Millisecond))

	t.Run("happy", m.happy)
	t.Run("redis_paused_during_ingest", m.redisPaused)
	t.Run("decode_down_under_load", m.decodeDown)
	t.Run("node_cut_during_stream", m.nodeCutStream)
	t.Run("every_trace_checks", m.everyTraceChecks)
	t.Logf("whole test %v", time.Since(t0).Round(time.Millisecond))
}

func startMultiHost(t *testing.T) *multiHost {
	t.Helper()
	n, err := netns.New(netns.Config{Subnet: "10.213.9.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	m := &multiHost{t: t, net: n, dir: t.TempDir()}
	// Registered first, so it runs last: after every process stopped.
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("remove namespaces: %v", err)
		}
	})
	t.Cleanup(m.stopAll)
	for _, h := range []**netns.Host{&m.gw, &m.a, &m.b, &m.dec} {
		name := map[**netns.Host]string{&m.gw: "gw", &m.a: "node-a", &m.b: "node-b", &m.dec: "decode"}[h]
		if *h, err = n.AddHost(name); err != nil {
			t.Fatal(err)
		}
	}
	m.client = m.gw.HTTPClient(60 * time.Second)
	t.Cleanup(m.client.CloseIdleConnections)

	// The operator's CA, and one directory per host (deploy/README.md).
	m.pki = filepath.Join(m.dir, "pki")
	m.cb("certs", "init", "--dir", m.pki)
	for _, h := range []struct {
		host  *netns.Host
		roles string
	}{{m.a, "engine,worker,blend"}, {m.b, "engine,worker,blend"}, {m.dec, "engine,worker"}} {
		m.cb("certs", "issue", "--dir", m.pki, "--host", h.host.Name, "--ip", h.host.IP.String(), "--role", h.roles)
	}

	// Host gw: redis-server (password and binding in its config file), cb traces.
	redisDir := filepath.Join(m.hostDir(m.gw), "redis")
	if err := os.MkdirAll(redisDir, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("bind %s\nport %d\nprotected-mode yes\nrequirepass %s\nsave \"\"\nappendonly no\ndir %s\n",
		m.gw.IP, mhRedisPort, mhRedisPassword, redisDir)
	confPath := filepath.Join(redisDir, "redis.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	m.redis = m.start(m.gw, "redis-server", nil, "redis-server", confPath)
	m.start(m.gw, "cb-traces", nil, cbBin, "traces", "--otlp-addr", m.gw.Addr(mhOTLPPort), "--ui-addr", m.gw.Addr(mhUIPort),
		"--metrics-addr", m.gw.Addr(mhTracesMet))
	m.waitHealthy(m.gw.URL(mhTracesMet) + "/health")

	// Hosts node-a and node-b: blend, worker, prefill engine.
	for _, h := range []*netns.Host{m.a, m.b} {
		m.start(h, "cb-blend", m.tlsEnv(h, "blend", "CB_BLEND_REDIS_URL="+m.redisURL(), "CB_BLEND_FLEET_KEY="+e2eFleetKey), cbBin, "blend",
			"--addr", h.Addr(mhBlendPort), "--metrics-addr", h.Addr(mhBlendMet), "--coordinator-timeout", "2s", "--redis-timeout", "2s")
		m.start(h, "cb-worker", m.tlsEnv(h, "worker"), cbBin, append([]string{"worker",
			"--addr", h.Addr(mhWorkerPort), "--metrics-addr", h.Addr(mhWorkerMet), "--blend", h.Addr(mhBlendPort)}, smallModel...)...)
	}
	// Host decode: worker, decode engine.
	m.start(m.dec, "cb-worker", m.tlsEnv(m.dec, "worker"), cbBin, append([]string{"worker",
		"--addr", m.dec.Addr(mhWorkerPort), "--metrics-addr", m.dec.Addr(mhWorkerMet)}, smallModel...)...)
	for _, h := range []*netns.Host{m.a, m.b, m.dec} {
		m.waitHealthy(h.URL(mhWorkerMet) + "/health")
	}
	for _, h := range []*netns.Host{m.a, m.b} {
		m.waitHealthy(h.URL(mhBlendMet) + "/health")
		// The stack key the engines and the gateway share (CB_STACK_KEY), and
		// the decode engine this prefill engine may hand over to.
		m.start(h, "cb-engine", m.tlsEnv(h, "engine", "CB_STACK_KEY="+e2eStackKey), cbBin, "engine", "--role", "prefill",
			"--addr", h.Addr(mhEnginePort), "--worker", h.Addr(mhWorkerPort), "--blend", h.Addr(mhBlendPort),
			"--decode-engine", m.dec.URL(mhEnginePort),
			"--lookup-timeout", "10s",
			// Below the gateway's idle timeout (connect 1 s + idle): a decode
			// host gone is the prefill engine's 503, not its silence.
			"--handoff-connect-timeout", "1s", "--handoff-idle-timeout", (mhIdleTimeout / 2).String())
	}
	m.start(m.dec, "cb-engine", m.tlsEnv(m.dec, "engine", "CB_STACK_KEY="+e2eStackKey), cbBin, "engine", "--role", "decode",
		"--addr", m.dec.Addr(mhEnginePort), "--worker", m.dec.Addr(mhWorkerPort),
		"--handoff-source", m.a.Addr(mhWorkerPort), "--handoff-source", m.b.Addr(mhWorkerPort))
	for _, h := range []*netns.Host{m.a, m.b, m.dec} {
		m.waitHealthy(h.URL(mhEnginePort) + "/health")
	}

	// The gateway on host gw, in front of both pools.
	gwArgs := []string{"gateway", "--addr", m.gw.Addr(mhGatewayPort),
		"--prefill", m.a.URL(mhEnginePort), "--prefill", m.b.URL(mhEnginePort), "--decode", m.dec.URL(mhEnginePort),
		"--health-interval", mhHealthInterval.String(), "--request-timeout", mhRequestTimeout.String()}
	help, _ := exec.Command(cbBin, "gateway", "--help").CombinedOutput()
	m.idleTimeoutSupport = strings.Contains(string(help), "--upstream-idle-timeout")
	if m.idleTimeoutSupport {
		gwArgs = append(gwArgs, "--upstream-idle-timeout", mhIdleTimeout.String())
	}
	m.start(m.gw, "cb-gateway", append(m.baseEnv(m.gw), "CB_STACK_KEY="+e2eStackKey), cbBin, gwArgs...)
	m.waitHealthy(m.gw.URL(mhGatewayPort) + "/health")
	return m
}

const mhRedisPassword = "mh-secret-7f3a"

func (m *multiHost) redisURL() string {
	return fmt.Sprintf("redis://:%s@%s", mhRedisPassword, m.gw.Addr(mhRedisPort))
}

// cb runs the cb binary on the operator's machine (the test's namespace).
func (m *multiHost) cb(args ...string) string {
	m.t.Helper()
	out, err := exec.Command(cbBin, args...).CombinedOutput()
	if err != nil {
		m.t.Fatalf("cb %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// hostDir is the host's own directory: its TMPDIR (so the blend server's KV
// socket, $TMPDIR/cb-blend-<uid>/kv.sock, is the host's), its Redis data.
func (m *multiHost) hostDir(h *netns.Host) string {
	d := filepath.Join(m.dir, "hosts", h.Name)
	if err := os.MkdirAll(filepath.Join(d, "tmp"), 0o700); err != nil {
		m.t.Fatal(err)
	}
	return d
}

// baseEnv is the environment of every cb process of host h: the OTLP
// endpoint on host gw and the host's TMPDIR; nothing of the test's own
// OTEL_/CB_ environment.
func (m *multiHost) baseEnv(h *netns.Host) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, "CB_") && !strings.HasPrefix(kv, "TMPDIR=") {
			env = append(env, kv)
		}
	}
	return append(env, "OTEL_EXPORTER_OTLP_ENDPOINT="+m.gw.URL(mhOTLPPort), "OTEL_BSP_SCHEDULE_DELAY=100",
		"TMPDIR="+filepath.Join(m.hostDir(h), "tmp"))
}

// tlsEnv is baseEnv with CB_<CMD>_TLS_CERT/KEY/CA naming the host's files
// from cb certs issue, and extra.
func (m *multiHost) tlsEnv(h *netns.Host, cmd string, extra ...string) []string {
	d := filepath.Join(m.pki, "hosts", h.Name)
	up := strings.ToUpper(cmd)
	env := append(m.baseEnv(h),
		"CB_"+up+"_TLS_CERT="+filepath.Join(d, "cb-"+cmd+".pem"),
		"CB_"+up+"_TLS_KEY="+filepath.Join(d, "cb-"+cmd+"-key.pem"),
		"CB_"+up+"_TLS_CA="+filepath.Join(d, "ca.pem"))
	return append(env, extra...)
}

// start runs exe args in host h's namespace; env nil keeps the test's.
func (m *multiHost) start(h *netns.Host, name string, env []string, exe string, args ...string) *mhProc {
	m.t.Helper()
	p := &mhProc{name: h.Name + "/" + name, logs: &syncWriter{}, done: make(chan struct{})}
	p.cmd = h.Command(context.Background(), exe, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		m.t.Fatalf("start %s: %v", p.name, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	m.procs = append(m.procs, p)
	return p
}

// stopAll stops every process (SIGCONT first: a stopped one cannot handle
// SIGTERM), SIGKILL after 15 s; on failure it logs their last lines.
func (m *multiHost) stopAll() {
	for _, p := range m.procs {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range m.procs {
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			m.t.Errorf("%s did not stop on SIGTERM", p.name)
			p.cmd.Process.Kill()
			<-p.done
		}
		if m.t.Failed() {
			m.t.Logf("--- %s:\n%s", p.name, tail(p.logs.String(), 25))
		}
	}
}

// waitHealthy polls url (from host gw) until it answers 200, at most 120 s.
func (m *multiHost) waitHealthy(url string) {
	m.t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		code, body := m.get(url)
		if code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("%s not healthy: %d %s", url, code, body)
		}
		for _, p := range m.procs {
			select {
			case <-p.done:
				m.t.Fatalf("%s exited: %v\n%s", p.name, p.cmd.ProcessState, tail(p.logs.String(), 30))
			default:
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (m *multiHost) get(url string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := m.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post sends a JSON body (from host gw) and returns the answer.
func (m *multiHost) post(url string, hdr map[string]string, body []byte, timeout time.Duration) answer {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	m.mu.Lock()
	m.requests++
	m.mu.Unlock()
	t0 := time.Now()
	resp, err := m.client.Do(req)
	if err != nil {
		return answer{body: err.Error(), took: time.Since(t0)}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(raw), took: time.Since(t0)}
}

func (m *multiHost) chat(base string, hdr map[string]string, content string, maxTokens int) answer {
	return m.post(base+"/v1/chat/completions", hdr, chatBody(content, maxTokens, false, nil), 60*time.Second)
}

// ingest posts documents to base's /v1/documents in the body format
// deploy/README.md documents.
func (m *multiHost) ingest(base string, docs []demo.Document) (answer, api.DocumentList) {
	var in []map[string]string
	for _, d := range docs {
		in = append(in, map[string]string{"id": d.ID, "text": d.Text})
	}
	b, _ := json.Marshal(map[string]any{"documents": in})
	a := m.post(base+"/v1/documents", nil, b, 60*time.Second)
	var out api.DocumentList
	if a.status == http.StatusOK {
		json.Unmarshal([]byte(a.body), &out)
	}
	return a, out
}

// reused is the prompt tokens a chat answer reused (usage.cacheblend).
func reused(a answer) int {
	var out struct{ Usage api.Usage }
	if json.Unmarshal([]byte(a.body), &out) != nil || out.Usage.CacheBlend == nil {
		return -1
	}
	return out.Usage.CacheBlend.PrefixHitTokens + out.Usage.CacheBlend.NonPrefixHitTokens
}

// metric sums the samples of name (lines starting with name, optionally
// filtered by a substring) on a /metrics page.
func (m *multiHost) metric(url, name, filter string) float64 {
	_, body := m.get(url)
	sum := 0.0
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, name) || !strings.Contains(l, filter) {
			continue
		}
		if f := strings.Fields(l); len(f) >= 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			sum += v
		}
	}
	return sum
}

// awaitFleetWrites waits until host h's blend server has written to Redis
// and its count stopped changing for a second (at most 40 s).
func (m *multiHost) awaitFleetWrites(h *netns.Host) float64 {
	m.t.Helper()
	url := h.URL(mhBlendMet) + "/metrics"
	last, stable := -1.0, 0
	deadline := time.Now().Add(40 * time.Second)
	for stable < 4 {
		if time.Now().After(deadline) {
			m.t.Errorf("%s: fleet writes did not settle (lmcache_blend_remote_writes_total %v)", h.Name, last)
			return last
		}
		time.Sleep(250 * time.Millisecond)
		v := m.metric(url, "lmcache_blend_remote_writes_total", "")
		if v > 0 && v == last {
			stable++
		} else {
			stable = 0
		}
		last = v
	}
	return last
}

// trace fetches a trace from the collector on host gw once it has want and
// stopped growing (at most 30 s).
func (m *multiHost) trace(t *testing.T, traceID string, want ...string) *tracecheck.Trace {
	t.Helper()
	jc, err := jaeger.NewClient(m.gw.URL(mhUIPort), jaeger.ClientConfig{HTTPClient: m.client})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	seen, last := -1, ""
	for time.Now().Before(deadline) {
		if jt, err := jc.Trace(context.Background(), traceID); err == nil {
			trs, err := tracecheck.FromJaeger(jt)
			if err != nil {
				t.Fatal(err)
			}
			have := map[string]bool{}
			for _, s := range trs[0].Spans {
				have[s.Name] = true
			}
			ok := true
			for _, w := range want {
				ok = ok && have[w]
			}
			if ok && len(trs[0].Spans) == seen {
				return &trs[0]
			}
			seen, last = len(trs[0].Spans), fmt.Sprintf("%d spans, want %v", len(trs[0].Spans), want)
		} else {
			last = err.Error()
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("trace %s: %s", traceID, last)
	return nil
}

// fleetDoc is a document no other test step uses, of n bytes (n tokens:
// the built-in model's tokenizer is byte-level).
func fleetDoc(id string, n int) demo.Document {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "%s record %d: the relay at station %d logged %d packets. ", id, i, i*7%31, i*131%977)
	}
	return demo.Document{ID: id, Text: sb.String()[:n]}
}

// happy: routing to both nodes, a document ingested on node A reused on
// node B through Redis (cb.coordinator_match), prefill on a node and decode
// on the decode host with the KV pulled across hosts.
func (m *multiHost) happy(t *testing.T) {
	gw := m.gw.URL(mhGatewayPort)
	// Routing: distinct prompts through the gateway, four at a time.
	engines := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := m.chat(gw, nil, fmt.Sprintf("Question %d: name a prime number above %d.", i, i*17), 8)
			mu.Lock()
			defer mu.Unlock()
			if a.status != http.StatusOK {
				t.Errorf("request %d: %d %s", i, a.status, a.body)
				return
			}
			engines[a.header.Get("X-Cb-Engine")]++
			if r, ok := api.ParseKVReport(a.header); !ok || r.BlocksSent == 0 {
				t.Errorf("request %d: no hand-over to the decode host: %v", i, a.header)
			}
		}()
		if i%4 == 3 {
			wg.Wait()
		}
	}
	wg.Wait()
	if engines[m.a.Addr(mhEnginePort)] == 0 || engines[m.b.Addr(mhEnginePort)] == 0 {
		t.Errorf("the gateway routed %v, want both nodes", engines)
	}
	t.Logf("12 requests through the gateway: %v, every one handed over to %s", engines, m.dec.Addr(mhEnginePort))

	// A document ingested on node A, reused on node B through Redis.
	doc := fleetDoc("happy", 2048)
	a, list := m.ingest(m.a.URL(mhEnginePort), []demo.Document{doc})
	if a.status != http.StatusOK || len(list.Data) != 1 {
		t.Fatalf("ingest on node A: %d %s", a.status, a.body)
	}
	m.awaitFleetWrites(m.a)
	const tp = "00-6a1f2f3577b34da6a3ce929d0e0e4701-00f067aa0ba902b7-01"
	ans := m.chat(m.b.URL(mhEnginePort), map[string]string{"traceparent": tp}, demo.Prompt([]demo.Document{doc}, "Question: which station logged the most packets?"), 4)
	if ans.status != http.StatusOK {
		t.Fatalf("node B: %d %s", ans.status, ans.body)
	}
	hit := reused(ans)
	tr := m.trace(t, "6a1f2f3577b34da6a3ce929d0e0e4701", spanname.CBRequest, spanname.CBCoordinatorMatch)
	cm := byName(tr)[spanname.CBCoordinatorMatch][0]
	matches, _ := cm.Attributes["matches"].Number()
	if matches < 1 || float64(hit) < 0.9*float64(len(doc.Text)) {
		t.Errorf("node B reused %d of the document's %d tokens, cb.coordinator_match %v", hit, len(doc.Text), cm.Attributes)
	}
	t.Logf("document of %d tokens ingested on node A (%d reported), node B reused %d (%.1f%%), cb.coordinator_match matches %v; services %v",
		len(doc.Text), list.Data[0].Tokens, hit, 100*float64(hit)/float64(len(doc.Text)), matches, services(tr))

	// P/D across hosts with a shared prefix: the second hand-over deduplicates blocks.
	docs := []demo.Document{demo.Documents()[1], demo.Documents()[4]}
	r1 := m.chat(gw, nil, demo.Prompt(docs, "Question: what do these documents have in common?"), 8)
	r2 := m.chat(gw, nil, demo.Prompt(docs, "Question: which one is longer?"), 8)
	k1, ok1 := api.ParseKVReport(r1.header)
	k2, ok2 := api.ParseKVReport(r2.header)
	if r1.status != 200 || r2.status != 200 || !ok1 || !ok2 || k1.BlocksSent == 0 {
		t.Fatalf("P/D: %d %v / %d %v", r1.status, r1.header, r2.status, r2.header)
	}
	t.Logf("P/D across hosts: first hand-over %d blocks sent (%d bytes) in %v; second %d sent, %d deduplicated, in %v",
		k1.BlocksSent, k1.Bytes, r1.took.Round(time.Millisecond), k2.BlocksSent, k2.BlocksDeduped, r2.took.Round(time.Millisecond))
}

// redisPaused: Redis stopped (SIGSTOP) for 10 s while node A ingests a
// document; afterwards node B reuses at least 95 % of its tokens, or the
// ingest answer said the document was not shared.
func (m *multiHost) redisPaused(t *testing.T) {
	doc := fleetDoc("paused", 2048)
	errsBefore := m.metric(m.a.URL(mhBlendMet)+"/metrics", "lmcache_blend_remote_errors_total", "")
	if err := m.redis.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			m.redis.cmd.Process.Signal(syscall.SIGCONT)
			resumed = true
		}
	}
	defer resume()
	a, list := m.ingest(m.a.URL(mhEnginePort), []demo.Document{doc})
	ingestTook := a.took
	time.Sleep(10*time.Second - time.Since(stopped))
	resume()
	if a.status != http.StatusOK || len(list.Data) != 1 {
		t.Fatalf("ingest during the pause: %d %s", a.status, a.body)
	}
	// Redis was stopped: the answer must not say the document is shared.
	state := ingestFleetState(a.body)
	if state != "pending" && state != "not_shared" {
		t.Errorf("ingest during the pause answered fleet %q, want pending or not_shared: %s", state, a.body)
	}
	notShared := state == "not_shared"
	// Give the node time to re-publish: its writes settle.
	m.awaitFleetWrites(m.a)
	ans := m.chat(m.b.URL(mhEnginePort), nil, demo.Prompt([]demo.Document{doc}, "Question: which station logged the fewest packets?"), 4)
	if ans.status != http.StatusOK {
		t.Fatalf("node B: %d %s", ans.status, ans.body)
	}
	hit := reused(ans)
	errsAfter := m.metric(m.a.URL(mhBlendMet)+"/metrics", "lmcache_blend_remote_errors_total", "")
	t.Logf("ingest during a 10 s Redis pause answered %d in %v (fleet %q); node B then reused %d of %d tokens (%.1f%%); node A's remote errors %v → %v",
		a.status, ingestTook.Round(time.Millisecond), state, hit, len(doc.Text),
		100*float64(hit)/float64(len(doc.Text)), errsBefore, errsAfter)
	if float64(hit) < 0.95*float64(len(doc.Text)) && !notShared {
		t.Errorf("silent loss: node B reused %d of the document's %d tokens after the pause and the ingest answer (%s) did not say it was not shared",
			hit, len(doc.Text), a.body)
	}
}

// ingestFleetState returns the fleet state the /v1/documents answer gives
// its one document ("shared", "pending", "not_shared"; "" when none).
func ingestFleetState(body string) string {
	var out struct {
		Data []struct {
			Fleet string `json:"fleet"`
		} `json:"data"`
	}
	if json.Unmarshal([]byte(body), &out) != nil || len(out.Data) != 1 {
		return ""
	}
	return out.Data[0].Fleet
}

// decodeDown: the decode host's link goes down under load. Every request is
// answered (whole on the prefill side once no decode engine is reachable),
// none takes longer than the request deadline, and the gateway's /health
// says "degraded" while it lasts.
func (m *multiHost) decodeDown(t *testing.T) {
	gw := m.gw.URL(mhGatewayPort)
	const total, conc = 30, 6
	type res struct {
		status int
		took   time.Duration
		whole  bool
		body   string
	}
	results := make(chan res, total)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				a := m.post(gw+"/v1/chat/completions", nil,
					chatBody(fmt.Sprintf("Question %d: count the vowels in the word station%d.", i, i), 16, false, nil), mhRequestTimeout+10*time.Second)
				_, handed := api.ParseKVReport(a.header)
				results <- res{a.status, a.took, !handed, a.body}
			}
		}()
	}
	var downAt, upAt time.Time
	healthSeen := map[string]int{}
	stopPoll := make(chan struct{})
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(100 * time.Millisecond):
			}
			code, body := m.get(gw + "/health")
			var h struct{ Status string }
			json.Unmarshal([]byte(body), &h)
			m.mu.Lock()
			if !downAt.IsZero() {
				healthSeen[fmt.Sprintf("%d %s", code, h.Status)]++
			}
			m.mu.Unlock()
		}
	}()
	go func() {
		for i := range total {
			if i == conc {
				if err := m.dec.LinkDown(); err != nil {
					t.Error(err)
				}
				m.mu.Lock()
				downAt = time.Now()
				m.mu.Unlock()
			}
			jobs <- i
		}
		close(jobs)
	}()
	wg.Wait()
	close(results)
	// The health while the link is still down, then bring it back.
	time.Sleep(4 * mhHealthInterval)
	close(stopPoll)
	<-pollDone
	if err := m.dec.LinkUp(); err != nil {
		t.Fatal(err)
	}
	upAt = time.Now()
	var ok, whole int
	var longest time.Duration
	for r := range results {
		longest = max(longest, r.took)
		if r.status == http.StatusOK {
			ok++
		} else {
			t.Errorf("request answered %d after %v: %s", r.status, r.took.Round(time.Millisecond), r.body)
		}
		if r.whole && r.status == http.StatusOK {
			whole++
		}
	}
	if longest > mhRequestTimeout+time.Second {
		t.Errorf("longest request %v, deadline %v", longest, mhRequestTimeout)
	}
	if healthSeen["200 degraded"] == 0 {
		t.Errorf("gateway /health while the decode host was down: %v, want 200 degraded", healthSeen)
	}
	// Back: the gateway hands over again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := m.get(gw + "/health")
		if code == 200 && strings.Contains(body, `"status":"ok"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not ok after the decode host came back: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("decode host down under load: %d/%d answered 200 (%d whole on the prefill side), longest %v (deadline %v); /health while down %v; ok again %v after the link came back",
		ok, total, whole, longest.Round(time.Millisecond), mhRequestTimeout, healthSeen, time.Since(upAt).Round(time.Millisecond))
	m.mu.Lock()
	m.failovers++
	m.mu.Unlock()
}

// nodeCutStream: a stream through the gateway whose prefill node's link is
// cut after its first tokens: the client sees an error or the completion
// within the idle timeout of the cut, never a silent gap longer.
func (m *multiHost) nodeCutStream(t *testing.T) {
	if !m.idleTimeoutSupport {
		t.Errorf("cb gateway has no --upstream-idle-timeout flag: the upstream idle timeout (issue 26 item 7) is not in this build")
	}
	gw := m.gw.URL(mhGatewayPort)
	ctx, cancel := context.WithTimeout(context.Background(), mhRequestTimeout+15*time.Second)
	defer cancel()
	body := chatBody(demo.Prompt(demo.Documents()[2:3], "Question: retell this document at length."), 1500, true, nil)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	m.mu.Lock()
	m.requests++
	m.mu.Unlock()
	t0 := time.Now()
	resp, err := m.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	var node *netns.Host
	switch resp.Header.Get("X-Cb-Engine") {
	case m.a.Addr(mhEnginePort):
		node = m.a
	case m.b.Addr(mhEnginePort):
		node = m.b
	default:
		t.Fatalf("stream served by %q", resp.Header.Get("X-Cb-Engine"))
	}
	var cutAt, last time.Time
	var maxGap, gapAfterCut time.Duration
	var events, afterCut int
	end := "connection ended without [DONE]"
	sc := bufio.NewScanner(resp.Body)
	last = time.Now()
	for sc.Scan() {
		now := time.Now()
		line := sc.Text()
		if line == "" {
			continue
		}
		gap := now.Sub(last)
		maxGap = max(maxGap, gap)
		if !cutAt.IsZero() {
			afterCut++
			gapAfterCut = max(gapAfterCut, gap)
		}
		last = now
		events++
		if strings.Contains(line, `"error"`) {
			end = "error event: " + line
		}
		if line == "data: [DONE]" {
			if !strings.HasPrefix(end, "error") {
				end = "completion"
			}
			break
		}
		if events == 5 && cutAt.IsZero() {
			if err := node.LinkDown(); err != nil {
				t.Fatal(err)
			}
			cutAt = time.Now()
			defer func() {
				if err := node.LinkUp(); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	if err := sc.Err(); err != nil {
		end = "read error: " + err.Error()
	}
	ended := time.Now()
	if cutAt.IsZero() {
		t.Fatalf("the stream ended after %d lines, before the cut (%s)", events, end)
	}
	t.Logf("stream on %s cut after 5 lines (%v in): ended %v after the cut with %s; %d lines after the cut, longest gap %v (after the cut %v), idle timeout %v",
		node.Name, cutAt.Sub(t0).Round(time.Millisecond), ended.Sub(cutAt).Round(time.Millisecond), end, afterCut,
		maxGap.Round(time.Millisecond), gapAfterCut.Round(time.Millisecond), mhIdleTimeout)
	if slack := mhIdleTimeout + 2*time.Second; ended.Sub(cutAt) > slack || maxGap > slack {
		t.Errorf("after the cut the client waited %v (longest silence %v), want the end within the idle timeout %v",
			ended.Sub(cutAt).Round(time.Millisecond), maxGap.Round(time.Millisecond), mhIdleTimeout)
	}
	// The node back: the gateway routes to it again.
	node.LinkUp()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := m.get(gw + "/health")
		if code == 200 && strings.Count(body, `"up":true`) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not back in the gateway's health: %d %s", node.Name, code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	m.mu.Lock()
	m.failovers++
	m.mu.Unlock()
}

// everyTraceChecks: more requests and ingests through the gateway, then
// `cb check` (run on host gw against cb traces, as deploy/README.md says)
// passes on every trace of the run.
func (m *multiHost) everyTraceChecks(t *testing.T) {
	gw := m.gw.URL(mhGatewayPort)
	for i := range 2 {
		d := fleetDoc(fmt.Sprintf("check%d", i), 700)
		if a, _ := m.ingest(gw, []demo.Document{d}); a.status != http.StatusOK {
			t.Errorf("ingest through the gateway: %d %s", a.status, a.body)
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := 0; m.requests < 100; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			prompt := fmt.Sprintf("Question %d: what is %d plus %d?", i, i, i*3)
			if i%3 == 0 {
				prompt = ragPrompt(i%8, (i+3)%8)
			}
			if a := m.chat(gw, nil, prompt, 6); a.status != http.StatusOK {
				t.Errorf("request %d: %d %s", i, a.status, a.body)
			}
		}()
		if i > 200 {
			break
		}
		wg.Wait() // keeps m.requests exact
	}
	wg.Wait()
	time.Sleep(3 * time.Second) // the last spans' export
	var outs []string
	for _, svc := range []string{"cb-gateway", "cb-engine"} {
		cmd := m.gw.Command(context.Background(), cbBin, "check", "--url", m.gw.URL(mhUIPort), "--service", svc, "--lookback", "15m", "--limit", "1000")
		out, err := cmd.CombinedOutput()
		pass, fail := checkSummary(string(out))
		outs = append(outs, fmt.Sprintf("cb check --service %s: %d traces pass, %d fail (%v)", svc, pass, len(fail), err))
		if err != nil {
			if len(fail) > 8 {
				fail = fail[:8]
			}
			t.Errorf("cb check --service %s fails (%d requests in the run, %d with a failover or a partition): %v; failing traces:\n%s",
				svc, m.requests, m.failovers, err, strings.Join(fail, "\n"))
		}
	}
	t.Logf("%d requests and ingests in the run; %s", m.requests, strings.Join(outs, "\n"))
}

// checkSummary counts the passing traces of cb check's report and returns
// the blocks of the failing ones.
func checkSummary(out string) (pass int, fail []string) {
	for _, block := range strings.Split(out, "\n\n") {
		block = strings.TrimSpace(block)
		switch {
		case strings.HasPrefix(block, "PASS"):
			pass++
		case strings.HasPrefix(block, "FAIL"):
			fail = append(fail, block)
		}
	}
	return pass, fail
}
