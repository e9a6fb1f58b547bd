package slo_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/metrics"
)

// This file builds the /metrics of the three processes the way they are built in production
// (a registry with the Go and process collectors, the contract's process instruments and the
// role's facade, served by metrics.Handler) and records realistic traffic into them: one
// identical batch per scrape, so that every rate ratio over any window equals the batch's.

// repoPath returns a path relative to the repository root (the package directory's parent).
func repoPath(t testing.TB, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// needTool returns the path of a Prometheus binary or fails the test: the tests never skip.
func needTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed (%v): run `make deps` (it installs the Debian package prometheus, which brings prometheus and promtool)", name, err)
	}
	return p
}

// A request of the engine's recorded batch.
type engineReq struct {
	op, model, route string
	ttft, e2e        time.Duration
	hasTTFT          bool
	out              int
	errType          string
	status           int
}

// engineBatch is the engine traffic recorded before every scrape: successes across two
// operations and two models with TTFTs on both sides of the 0.5 s SLO bound, a few failures
// (queue_full as 429, timeout as 504, internal as 500), and non-inference routes.
func engineBatch() []engineReq {
	ttfts := []time.Duration{30, 45, 80, 120, 160, 200, 240, 300, 350, 420, 480, 500, 650, 900, 1400, 3000}
	tpots := []time.Duration{12, 20, 30, 45, 55, 60, 70, 90}
	var reqs []engineReq
	for i, ms := range ttfts {
		op, route := "chat", "/v1/chat/completions"
		if i%3 == 2 {
			op, route = "text_completion", "/v1/completions"
		}
		model := "cb-tiny"
		if i%4 == 3 {
			model = "cb-small"
		}
		ttft := ms * time.Millisecond
		out := 2 + i%14
		tpot := tpots[i%len(tpots)] * time.Millisecond
		reqs = append(reqs, engineReq{op: op, model: model, route: route, ttft: ttft, hasTTFT: true,
			e2e: ttft + time.Duration(out-1)*tpot, out: out, status: 200})
	}
	reqs = append(reqs,
		engineReq{op: "chat", model: "cb-tiny", route: "/v1/chat/completions", e2e: 2 * time.Millisecond, errType: "queue_full", status: 429},
		engineReq{op: "chat", model: "cb-tiny", route: "/v1/chat/completions", e2e: 30 * time.Second, ttft: 400 * time.Millisecond, hasTTFT: true, out: 200, errType: "timeout", status: 504},
		engineReq{op: "text_completion", model: "cb-small", route: "/v1/completions", e2e: 50 * time.Millisecond, errType: "internal", status: 500},
	)
	return reqs
}

// expectedTTFTErrorRatio is the TTFT SLO's error ratio of one engine batch: successful
// requests slower than the 0.5 s bound over all successful requests with a first token.
// qualityChecks is the online quality checks a worker batch records, one
// of them above the quality objective's threshold.
const qualityChecks = 20

func expectedTTFTErrorRatio() float64 {
	var bad, all float64
	for _, r := range engineBatch() {
		if r.errType != "" || !r.hasTTFT {
			continue
		}
		all++
		if r.ttft > 500*time.Millisecond {
			bad++
		}
	}
	return bad / all
}

// expectedAvailabilityErrorRatio is the availability SLO's error ratio of one batch: 5xx
// responses on /v1/ routes over all responses on /v1/ routes (health checks excluded):
// 2 of 24.
func expectedAvailabilityErrorRatio() float64 {
	var bad, all float64
	for _, h := range httpBatch() {
		if !strings.HasPrefix(h.route, "/v1/") {
			continue
		}
		all++
		if h.status >= 500 {
			bad++
		}
	}
	return bad / all
}

// An HTTP request of the engine's recorded batch.
type httpReq struct {
	method, route string
	status        int
	seconds       float64
}

// httpBatch is the HTTP traffic of one engine batch: one POST per generation of engineBatch,
// plus model listings (inference routes, always 200) and health checks (outside the SLO).
func httpBatch() []httpReq {
	var out []httpReq
	for _, r := range engineBatch() {
		out = append(out, httpReq{"POST", r.route, r.status, r.e2e.Seconds()})
	}
	for range 5 {
		out = append(out, httpReq{"GET", "/health", 200, 0.0004}, httpReq{"GET", "/v1/models", 200, 0.001})
	}
	return append(out, httpReq{"GET", "/health", 503, 0.0004})
}

