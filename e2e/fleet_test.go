package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/demo"
	"github.com/cacheblend/cacheblend/internal/redistest"
	"github.com/cacheblend/cacheblend/tracecheck"
)

// TestFleetTwoNodesShareDocuments: two nodes (two `cb up` stacks) share one
// Redis fleet tier. Documents ingested on node A are reused by a request on
// node B, which never saw them: B's trace holds cb.coordinator_match with
// matches and a Redis load, B reuses at least 90 % of the documents'
// tokens, and B's answer is A's answer to the same request with reuse. On
// one Redis server, on a 3-master Redis Cluster, and with both nodes' workers
// running as two tensor-parallel ranks (--tp 2: the fleet holds every rank's
// chunks and B's coordinator match and load cover both ranks).
func TestFleetTwoNodesShareDocuments(t *testing.T) {
	t.Run("single", func(t *testing.T) { fleetTwoNodes(t, redistest.Start(t, redistest.Options{}).URL(), 1) })
	t.Run("cluster", func(t *testing.T) { fleetTwoNodes(t, redistest.StartCluster(t).URL(), 1) })
	t.Run("tp2", func(t *testing.T) { fleetTwoNodes(t, redistest.Start(t, redistest.Options{}).URL(), 2) })
}

func fleetTwoNodes(t *testing.T, url string, tp int) {
	// A generous Redis deadline too: a pipelined read of megabytes that
	// overruns the default 250 ms on a loaded machine is a miss.
	// The URL and the fleet key reach cb blend in its environment
	// (CB_BLEND_REDIS_URL, CB_BLEND_FLEET_KEY).
	fleetArgs := []string{"--coordinator-timeout", "2s", "--redis-timeout", "5s"}
	// --no-store: a request's prompt is not stored (through Redis the
	// other node would reuse it whole), so both nodes reuse the documents
	// alone, one plan, and must give one answer (CacheBlend is approximate:
	// another plan may give another answer).
	// A generous lookup deadline: on a loaded machine (the race detector,
	// parallel packages) a lookup that gives up is a full prefill, and this
	// test is about what the lookup finds, not how fast.
	engineArgs := []string{"--no-store", "--lookup-timeout", "10s"}
	a := startEnv(t, options{redisURL: url, blendArgs: fleetArgs, engineArgs: engineArgs, tp: tp})
	b := startEnv(t, options{redisURL: url, blendArgs: fleetArgs, engineArgs: engineArgs, tp: tp})
	a.ingest()
	a.awaitFleetWrites()

	prompt := ragPrompt(2, 0, 5)
	const tpB = "00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-01"
	outB := b.chat(tpB, prompt, 8)
	tr := b.trace("4bf92f3577b34da6a3ce929d0e0e4737", spanname.CBRequest, spanname.CBCoordinatorMatch, spanname.CBL2Load, spanname.CBRetrieve)
	spec, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	if rep := tracecheck.Check([]tracecheck.Trace{*tr}, spec); !rep.OK() {
		t.Fatalf("node B's trace fails the contract:\n%s", rep.String())
	}
	num := func(s *tracecheck.Span, k string) float64 { v, _ := s.Attributes[k].Number(); return v }
	spans := byName(tr)
	req := spans[spanname.CBRequest][0]
	cm := spans[spanname.CBCoordinatorMatch][0]
	if num(cm, "matches") < 1 || cm.Attributes["timed_out"].String() != "false" {
		t.Fatalf("cb.coordinator_match %v", cm.Attributes)
	}
	if got := num(req, "world_size"); int(got) != tp {
		t.Fatalf("cb.request world_size %v, want %d", got, tp)
	}
	if got := len(spans[spanname.CBRetrieve]); got < tp {
		t.Fatalf("%d cb.retrieve spans on node B, want one per rank (%d) at least", got, tp)
	}
	redisLoad := false
	for _, s := range spans[spanname.CBL2Load] {
		redisLoad = redisLoad || (s.Attributes["tier"].String() == "redis" && num(s, "chunks") > 0)
	}
	if !redisLoad {
		t.Fatal("no cb.l2_load from Redis on node B")
	}
	docTokens := 0.0
	for _, i := range []int{2, 0, 5} {
		docTokens += float64(len(demo.Documents()[i].Text)) // byte-level tokenizer: a token per byte
	}
	hit := num(req, "prefix_hit_tokens") + num(req, "non_prefix_hit_tokens")
	if hit < 0.9*docTokens {
		t.Fatalf("node B reused %v of the documents' %v tokens", hit, docTokens)
	}

	// The same request on node A, where the documents were ingested.
	outA := a.chat("", prompt, 8)
	if fmt.Sprint(text(outA)) != fmt.Sprint(text(outB)) {
		t.Fatalf("node B's answer %q differs from node A's %q", text(outB), text(outA))
	}
	// Another prompt over the same documents: another answer, on both
	// nodes (the comparisons can fail).
	prompt2 := ragPrompt(5, 0, 2)
	outA2, outB2 := a.chat("", prompt2, 8), b.chat("", prompt2, 8)
	if text(outA2) != text(outB2) {
		t.Fatalf("second prompt: node B's answer %q differs from node A's %q", text(outB2), text(outA2))
	}
	requireDistinctText(t, text(outA), text(outA2))
	t.Logf("node B reused %.0f of %.0f document tokens through Redis", hit, docTokens)
}

