package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/apiclient"
	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/demo"
	"github.com/cacheblend/cacheblend/stack"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore"
)

// smallModel keeps the worker fast: a 4-layer model of width 64.
var smallModel = []string{"--layers=4", "--dim=64", "--heads=4", "--kv-heads=2", "--ffn-dim=128"}

// startGatewayNodes starts the collector and `nodes` nodes sharing a fleet
// tier behind a gateway with gatewayArgs (stack.Up with Nodes, as `cb up
// --nodes N`); e.api is the gateway's API.
func startGatewayNodes(t *testing.T, nodes int, gatewayArgs, engineArgs []string) *env {
	t.Helper()
	e := &env{t: t, logs: &syncWriter{}}
	col, err := tracestore.New(tracestore.Config{OTLPAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0"}, component.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := col.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.col, e.queryURL = col, "http://"+col.QueryAddr()
	st, err := stack.Up(context.Background(), stack.UpConfig{
		Exe: cbBin, APIAddr: "127.0.0.1:0", Nodes: nodes, GatewayArgs: gatewayArgs,
		WorkerArgs: smallModel, EngineArgs: engineArgs, BlendArgs: []string{"--coordinator-timeout=2s"},
		Env:          []string{"OTEL_BSP_SCHEDULE_DELAY=100"},
		OTLPEndpoint: "http://" + col.OTLPAddr() + "/v1/traces", OTLPProtocol: "http/protobuf",
		Supervisor: stack.Config{Logs: e.logs, ReadyTimeout: 120 * time.Second},
	})
	if err != nil {
		col.Shutdown(context.Background())
		t.Fatalf("stack up: %v\nlogs:\n%s", err, tail(e.logs.String(), 60))
	}
	e.stack = st
	e.api = st.Endpoints().API()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Errorf("stack shutdown: %v", err)
		}
		col.Shutdown(ctx)
		if t.Failed() {
			t.Logf("process logs:\n%s", tail(e.logs.String(), 80))
		}
	})
	return e
}