// traceIDOf is the deterministic trace id of request i of batch b (a sampled span context in
// the request's context turns into an exemplar).
func traceIDOf(b, i int) trace.TraceID {
	var id trace.TraceID
	binary.BigEndian.PutUint64(id[:8], 0xcb00_0000_0000_0000|uint64(b))
	binary.BigEndian.PutUint64(id[8:], uint64(i)+1)
	return id
}

func sampledCtx(b, i int) context.Context {
	var sid trace.SpanID
	binary.BigEndian.PutUint64(sid[:], uint64(b)<<32|uint64(i)+1)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceIDOf(b, i), SpanID: sid, TraceFlags: trace.FlagsSampled})
	return trace.ContextWithSpanContext(context.Background(), sc)
}

// process is one cacheblend process's /metrics with recorded data.
type process struct {
	job     string // scrape job of deploy/prometheus/prometheus.yml
	service string // cb_build_info service
	reg     *prometheus.Registry
	handler http.Handler

	mu      sync.Mutex
	batches int
	record  func(batch int)
	traces  []string // trace ids recorded with exemplars (hex)

	errMu sync.Mutex
	errs  []error // records the facades refused (their OnRefused handler)
}

// Batches returns how many batches were recorded (one per scrape).
func (p *process) Batches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.batches
}

// Err returns the first record a facade refused, if any.
func (p *process) Err() error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	if len(p.errs) > 0 {
		return p.errs[0]
	}
	return nil
}

// refused is the facades' OnRefused handler.
func (p *process) refused(err error) {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	p.errs = append(p.errs, fmt.Errorf("%s batch %d: %w", p.service, p.batches, err)) // under p.mu: records run in the before hook
}

// opt reports the facade's refusals to p.
func (p *process) opt() metrics.Option { return metrics.WithOnRefused(p.refused) }

// TraceIDs returns the trace ids recorded as exemplars so far.
func (p *process) TraceIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.traces)
}

// newProcess builds the registry of a process: Go and process collectors, the contract's
// process instruments (with running trace-exporter totals that grow with every batch) and the
// role facade built by role (with p.opt()), which returns the batch recorder.
func newProcess(t testing.TB, job, service string, role func(reg prometheus.Registerer, p *process) (func(batch int), error)) *process {
	t.Helper()
	p := &process{job: job, service: service, reg: prometheus.NewRegistry()}
	p.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pm, err := metrics.NewProcessMetrics(p.reg, metrics.BuildInfo{Service: service, Version: "v0.0.0-test"}, func() metrics.TraceTotals {
		n := uint64(p.batches) // read under p.mu (Refresh runs inside the before hook)
		return metrics.TraceTotals{SpansDropped: 3 * n, ExportErrors: n / 2}
	}, p.opt())
	if err != nil {
		t.Fatalf("%s: process metrics: %v", service, err)
	}
	rec, err := role(p.reg, p)
	if err != nil {
		t.Fatalf("%s: facade: %v", service, err)
	}
	p.record = rec
	p.handler = metrics.Handler(p.reg, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.batches++
		p.record(p.batches)
		pm.Refresh()
	})
	return p
}

func newEngine(t testing.TB) *process {
	return newProcess(t, "cb-engine", "cb-engine", func(reg prometheus.Registerer, p *process) (func(int), error) {
		m, err := metrics.NewEngineMetrics(reg, p.opt())
		if err != nil {
			return nil, err
		}
		return func(b int) {
			for i, r := range engineBatch() {
				ctx := context.Background()
				if r.errType == "" {
					ctx = sampledCtx(b, i)
					p.traces = append(p.traces, traceIDOf(b, i).String())
				}
				m.RecordRequest(ctx, metrics.RequestRecord{
					Operation: r.op, Model: r.model, TTFT: r.ttft, HasTTFT: r.hasTTFT, E2E: r.e2e,
					PromptTokens: 1200 + 37*i, OutputTokens: r.out, ErrorType: r.errType,
				})
			}
			for _, h := range httpBatch() {
				m.RecordHTTP(h.method, h.route, h.status, h.seconds)
			}
			m.SetEngine(metrics.EngineStats{
				Waiting: 3, Running: 8, KVFree: 400, KVUsed: 500, KVCached: 124, KVTotal: 1024,
				Evictions: uint64(7 * b), Preemptions: uint64(b), BatchTokens: 2048, PrefixHitRatio: 0.42,
			})
			m.LookupFallback("timeout")
		}, nil
	})
}