// awaitFleetWrites waits until the blend server's writes to the fleet tier
// have landed (lmcache_blend_remote_writes_total above zero and unchanged
// for half a second): an ingest answers once the documents are stored on
// the node, and their copy to Redis follows asynchronously.
func (e *env) awaitFleetWrites() {
	e.t.Helper()
	url := e.stack.Endpoints().Blend.Metrics
	last, stable := -1.0, 0
	deadline := time.Now().Add(30 * time.Second)
	for stable < 3 {
		if time.Now().After(deadline) {
			e.t.Fatalf("the fleet writes did not settle: lmcache_blend_remote_writes_total %v", last)
		}
		time.Sleep(250 * time.Millisecond)
		n := scrapeSum(e.t, url, "lmcache_blend_remote_writes_total")
		if n > 0 && n == last {
			stable++
		} else {
			stable = 0
		}
		last = n
	}
}

// text is a chat completion's message content.
func text(out map[string]any) string {
	ch, _ := out["choices"].([]any)
	if len(ch) == 0 {
		return ""
	}
	msg, _ := ch[0].(map[string]any)["message"].(map[string]any)
	s, _ := msg["content"].(string)
	return s
}

// TestFleetFaults: every request is answered while the fleet tier's Redis
// is paused (SIGSTOP: the coordinator match is bounded by its timeout and
// says timed_out), killed, and restarted (then reuse through Redis resumes
// once node A has stored its documents again).
func TestFleetFaults(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	a := startEnv(t, options{redisURL: srv.URL(), blendArgs: []string{"--coordinator-timeout", "2s"}})
	b := startEnv(t, options{redisURL: srv.URL(), blendArgs: []string{"--coordinator-timeout", "100ms", "--redis-timeout", "200ms"}})
	a.ingest()

	srv.Pause()
	const tpPaused = "00-4bf92f3577b34da6a3ce929d0e0e4738-00f067aa0ba902b7-01"
	start := time.Now()
	b.chat(tpPaused, ragPrompt(1, 3), 2)
	took := time.Since(start)
	srv.Resume()
	tr := b.trace("4bf92f3577b34da6a3ce929d0e0e4738", spanname.CBRequest, spanname.CBCoordinatorMatch)
	cm := byName(tr)[spanname.CBCoordinatorMatch][0]
	if cm.Attributes["timed_out"].String() != "true" || cm.Duration() > time.Second {
		t.Fatalf("coordinator match with Redis paused: %v, %v", cm.Attributes, cm.Duration())
	}
	t.Logf("request answered in %v with Redis paused; coordinator match gave up after %v", took, cm.Duration())

	srv.Kill()
	b.chat("", ragPrompt(4, 6), 2) // answered: local tiers, then full prefill
	srv.Restart()
	a.ingest() // node A stores its documents again: their chunks go back to Redis
	const tpBack = "00-4bf92f3577b34da6a3ce929d0e0e4739-00f067aa0ba902b7-01"
	deadline := time.Now().Add(30 * time.Second)
	for {
		b.chat(tpBack, ragPrompt(7, 6), 2)
		tr := b.trace("4bf92f3577b34da6a3ce929d0e0e4739", spanname.CBRequest, spanname.CBCoordinatorMatch)
		cms := byName(tr)[spanname.CBCoordinatorMatch]
		if v, _ := cms[len(cms)-1].Attributes["matches"].Number(); v >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("reuse through Redis did not resume after the restart")
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestUpNodes runs `cb up --nodes 2` as a user would: it starts redis-server
// itself, two nodes share it (documents ingested through node 0 are reused
// by node 1, as its blend server's metrics show), a gateway in front of
// both engines serves --api, the endpoints file lists the gateway, the
// nodes and the Redis URL (mode 0600: the URL carries the password), cb
// load runs unchanged against the gateway, and SIGINT stops every process,
// the gateway and redis-server included.
func TestUpNodes(t *testing.T) {
	dir := t.TempDir()
	eps := filepath.Join(dir, "endpoints.json")
	cmd := exec.Command(cbBin, "up", "--nodes", "2", "--api", "127.0.0.1:0", "--ui-addr", "127.0.0.1:0", "--endpoints-file", eps,
		"--state-dir", filepath.Join(dir, "state"), "--blend-arg=--coordinator-timeout=2s", "--blend-arg=--redis-timeout=5s")
	cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=")
	var out syncWriter
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited, done := waitCmd(cmd)
	defer func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
	}()
	var b []byte
	deadline := time.Now().Add(120 * time.Second)
	for {
		var err error
		if b, err = os.ReadFile(eps); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no endpoints file:\n%s", tail(out.String(), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if fi, err := os.Stat(eps); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("endpoints file mode: %v %v", fi.Mode(), err)
	}
	type ep struct {
		API, GRPC, Metrics string
		PID                int
	}
	var e struct {
		Gateway *ep
		Engine  ep
		Nodes   []struct{ Engine, Worker, Blend ep }
		Redis   *struct {
			URL string
			PID int
		}
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if len(e.Nodes) != 2 || e.Redis == nil || !strings.HasPrefix(e.Redis.URL, "redis://") || e.Redis.PID == 0 ||
		e.Nodes[0].Engine.API != e.Engine.API || e.Nodes[1].Engine.API == e.Engine.API ||
		e.Gateway == nil || e.Gateway.API == e.Engine.API || e.Gateway.PID == 0 || e.Gateway.Metrics != e.Gateway.API+"/metrics" {
		t.Fatalf("endpoints %s", b)
	}
	// The gateway on --api serves both nodes' engines.
	if h, err := httpGet(e.Gateway.API + "/health"); err != nil || strings.Count(h, `"up":true`) != 2 {
		t.Fatalf("gateway health %q %v", h, err)
	}
	a := &env{t: t, api: e.Nodes[0].Engine.API}
	n1 := &env{t: t, api: e.Nodes[1].Engine.API}
	a.ingest()
	n1.chat("", ragPrompt(3, 1), 2)
	metrics, err := httpGet(e.Nodes[1].Blend.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, `lmcache_blend_coordinator_matches_total{result="ok"} 1`) ||
		strings.Contains(metrics, `lmcache_blend_remote_reads_total{result="hit"} 0`) {
		t.Fatalf("node 1 did not reuse through Redis:\n%s", grepLines(metrics, "lmcache_blend_"))
	}
	// cb load works unchanged against the gateway: its cross-check reads the gateway's
	// /metrics (exit 1 on a failed request or a mismatch).
	load := exec.Command(cbBin, "load", "--api", e.Gateway.API, "--requests", "12", "--concurrency", "4",
		"--docs", "1", "--max-tokens", "4", "--ingest")
	if out, err := load.CombinedOutput(); err != nil || !strings.Contains(string(out), "requests: counted 12 (0 with error_type), sent 12: OK") {
		t.Fatalf("cb load against the gateway: %v\n%s", err, out)
	}
	pids := []int{e.Redis.PID, e.Gateway.PID}
	for _, n := range e.Nodes {
		pids = append(pids, n.Engine.PID, n.Worker.PID, n.Blend.PID)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("cb up exited with %v:\n%s", err, tail(out.String(), 30))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("cb up did not stop on SIGINT")
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("process %d still running after cb up stopped", pid)
		}
	}
}