// checkedTrace waits until the trace has the spans named in want and passes the span
// contract (spans of the worker and the blend server may arrive a little later than the
// gateway's and the engine's), or fails the test after 30 s.
func (e *env) checkedTrace(traceID string, spec *contract.SpanSet, want ...string) *tracecheck.Trace {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tr := e.trace(traceID, want...)
		rep := tracecheck.Check([]tracecheck.Trace{*tr}, spec)
		if rep.OK() {
			return tr
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("trace %s fails the contract:\n%s", traceID, rep)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// docChunks is the number of tokens in the full 256-token chunks of a chat prompt up to the end
// of d (BOS, the chat template's user header, demo.Prompt's preamble, then d).
func docChunks(d ragDoc) int {
	n := 1 + len("<|user|>\n") + len("Answer using only these documents.\n\n") + len(d.text)
	return n / 256 * 256
}

// ragDoc is one document of the routing workload: two sample documents.
type ragDoc struct{ text string }

func ragDocs() []ragDoc {
	d := demo.Documents()
	var out []ragDoc
	for i := 0; i+1 < len(d) && len(out) < 4; i += 2 {
		out = append(out, ragDoc{text: d[i].Text + "\n\n" + d[i+1].Text})
	}
	return out
}

// routed is one request of the routing workload as measured.
type routed struct {
	doc        int
	sent, done time.Time
	res        apiclient.ChatResult
	err        error
	engine     string  // route.engine of the gateway's span
	hitTokens  float64 // prefix + non-prefix hit tokens of cb.request
	prefixHit  float64 // prefix hit tokens: chunks found in the node's own tiers by chain key
	redisLoad  bool    // a cb.l2_load from the fleet tier (Redis)
	afterFirst bool    // sent after the first request for its document completed
}

// policyRun is the outcome of the routing workload under one policy.
type policyRun struct {
	policy        string
	hits, counted int
	anyReuse      int // counted requests whose engine reused >= 90 % of the document, from any tier
	excluded      int
	share         map[string]int
	ttftP50       time.Duration
	failovers     int
}

// runRouting sends 40 requests over 4 documents (10 each, in a seeded random order, so the
// documents are first seen in random order; each a document plus its own question) through
// the gateway at concurrency 4, then reads every request's trace: the engine it was routed to
// and the tokens its engine reused. A request counts for the hit rate when it was sent after
// its document's first request completed; it is a hit when it landed on a node whose fast
// tier held the document: the node's blend server found every full 256-token chunk of the
// prompt up to the document's end in its own tiers (L1/L2) by the prompt's chain keys
// (cb.request prefix_hit_tokens; the prefix leg never reads the fleet tier). Reuse through
// the fleet tier (Redis, cb.coordinator_match) is not a hit: every node reaches it.
func runRouting(t *testing.T, e *env, policy string) policyRun {
	docs := ragDocs()
	rng := rand.New(rand.NewPCG(15, 40))
	var order []int
	for d := range docs {
		for range 10 {
			order = append(order, d)
		}
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	reqs := make([]*routed, len(order))
	firstDone := make([]time.Time, len(docs))
	var mu sync.Mutex
	c := apiclient.New(e.api, apiclient.Config{})
	next := make(chan int)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				d := order[i]
				q := fmt.Sprintf("Question %d: what does the text above say about document %d, in %d words?", i, d, 5+i%7)
				r := &routed{doc: d, sent: time.Now()}
				mu.Lock()
				r.afterFirst = !firstDone[d].IsZero()
				mu.Unlock()
				r.res, r.err = c.ChatStream(context.Background(), apiclient.ChatRequest{Model: "cb-llama",
					Content: demo.Prompt([]demo.Document{{Text: docs[d].text}}, q), MaxTokens: 4, IgnoreEOS: true, Timeout: 60 * time.Second})
				r.done = time.Now()
				mu.Lock()
				if firstDone[d].IsZero() {
					firstDone[d] = r.done
				}
				mu.Unlock()
				reqs[i] = r
			}
		}()
	}
	for i := range order {
		next <- i
	}
	close(next)
	wg.Wait()

	spec, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	run := policyRun{policy: policy, share: map[string]int{}}
	var ttfts []time.Duration
	for i, r := range reqs {
		if r.err != nil {
			t.Fatalf("%s: request %d: %v", policy, i, r.err)
		}
		ttfts = append(ttfts, r.res.TTFT)
		tr := e.checkedTrace(r.res.TraceID, spec, spanname.GatewayRequest, spanname.GatewayAttempt, spanname.CBRequest,
			spanname.CBSparsePrefetch, spanname.CBExecute, spanname.CBModelForward)
		spans := byName(tr)
		r.engine = spans[spanname.GatewayRequest][0].Attributes["route.engine"].String()
		req := spans[spanname.CBRequest][0]
		p, _ := req.Attributes["prefix_hit_tokens"].Number()
		np, _ := req.Attributes["non_prefix_hit_tokens"].Number()
		r.hitTokens, r.prefixHit = p+np, p
		for _, s := range spans[spanname.CBL2Load] {
			n, _ := s.Attributes["chunks"].Number()
			r.redisLoad = r.redisLoad || s.Attributes["tier"].String() == "redis" && n > 0
		}
		run.share[r.engine]++
		if !r.afterFirst {
			if i > 0 && slices.ContainsFunc(reqs[:i], func(o *routed) bool { return o.doc == r.doc }) {
				run.excluded++ // sent while its document's first request was in flight
			}
			continue
		}
		run.counted++
		if r.prefixHit >= float64(docChunks(docs[r.doc])) {
			run.hits++
		}
		if r.hitTokens >= 0.9*float64(len(docs[r.doc].text)) {
			run.anyReuse++
		}
	}
	sort.Slice(ttfts, func(i, j int) bool { return ttfts[i] < ttfts[j] })
	run.ttftP50 = ttfts[len(ttfts)/2]
	m, err := httpGet(e.api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(grepLines(m, "cb_gateway_failovers_total{"), "\n") {
		var v int
		if f := strings.Fields(l); len(f) == 2 {
			fmt.Sscan(f[1], &v)
		}
		run.failovers += v
	}
	return run
}

func (r policyRun) hitRate() float64 { return float64(r.hits) / float64(max(1, r.counted)) }

func (r policyRun) maxShare() float64 {
	m := 0
	total := 0
	for _, n := range r.share {
		m = max(m, n)
		total += n
	}
	return float64(m) / float64(max(1, total))
}

// TestGatewayKVAwareRouting: 2 nodes behind the gateway, 40 requests over 4 documents. Under
// kv-aware routing, after a document's first request at least 90 % of its requests land on
// a node whose fast tier holds it (its engine reuses the document without a Redis load), and
// neither node serves more than 65 %; least-loaded and round-robin are measured beside it.
// Every trace is one trace from the gateway to the blend server, checked against the
// contract.
func TestGatewayKVAwareRouting(t *testing.T) {
	var runs []policyRun
	for _, policy := range []string{"kv-aware", "least-loaded", "round-robin"} {
		t.Run(policy, func(t *testing.T) {
			e := startGatewayNodes(t, 2, []string{"--policy=" + policy}, nil)
			run := runRouting(t, e, policy)
			runs = append(runs, run)
			if policy == "kv-aware" {
				if run.hitRate() < 0.9 {
					t.Errorf("kv-aware: fast-tier hit rate %.2f (%d of %d), want >= 0.9", run.hitRate(), run.hits, run.counted)
				}
				if run.maxShare() > 0.65 {
					t.Errorf("kv-aware: one node served %.0f%% of the requests %v, want <= 65%%", 100*run.maxShare(), run.share)
				}
			}
		})
	}
	t.Logf("| policy | fast-tier hit rate (after a document's first request) | reuse from any tier (fleet tier included) | busiest node | TTFT p50 (client) |")
	for _, r := range runs {
		t.Logf("| %s | %.2f (%d of %d; %d more sent while the first was in flight) | %.2f | %.0f %% | %.1f ms |",
			r.policy, r.hitRate(), r.hits, r.counted, r.excluded, float64(r.anyReuse)/float64(max(1, r.counted)), 100*r.maxShare(),
			float64(r.ttftP50.Microseconds())/1000)
	}
}

// TestGatewayEngineKilledUnderLoad: one of two engines behind the gateway is killed (SIGKILL)
// under streamed load. Requests that had not begun streaming are retried on the other engine
// and succeed; only requests already streaming from the killed engine end with an error
// event; none hangs; the gateway counts the failovers, and once cb up has restarted the engine
// it serves again.
func TestGatewayEngineKilledUnderLoad(t *testing.T) {
	e := startGatewayNodes(t, 2, []string{"--policy=least-loaded"}, []string{"--max-running=2"})
	eps := e.stack.Endpoints()
	docs := ragDocs()
	c := apiclient.New(e.api, apiclient.Config{})
	const n, conc = 48, 12
	results := make([]apiclient.ChatResult, n)
	errs := make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				results[i], errs[i] = c.ChatStream(context.Background(), apiclient.ChatRequest{Model: "cb-llama",
					Content:   demo.Prompt([]demo.Document{{Text: docs[i%len(docs)].text}}, fmt.Sprintf("Question %d?", i)),
					MaxTokens: 24, IgnoreEOS: true, Timeout: 90 * time.Second})
			}
		}()
	}
	feed := make(chan struct{})
	go func() {
		defer close(feed)
		for i := range n {
			next <- i
		}
		close(next)
	}()
	// Kill the engine of node 1 once both engines are busy.
	victim := eps.Nodes[1].Engine
	deadline := time.Now().Add(60 * time.Second)
	for {
		h, _ := httpGet(e.api + "/health")
		if strings.Count(h, `"in_flight":0`) == 0 && strings.Contains(h, `"in_flight"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engines never both busy: %s", h)
		}
		time.Sleep(20 * time.Millisecond)
	}
	killed := time.Now()
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); <-feed; close(done) }()
	select {
	case <-done:
	case <-time.After(120 * time.Second):
		t.Fatal("requests hang after the engine was killed")
	}
	ok, streamedThenLost := 0, 0
	var slowest time.Duration
	for i, err := range errs {
		slowest = max(slowest, results[i].E2E)
		if err == nil {
			ok++
			continue
		}
		var ae *apiclient.Error
		if errors.As(err, &ae) && ae.Kind == apiclient.KindStream && results[i].HasTTFT {
			streamedThenLost++ // it had begun streaming from the killed engine: not retryable
			continue
		}
		t.Errorf("request %d failed before streaming (should have been retried): %v", i, err)
	}
	m, err := httpGet(e.api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	victimName := strings.TrimPrefix(victim.API, "http://")
	failovers := grepLines(m, "cb_gateway_failovers_total{engine=\""+victimName+"\"")
	if failovers == "" {
		t.Errorf("no failover from the killed engine counted:\n%s", grepLines(m, "cb_gateway_"))
	}
	t.Logf("engine %s killed under load (%d streamed requests at concurrency %d): %d succeeded (retried elsewhere when not yet streaming), %d lost mid-stream with an error event, slowest request %v; failovers:\n%s",
		victimName, n, conc, ok, streamedThenLost, slowest.Round(time.Millisecond), failovers)
	if ok < n/2 {
		t.Errorf("only %d of %d requests succeeded", ok, n)
	}
	// cb up restarts the engine; the gateway routes to it again once its health check passes.
	deadline = time.Now().Add(60 * time.Second)
	for {
		h, _ := httpGet(e.api + "/health")
		if strings.Count(h, `"up":true`) == 2 {
			t.Logf("both engines up again %v after the kill", time.Since(killed).Round(100*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed engine is not back behind the gateway: %s", h)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.ChatStream(context.Background(), apiclient.ChatRequest{Model: "cb-llama", Content: "after the restart", MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
}