func newWorker(t testing.TB) *process {
	return newProcess(t, "cb-worker", "cb-worker", func(reg prometheus.Registerer, p *process) (func(int), error) {
		m, err := metrics.NewWorkerMetrics(reg, p.opt())
		if err != nil {
			return nil, err
		}
		phases := map[metrics.ForwardPhase][]time.Duration{
			metrics.PhasePrefill:    {180 * time.Millisecond, 420 * time.Millisecond, 900 * time.Millisecond},
			metrics.PhaseFullRecomp: {40 * time.Millisecond, 60 * time.Millisecond},
			metrics.PhaseCheck:      {8 * time.Millisecond, 12 * time.Millisecond},
			metrics.PhasePartial:    {90 * time.Millisecond, 140 * time.Millisecond},
			metrics.PhaseDecode:     {18 * time.Millisecond, 22 * time.Millisecond, 25 * time.Millisecond, 31 * time.Millisecond},
		}
		return func(b int) {
			i := 0
			for _, phase := range []metrics.ForwardPhase{metrics.PhasePrefill, metrics.PhaseFullRecomp, metrics.PhaseCheck, metrics.PhasePartial, metrics.PhaseDecode} {
				for _, d := range phases[phase] {
					m.ObserveForward(sampledCtx(b, 100+i), phase, d)
					p.traces = append(p.traces, traceIDOf(b, 100+i).String())
					i++
				}
			}
			for _, imp := range []int{150, 160, 180, 240} {
				m.ObserveRecomputeRatio(imp, 1000)
			}
			// Online quality checks: 1 of 20 above the quality objective's 0.01 nats (a 1x burn).
			for i := range qualityChecks {
				kl := 0.002
				if i == 0 {
					kl = 0.05
				}
				m.QualityCheck(metrics.QualityDone)
				m.ObserveQuality(kl, 3, 4)
			}
			for range 40 {
				m.Step()
			}
			m.BlendFailure(metrics.BlendOpRetrieve)
			m.AddKVTransfer(metrics.KVLoad, 40<<20, 2560)
			m.AddKVTransfer(metrics.KVStore, 12<<20, 768)
		}, nil
	})
}

func newBlend(t testing.TB) *process {
	return newProcess(t, "cb-blend", "cb-blend", func(reg prometheus.Registerer, p *process) (func(int), error) {
		m, err := metrics.NewBlendMetrics(reg, p.opt())
		if err != nil {
			return nil, err
		}
		return func(b int) {
			for i := range 12 {
				ctx := sampledCtx(b, 200+i)
				p.traces = append(p.traces, traceIDOf(b, 200+i).String())
				m.RecordLookup(ctx, metrics.LookupRecord{
					Duration:        time.Duration(300+100*i) * time.Microsecond,
					PrefixHitTokens: 256 * (i % 3), NonPrefixHitTokens: 300 + 50*i, RequestedTokens: 1500,
					FingerprintHits: 2 + i%4, StorageHits: 2 + i%3, StaleChunks: i % 5 / 4,
				})
				m.ObserveFingerprintMatch(ctx, time.Duration(120+30*i)*time.Microsecond)
				m.ObserveSparsePrefetch(ctx, time.Duration(200+80*i)*time.Microsecond)
				m.RecordRetrieve(ctx, time.Duration(900+200*i)*time.Microsecond, i == 11)
				m.RecordScatter(ctx, time.Duration(500+100*i)*time.Microsecond, 700)
			}
			for i := range 4 {
				m.RecordL2Load(int64(8+4*i)<<20, time.Duration(3+2*i)*time.Millisecond)
			}
			m.RecordStore(6)
			m.AddChunksEvicted(metrics.TierL1, 3)
			m.AddChunksEvicted(metrics.TierL2, 1)
			m.AddFingerprintsUnregistered(2)
			m.AddL2CorruptChunks(0)
			m.SetEventBusTotals(uint64(500*b), uint64(2*b))
			m.SetStorage(metrics.StorageStats{L1Bytes: 3 << 30, L1Chunks: 96, Fingerprints: 4000})
		}, nil
	})
}

// stack returns the three processes of the deploy configuration.
func stack(t testing.TB) []*process {
	return []*process{newEngine(t), newWorker(t), newBlend(t)}
}
