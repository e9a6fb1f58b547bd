package scheduler

import (
	"context"
	"errors"
	"fmt"
	grpccodes "google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/engine/internal/enginetest"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type harness struct {
	s      *Scheduler
	worker *enginetest.Worker
	blend  *enginetest.Blend
	rec    *tracetest.SpanRecorder
	fbMu   sync.Mutex
	fbs    []string
}

type opts struct {
	cfg       Config
	worker    *enginetest.Worker
	blend     *enginetest.Blend
	deadBlend bool
	// checkLayer is the check layer the worker reports in Info; nil: the
	// default a real worker reports (defaults.CheckLayer).
	checkLayer *int32
}

// checkLayerWorker is a worker client whose Info reports checkLayer (the
// worker double reports none).
type checkLayerWorker struct {
	cbv1.WorkerServiceClient
	checkLayer int32
}

func (w checkLayerWorker) Info(ctx context.Context, in *cbv1.InfoRequest, o ...grpc.CallOption) (*cbv1.InfoResponse, error) {
	info, err := w.WorkerServiceClient.Info(ctx, in, o...)
	if err != nil {
		return nil, err
	}
	info = proto.CloneOf(info)
	info.CheckLayer = w.checkLayer
	return info, nil
}

func newHarness(t *testing.T, o opts) *harness {
	t.Helper()
	if o.worker == nil {
		o.worker = enginetest.NewWorker(256, 16, 4096)
	}
	h := &harness{worker: o.worker, blend: o.blend, rec: tracetest.NewSpanRecorder()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h.rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cl := int32(defaults.CheckLayer)
	if o.checkLayer != nil {
		cl = *o.checkLayer
	}
	deps := Deps{
		Worker: checkLayerWorker{enginetest.WorkerClient(t, o.worker), cl},
		Spans:  telemetry.NewSpans(tp, "test", nil),
		OnFallback: func(r string) {
			h.fbMu.Lock()
			h.fbs = append(h.fbs, r)
			h.fbMu.Unlock()
		},
	}
	switch {
	case o.deadBlend:
		deps.Blend = enginetest.DeadBlendClient(t)
	case o.blend != nil:
		deps.Blend = enginetest.BlendClient(t, o.blend)
	}
	s, err := New(o.cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	h.s = s
	waitFor(t, "worker ready", func() bool { _, ok := s.WorkerInfo(); return ok })
	return h
}

func (h *harness) fallbacks() []string {
	h.fbMu.Lock()
	defer h.fbMu.Unlock()
	return slices.Clone(h.fbs)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func prompt(n int, seed int32) []int32 {
	p := make([]int32, n)
	p[0] = 256 // BOS
	for i := 1; i < n; i++ {
		p[i] = (seed*7 + int32(i)*13) % 251
	}
	return p
}

func run(t *testing.T, s *Scheduler, r *Request) Result {
	t.Helper()
	h, err := s.Submit(r)
	if err != nil {
		t.Fatalf("submit %s: %v", r.ID, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := h.Wait(ctx)
	if err != nil {
		t.Fatalf("wait %s: %v", r.ID, err)
	}
	return res
}

func checkKV(t *testing.T, s *Scheduler) Stats {
	t.Helper()
	st := s.Stats()
	if st.KVFree+st.KVUsed+st.KVCached != st.KVTotal {
		t.Fatalf("kv blocks free %d + used %d + cached %d != %d", st.KVFree, st.KVUsed, st.KVCached, st.KVTotal)
	}
	return st
}

func TestGenerateMatchesReference(t *testing.T) {
	h := newHarness(t, opts{})
	p := prompt(40, 1)
	res := run(t, h.s, &Request{ID: "r1", Prompt: p, MaxTokens: 20})
	if res.Err != nil || res.FinishReason != FinishLength {
		t.Fatalf("result %+v", res)
	}
	if want := enginetest.Reference(p, 20); !slices.Equal(res.Tokens, want) {
		t.Fatalf("tokens %v, want %v", res.Tokens, want)
	}
	if len(res.TokenTimes) != 20 || res.Admitted.IsZero() || res.Finished.Before(res.TokenTimes[19]) {
		t.Fatalf("timing %+v", res)
	}
	steps := h.worker.SeqSteps("r1")
	if len(steps) != 20 { // one prefill step, 19 decode steps
		t.Fatalf("%d steps, want 20", len(steps))
	}
	if !steps[0].GetIsPrefill() || len(steps[0].GetPromptTokens()) != 40 || steps[1].GetIsPrefill() ||
		len(steps[1].GetPromptTokens()) != 0 || len(steps[1].GetTokens()) != 1 || steps[1].GetStartPos() != 40 {
		t.Fatalf("steps %v / %v", steps[0], steps[1])
	}
	waitFor(t, "finished id sent", func() bool {
		for _, st := range h.worker.Steps() {
			if slices.Contains(st.GetFinishedRequestIds(), "r1") {
				return true
			}
		}
		return false
	})
	if st := checkKV(t, h.s); st.KVUsed != 0 {
		t.Fatalf("blocks still used after the end: %+v", st)
	}
}

func TestStopConditions(t *testing.T) {
	w := enginetest.NewWorker(64, 16, 4096)
	w.EOSAtLen = 15 // the token sampled for sequence length 15 is EOS
	h := newHarness(t, opts{worker: w})
	p := prompt(10, 3)
	for _, tc := range []struct {
		name      string
		req       Request
		wantN     int
		wantFinal string
	}{
		{"eos", Request{MaxTokens: 50}, 5, FinishStop},
		{"ignore eos", Request{MaxTokens: 8, IgnoreEOS: true}, 8, FinishLength},
		{"max tokens", Request{MaxTokens: 3}, 3, FinishLength},
		{"on token", Request{MaxTokens: 50, OnToken: func() func(int32) bool {
			n := 0
			return func(int32) bool { n++; return n == 2 }
		}()}, 2, FinishStop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.req
			r.ID, r.Prompt = tc.name, p
			res := run(t, h.s, &r)
			if res.Err != nil || res.FinishReason != tc.wantFinal || len(res.Tokens) != tc.wantN {
				t.Fatalf("result: %d tokens %q %v, want %d %q", len(res.Tokens), res.FinishReason, res.Err, tc.wantN, tc.wantFinal)
			}
		})
	}
}

func TestChunkedPrefill(t *testing.T) {
	h := newHarness(t, opts{cfg: Config{StepTokenBudget: 512}, worker: enginetest.NewWorker(256, 16, 4096)})
	p := prompt(1200, 2)
	res := run(t, h.s, &Request{ID: "long", Prompt: p, MaxTokens: 3})
	if want := enginetest.Reference(p, 3); !slices.Equal(res.Tokens, want) {
		t.Fatalf("tokens %v, want %v", res.Tokens, want)
	}
	steps := h.worker.SeqSteps("long")
	type shape struct {
		start, n       int
		prompt, sample bool
		blocks         int
	}
	var got []shape
	for _, s := range steps[:3] {
		got = append(got, shape{int(s.GetStartPos()), len(s.GetTokens()), len(s.GetPromptTokens()) > 0, s.GetSample(), len(s.GetBlockTable())})
	}
	want := []shape{{0, 512, true, false, 32}, {512, 512, false, false, 64}, {1024, 176, false, true, 75}}
	if !slices.Equal(got, want) {
		t.Fatalf("prefill chunks %+v, want %+v", got, want)
	}
	// Another request sharing the budget: its steps never exceed it together.
	for _, st := range h.worker.Steps() {
		n := 0
		for _, s := range st.GetSeqs() {
			n += len(s.GetTokens())
		}
		if n > 512 {
			t.Fatalf("step %d computes %d tokens > budget", st.GetStepId(), n)
		}
	}
}

func TestChunkedPrefillSharesBudgetWithDecode(t *testing.T) {
	h := newHarness(t, opts{cfg: Config{StepTokenBudget: 64}})
	short := prompt(8, 5)
	hs, err := h.s.Submit(&Request{ID: "short", Prompt: short, MaxTokens: 30})
	if err != nil {
		t.Fatal(err)
	}
	long := prompt(300, 6)
	res := run(t, h.s, &Request{ID: "long", Prompt: long, MaxTokens: 2})
	rs, _ := hs.Wait(context.Background())
	if !slices.Equal(rs.Tokens, enginetest.Reference(short, 30)) || !slices.Equal(res.Tokens, enginetest.Reference(long, 2)) {
		t.Fatal("tokens differ from the reference")
	}
	mixed := false
	for _, st := range h.worker.Steps() {
		n, prefill, decode := 0, false, false
		for _, s := range st.GetSeqs() {
			n += len(s.GetTokens())
			prefill = prefill || s.GetIsPrefill()
			decode = decode || !s.GetIsPrefill()
		}
		if n > 64 {
			t.Fatalf("step over budget: %d", n)
		}
		mixed = mixed || (prefill && decode)
	}
	if !mixed {
		t.Fatal("no step mixed a prefill chunk with a decode")
	}
}

func TestPreemptionResumeSameTokens(t *testing.T) {
	// 12 blocks of 4 tokens: four requests of 10 prompt + 20 output tokens
	// (8 blocks each at the end) cannot all run.
	w := enginetest.NewWorker(12, 4, 4096)
	h := newHarness(t, opts{worker: w, cfg: Config{StepTokenBudget: 64}})
	var hs []*Handle
	var prompts [][]int32
	for i := range 4 {
		p := prompt(10, int32(10+i))
		prompts = append(prompts, p)
		hd, err := h.s.Submit(&Request{ID: fmt.Sprintf("p%d", i), Prompt: p, MaxTokens: 20})
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, hd)
	}
	preempted := 0
	for i, hd := range hs {
		res, err := hd.Wait(context.Background())
		if err != nil || res.Err != nil {
			t.Fatalf("p%d: %v %v", i, err, res.Err)
		}
		if want := enginetest.Reference(prompts[i], 20); !slices.Equal(res.Tokens, want) {
			t.Fatalf("p%d tokens %v, want %v (preempted %d times)", i, res.Tokens, want, res.Preemptions)
		}
		preempted += res.Preemptions
	}
	st := checkKV(t, h.s)
	if preempted == 0 || st.Preemptions == 0 {
		t.Fatalf("no preemption happened (stats %+v)", st)
	}
	if uint64(preempted) != st.Preemptions {
		t.Fatalf("handles count %d preemptions, stats %d", preempted, st.Preemptions)
	}
	if st.KVUsed != 0 {
		t.Fatalf("blocks leaked: %+v", st)
	}
	// A resumed request's first step re-sends the whole sequence as its prompt.
	resumed := false
	for i := range 4 {
		steps := w.SeqSteps(fmt.Sprintf("p%d", i))
		for _, s := range steps[1:] {
			if n := len(s.GetPromptTokens()); n > 10 {
				resumed = true
			}
		}
	}
	if !resumed {
		t.Fatal("no resumed first step carries prompt plus generated tokens")
	}
}

func TestPrefixCacheReuse(t *testing.T) {
	h := newHarness(t, opts{worker: enginetest.NewWorker(64, 16, 4096)})
	base := prompt(64, 9)
	run(t, h.s, &Request{ID: "a", Prompt: base, MaxTokens: 2})
	b := slices.Concat(base[:48], prompt(20, 4)[1:])
	res := run(t, h.s, &Request{ID: "b", Prompt: b, MaxTokens: 4})
	if want := enginetest.Reference(b, 4); !slices.Equal(res.Tokens, want) {
		t.Fatalf("tokens %v, want %v", res.Tokens, want)
	}
	if res.CachedTokens != 48 {
		t.Fatalf("cached tokens %d, want 48", res.CachedTokens)
	}
	first := h.worker.SeqSteps("b")[0]
	if first.GetStartPos() != 48 || len(first.GetTokens()) != len(b)-48 || len(first.GetPromptTokens()) != len(b) {
		t.Fatalf("first step start %d, %d tokens", first.GetStartPos(), len(first.GetTokens()))
	}
	// The same prompt again: everything but the last token comes from cache.
	res = run(t, h.s, &Request{ID: "c", Prompt: base, MaxTokens: 2})
	if res.CachedTokens != 48 || !slices.Equal(res.Tokens, enginetest.Reference(base, 2)) {
		t.Fatalf("repeat: cached %d tokens %v", res.CachedTokens, res.Tokens)
	}
	st := checkKV(t, h.s)
	if st.PrefixHitRatio <= 0 || st.KVCached == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestEvictionsCounted(t *testing.T) {
	h := newHarness(t, opts{worker: enginetest.NewWorker(8, 4, 4096)})
	for i := range 6 {
		p := prompt(17, int32(30+i))
		res := run(t, h.s, &Request{ID: fmt.Sprintf("e%d", i), Prompt: p, MaxTokens: 2})
		if !slices.Equal(res.Tokens, enginetest.Reference(p, 2)) {
			t.Fatalf("e%d tokens differ", i)
		}
	}
	if st := checkKV(t, h.s); st.Evictions == 0 {
		t.Fatalf("no eviction counted: %+v", st)
	}
}

// prefixResult makes the blend double report the first n tokens as a
// prefix hit and [from, to) as a non-prefix match.
func prefixResult(n, from, to int) func([]int32) *cbv1.LookupResult {
	return func(tokens []int32) *cbv1.LookupResult {
		r := &cbv1.LookupResult{RequestedTokens: int32(len(tokens)), ChunkSize: 256}
		if n > 0 {
			r.PrefixHitTokens = int32(n)
			r.Matches = append(r.Matches, &cbv1.Match{StoredSt: 0, StoredEd: int32(n), CurSt: 0, CurEd: int32(n), Prefix: true,
				ChunkKeys: [][]byte{testKey(0)}})
		}
		if to > from {
			r.NonPrefixHitTokens = int32(to - from)
			r.Matches = append(r.Matches, &cbv1.Match{StoredSt: 0, StoredEd: int32(to - from), CurSt: int32(from), CurEd: int32(to),
				ChunkKeys: [][]byte{testKey(1)}})
		}
		r.HitRate = float64(n+to-from) / float64(len(tokens))
		r.PrefixCoverageTokens = int32(n)
		r.FingerprintHits, r.StorageHits, r.StaleChunks = 1, 2, 0
		return r
	}
}

// testKey is a chunk key of the right size.
func testKey(i byte) []byte {
	k := make([]byte, 32)
	k[0] = i
	return k
}

func TestLookupDeferralAndPlan(t *testing.T) {
	blend := &enginetest.Blend{Result: prefixResult(100, 200, 300)}
	h := newHarness(t, opts{blend: blend})
	p := prompt(400, 11)
	res := run(t, h.s, &Request{ID: "cb1", Prompt: p, MaxTokens: 3})
	if res.Err != nil || res.Fallback != "" || res.Lookup == nil {
		t.Fatalf("result %+v", res)
	}
	if !slices.Equal(res.Tokens, enginetest.Reference(p, 3)) {
		t.Fatal("tokens differ from the reference")
	}
	if n := blend.LookupsFor("cb1"); n != 1 {
		t.Fatalf("%d lookups, want 1", n)
	}
	first := h.worker.SeqSteps("cb1")[0]
	plan := first.GetCbPlan()
	if first.GetStartPos() != 100 || plan == nil || plan.GetPrefixHitTokens() != 100 || len(plan.GetMatches()) != 2 ||
		plan.GetRecompRatio() != DefaultRecompRatio {
		t.Fatalf("first step start %d plan %v", first.GetStartPos(), plan)
	}
	if res.ReusedTokens != 200 {
		t.Fatalf("reused %d, want 200", res.ReusedTokens)
	}
	// The lookup carried the prompt and the cb.lookup.rpc context.
	sub := blend.Lookups()[0]
	if !slices.Equal(sub.GetTokens(), p) || sub.GetWorldSize() != 1 || sub.GetModel() != DefaultModel {
		t.Fatalf("submit %v", sub)
	}
	spans := h.rec.Ended()
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
	}
	req, sched, rpc, meta := byName[spanname.CBRequest], byName[spanname.CBSchedule], byName[spanname.CBLookupRPC], byName[spanname.CBBuildMeta]
	if req == nil || sched == nil || rpc == nil || meta == nil {
		t.Fatalf("spans %v", names(spans))
	}
	if sched.Parent().SpanID() != req.SpanContext().SpanID() || rpc.Parent().SpanID() != sched.SpanContext().SpanID() ||
		meta.Parent().SpanID() != sched.SpanContext().SpanID() {
		t.Fatal("cb.request ⊃ cb.schedule ⊃ {cb.lookup.rpc, cb.build_meta} violated")
	}
	if got := telemetry.FormatTraceparent(rpc.SpanContext()); sub.GetTraceContext() != got {
		t.Fatalf("lookup trace_context %q, want cb.lookup.rpc's %q", sub.GetTraceContext(), got)
	}
	if got := telemetry.FormatTraceparent(req.SpanContext()); first.GetTraceContext() != got {
		t.Fatalf("step trace_context %q, want cb.request's %q", first.GetTraceContext(), got)
	}
	attrs := attrMap(req.Attributes())
	for k, want := range map[string]any{"request_id": "cb1", "model": DefaultModel, "world_size": int64(1),
		"n_prompt_tokens": int64(400), "prefix_hit_tokens": int64(100), "non_prefix_hit_tokens": int64(100),
		"requested_tokens": int64(400), "hit_rate": 0.5, "lookup": LookupDone, "hit_tokens": int64(200),
		"prefix_coverage_tokens": int64(100), "n_non_prefix_tokens": int64(300), "fingerprint_hits": int64(1),
		"storage_hits": int64(2), "stale_chunks": int64(0)} {
		if attrs[k] != want {
			t.Errorf("cb.request %s = %v, want %v", k, attrs[k], want)
		}
	}
	if attrMap(rpc.Attributes())["n_polls"] != int64(0) { // nothing else ran while it waited
		t.Errorf("n_polls = %v", attrMap(rpc.Attributes())["n_polls"])
	}
	// True timestamps: every span ends at or after its start, and the
	// children lie inside their parents.
	for _, p := range [][2]sdktrace.ReadOnlySpan{{req, sched}, {sched, rpc}, {sched, meta}} {
		parent, child := p[0], p[1]
		if child.EndTime().Before(child.StartTime()) || child.StartTime().Before(parent.StartTime()) || parent.EndTime().Before(child.EndTime()) {
			t.Errorf("%s [%v, %v] not inside %s [%v, %v]", child.Name(), child.StartTime(), child.EndTime(),
				parent.Name(), parent.StartTime(), parent.EndTime())
		}
	}
	for _, s := range []sdktrace.ReadOnlySpan{sched, rpc, meta} {
		if attrMap(s.Attributes())["request_id"] != "cb1" {
			t.Errorf("%s lacks request_id", s.Name())
		}
	}
}

// TestReusedPromptChargedItsCompute: a prompt the CacheBlend plan mostly
// reuses is charged only its compute share of the step budget, and alone in
// its step it is not split, so it is prefilled in one step where the same
// prompt computed in full takes one per budget; its tokens are the
// reference's all the same.
func TestReusedPromptChargedItsCompute(t *testing.T) {
	tests := []struct {
		name      string
		noReuse   bool
		lone      int // Config.LoneBlendTokens
		wantSteps int // prefill steps
	}{
		{name: "reused, alone: one step", wantSteps: 1},
		{name: "reused, no lone exception: charged its compute (~667 of 512)", lone: -1, wantSteps: 2},
		{name: "reused, lone exception of 1,000 tokens, then the budget", lone: 1000, wantSteps: 2},
		{name: "full prefill: chunks of the budget", noReuse: true, wantSteps: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := enginetest.NewWorker(1024, 16, 4096)
			w.NumLayers = 12
			blend := &enginetest.Blend{Result: reusedMiddle}
			h := newHarness(t, opts{worker: w, blend: blend, cfg: Config{StepTokenBudget: 512, LoneBlendTokens: tc.lone}})
			p := prompt(1800, 3)
			res := run(t, h.s, &Request{ID: "r", Prompt: p, MaxTokens: 2, NoReuse: tc.noReuse})
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			if !slices.Equal(res.Tokens, enginetest.Reference(p, 2)) {
				t.Fatal("tokens differ from the reference")
			}
			if want := map[bool]int{false: 1600, true: 0}[tc.noReuse]; res.ReusedTokens != want {
				t.Fatalf("reused %d tokens, want %d", res.ReusedTokens, want)
			}
			prefill := 0
			for _, st := range w.SeqSteps("r") {
				if st.GetIsPrefill() {
					prefill++
				}
			}
			if prefill != tc.wantSteps {
				t.Fatalf("%d prefill steps, want %d", prefill, tc.wantSteps)
			}
		})
	}
}

func TestBlendChunk(t *testing.T) {
	reused := []reuseplan.Range{{Start: 100, End: 200}, {Start: 300, End: 400}}
	tests := []struct {
		name              string
		from, limit, budg int
		w                 float64
		wantN, wantCost   int
	}{
		{name: "no reused range reached", from: 0, limit: 50, budg: 512, w: 0.25, wantN: 50, wantCost: 50},
		{name: "budget ends before the reused range", from: 0, limit: 500, budg: 80, w: 0.25, wantN: 80, wantCost: 80},
		{name: "reused tokens cost w", from: 0, limit: 500, budg: 512, w: 0.25, wantN: 500, wantCost: 350},
		{name: "budget ends inside a reused range", from: 0, limit: 500, budg: 110, w: 0.25, wantN: 140, wantCost: 110},
		{name: "starting inside a reused range", from: 150, limit: 100, budg: 512, w: 0.5, wantN: 100, wantCost: 75},
		{name: "w of 1 is a plain chunk", from: 0, limit: 500, budg: 256, w: 1, wantN: 256, wantCost: 256},
		{name: "the first token always fits", from: 100, limit: 10, budg: 1, w: 0.25, wantN: 4, wantCost: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, cost := blendChunk(reused, tc.from, tc.limit, tc.budg, tc.w)
			if n != tc.wantN || cost != tc.wantCost {
				t.Fatalf("blendChunk = %d tokens, cost %d; want %d, %d", n, cost, tc.wantN, tc.wantCost)
			}
		})
	}
}

func TestBlendTokenCost(t *testing.T) {
	tests := []struct {
		name       string
		layers, cl int
		ratio      float64
		want       float64
	}{
		{name: "12 layers, check layer 1, ratio 0.15", layers: 12, cl: 1, ratio: 0.15, want: 3.5 / 12},
		{name: "12 layers, check layer 3, ratio 0.15", layers: 12, cl: 3, ratio: 0.15, want: 5.2 / 12},
		{name: "no check layer reported", layers: 12, cl: 0, ratio: 0.15, want: 1},
		{name: "too shallow", layers: 2, cl: 1, ratio: 0.15, want: 1},
		{name: "check layer at the top", layers: 4, cl: 3, ratio: 0.15, want: 1},
		{name: "unknown depth", layers: 0, cl: 1, ratio: 0.15, want: 1},
		{name: "ratio 1 recomputes all", layers: 12, cl: 1, ratio: 1, want: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := blendTokenCost(tc.layers, tc.cl, tc.ratio); math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("blendTokenCost(%d, %d, %v) = %v, want %v", tc.layers, tc.cl, tc.ratio, got, tc.want)
			}
		})
	}
}

// TestReportedCheckLayerSetsTheCost: the cost of a reused token follows the
// check layer the worker reports. With 12 layers, 1,600 reused tokens of an
// 1,800-token prompt and no lone exception, check layer 1 charges ~667 of the
// 512 budget (2 prefill steps) and check layer 3 ~793 (2 steps, the first
// one shorter: 1,050 tokens, not 1,512); check layer 0 (none reported)
// charges every token in full (4 steps).
func TestReportedCheckLayerSetsTheCost(t *testing.T) {
	tests := []struct {
		name       string
		checkLayer int32
		wantSteps  int
		wantFirstN int // tokens of the first prefill step
	}{
		{name: "check layer 1", checkLayer: 1, wantSteps: 2, wantFirstN: 1512},
		{name: "check layer 3", checkLayer: 3, wantSteps: 2, wantFirstN: 1050},
		{name: "no check layer", checkLayer: 0, wantSteps: 4, wantFirstN: 512},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := enginetest.NewWorker(1024, 16, 4096)
			w.NumLayers = 12
			h := newHarness(t, opts{worker: w, blend: &enginetest.Blend{Result: reusedMiddle}, checkLayer: &tc.checkLayer,
				cfg: Config{StepTokenBudget: 512, LoneBlendTokens: -1}})
			if info, _ := h.s.WorkerInfo(); info.GetCheckLayer() != tc.checkLayer {
				t.Fatalf("worker reports check layer %d, want %d", info.GetCheckLayer(), tc.checkLayer)
			}
			p := prompt(1800, 3)
			res := run(t, h.s, &Request{ID: "r", Prompt: p, MaxTokens: 2})
			if res.Err != nil || !slices.Equal(res.Tokens, enginetest.Reference(p, 2)) {
				t.Fatalf("result %+v", res)
			}
			var prefill []int
			for _, st := range w.SeqSteps("r") {
				if st.GetIsPrefill() {
					prefill = append(prefill, len(st.GetTokens()))
				}
			}
			if len(prefill) != tc.wantSteps || prefill[0] != tc.wantFirstN {
				t.Fatalf("prefill steps of %v tokens, want %d steps, the first of %d", prefill, tc.wantSteps, tc.wantFirstN)
			}
		})
	}
}

// reusedMiddle is a lookup result reusing 1,600 stored tokens at [100, 1700).
func reusedMiddle(tokens []int32) *cbv1.LookupResult {
	m := &cbv1.Match{StoredSt: 0, StoredEd: 1600, CurSt: 100, CurEd: 1700}
	for i := range 7 { // 1,600 stored tokens in chunks of 256
		m.ChunkKeys = append(m.ChunkKeys, testKey(byte(i)))
	}
	return &cbv1.LookupResult{RequestedTokens: int32(len(tokens)), ChunkSize: 256, NonPrefixHitTokens: 1600,
		Matches: []*cbv1.Match{m}}
}

func TestDeferredRequestDoesNotBlockOthers(t *testing.T) {
	blend := &enginetest.Blend{Hold: []string{"slow"}}
	h := newHarness(t, opts{blend: blend, cfg: Config{LookupTimeout: 30 * time.Second}})
	slowCtx, cancelSlow := context.WithCancel(context.Background())
	defer cancelSlow()
	hs, err := h.s.Submit(&Request{ID: "slow", Prompt: prompt(20, 1), MaxTokens: 2, Ctx: slowCtx})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "slow looked up", func() bool { return blend.LookupsFor("slow") > 0 })
	res := run(t, h.s, &Request{ID: "fast", Prompt: prompt(20, 2), MaxTokens: 2})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if len(h.worker.SeqSteps("slow")) != 0 {
		t.Fatal("slow ran before its lookup was ready")
	}
	select {
	case <-hs.Done():
		t.Fatal("slow finished without its lookup")
	default:
	}
	if st := h.s.Stats(); st.Waiting != 1 {
		t.Fatalf("waiting %d, want the deferred request", st.Waiting)
	}
	cancelSlow()
	if res, _ := hs.Wait(context.Background()); !errors.Is(res.Err, ErrCanceled) {
		t.Fatalf("slow: %v", res.Err)
	}
	// n_polls counts the steps the request waited: every step of "fast".
	var waited any
	for _, s := range h.rec.Ended() {
		if s.Name() == spanname.CBLookupRPC && attrMap(s.Attributes())["request_id"] == "slow" {
			waited = attrMap(s.Attributes())["n_polls"]
		}
	}
	if n, ok := waited.(int64); !ok || n < int64(len(h.worker.SeqSteps("fast"))) {
		t.Fatalf("slow's n_polls = %v, want at least fast's %d steps", waited, len(h.worker.SeqSteps("fast")))
	}
}

func TestLookupFallbacks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		o      opts
		reason string
	}{
		{"blend down", opts{deadBlend: true}, FallbackUnavailable},
		{"timeout", opts{blend: &enginetest.Blend{Hold: []string{"r"}},
			cfg: Config{LookupTimeout: 80 * time.Millisecond}}, FallbackTimeout},
		{"server error", opts{blend: &enginetest.Blend{Err: func(*cbv1.LookupRequest) error {
			return grpcstatus.Error(grpccodes.Internal, "chunk store on fire")
		}}}, FallbackError},
		{"server queue full", opts{blend: &enginetest.Blend{Err: func(*cbv1.LookupRequest) error {
			return grpcstatus.Error(grpccodes.ResourceExhausted, "lookup queue full")
		}}}, FallbackQueueFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.o)
			p := prompt(50, 3)
			res := run(t, h.s, &Request{ID: "r", Prompt: p, MaxTokens: 4})
			if res.Err != nil || res.Fallback != tc.reason || !slices.Equal(res.Tokens, enginetest.Reference(p, 4)) {
				t.Fatalf("result err %v fallback %q", res.Err, res.Fallback)
			}
			if fb := h.fallbacks(); !slices.Equal(fb, []string{tc.reason}) {
				t.Fatalf("fallbacks counted %v", fb)
			}
			if first := h.worker.SeqSteps("r")[0]; first.GetStartPos() != 0 || first.GetCbPlan() != nil {
				t.Fatalf("fallback is not a full prefill: %v", first)
			}
			var rpc, req sdktrace.ReadOnlySpan
			for _, s := range h.rec.Ended() {
				switch s.Name() {
				case spanname.CBLookupRPC:
					rpc = s
				case spanname.CBRequest:
					req = s
				}
			}
			if rpc == nil || rpc.Status().Code != codes.Error || attrMap(rpc.Attributes())["error.type"] != tc.reason {
				t.Fatalf("cb.lookup.rpc should record the error: %+v", rpc)
			}
			if req == nil || req.Status().Code == codes.Error {
				t.Fatalf("cb.request: %+v", req)
			}
			wantNoLookup(t, req, tc.reason, 50)
		})
	}
}

// wantNoLookup checks the cb.request of a request served without a lookup result: the
// outcome in lookup, zero hit statistics, the whole prompt requested and non-prefix.
func wantNoLookup(t *testing.T, req sdktrace.ReadOnlySpan, outcome string, n int64) {
	t.Helper()
	if req == nil {
		t.Fatal("no cb.request")
	}
	attrs := attrMap(req.Attributes())
	for k, want := range map[string]any{"lookup": outcome, "hit_rate": 0.0, "hit_tokens": int64(0), "requested_tokens": n,
		"prefix_hit_tokens": int64(0), "non_prefix_hit_tokens": int64(0), "prefix_coverage_tokens": int64(0),
		"n_non_prefix_tokens": n, "fingerprint_hits": int64(0), "storage_hits": int64(0), "stale_chunks": int64(0)} {
		if attrs[k] != want {
			t.Errorf("cb.request %s = %v, want %v", k, attrs[k], want)
		}
	}
}

// TestLookupOutcomeOfAnAbandonedRequest: a request canceled while its lookup is pending
// still carries the statistics, with lookup=abandoned.
func TestLookupOutcomeOfAnAbandonedRequest(t *testing.T) {
	h := newHarness(t, opts{blend: &enginetest.Blend{Hold: []string{"gone"}}})
	ctx, cancel := context.WithCancel(context.Background())
	hd, err := h.s.Submit(&Request{ID: "gone", Prompt: prompt(30, 2), MaxTokens: 2, Ctx: ctx})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(h.blend.Lookups()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	res, _ := hd.Wait(context.Background())
	if res.Err == nil {
		t.Fatalf("canceled request finished: %+v", res)
	}
	var req sdktrace.ReadOnlySpan
	for _, s := range h.rec.Ended() {
		if s.Name() == spanname.CBRequest {
			req = s
		}
	}
	wantNoLookup(t, req, LookupAbandoned, 30)
}

func TestStoreKeepsBlocksUntilReported(t *testing.T) {
	w := enginetest.NewWorker(32, 16, 4096)
	w.StoreDelaySteps = 3
	blend := &enginetest.Blend{}
	h := newHarness(t, opts{worker: w, blend: blend, cfg: Config{StorePollInterval: 50 * time.Millisecond}})
	p := prompt(40, 4)
	res := run(t, h.s, &Request{ID: "s", Prompt: p, MaxTokens: 1})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	first := w.SeqSteps("s")[0]
	if !first.GetStore() || first.GetDocument() {
		t.Fatalf("the prompt's last prefill step should ask for a store: %v", first)
	}
	if st := checkKV(t, h.s); st.KVUsed == 0 || st.StoresPending != 1 {
		t.Fatalf("blocks freed before the store report: %+v", st)
	}
	waitFor(t, "store reported", func() bool { return slices.Contains(w.Stored(), "s") })
	waitFor(t, "blocks freed", func() bool { st := checkKV(t, h.s); return st.KVUsed == 0 && st.StoresPending == 0 })
}

// TestLookupNamesStoresInFlight: a lookup names the stores of this engine
// not reported done (the worker sends them from a goroutine, and the blend
// server waits for the named ones to arrive), and none once they are.
func TestLookupNamesStoresInFlight(t *testing.T) {
	for _, tc := range []struct {
		name       string
		delaySteps int // before the worker double reports a store done
		want       []string
	}{
		{name: "first request's store not reported", delaySteps: 1 << 30, want: []string{"first"}},
		{name: "first request's store reported", delaySteps: 0, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := enginetest.NewWorker(64, 16, 4096)
			w.StoreDelaySteps = tc.delaySteps
			blend := &enginetest.Blend{}
			h := newHarness(t, opts{worker: w, blend: blend, cfg: Config{StorePollInterval: 50 * time.Millisecond}})
			for _, id := range []string{"first", "second"} {
				if res := run(t, h.s, &Request{ID: id, Prompt: prompt(40, int32(len(id))), MaxTokens: 1}); res.Err != nil {
					t.Fatal(res.Err)
				}
			}
			got := map[string][]string{}
			for _, l := range blend.Lookups() {
				got[l.GetRequestId()] = l.GetPendingStoreIds()
			}
			if len(got["first"]) != 0 {
				t.Errorf("the first lookup named stores %v, want none", got["first"])
			}
			if !slices.Equal(got["second"], tc.want) {
				t.Errorf("the second lookup named stores %v, want %v", got["second"], tc.want)
			}
		})
	}
}

func TestDocumentIngest(t *testing.T) {
	w := enginetest.NewWorker(32, 16, 4096)
	w.StoreDelaySteps = 2
	h := newHarness(t, opts{worker: w, cfg: Config{StepTokenBudget: 32, StorePollInterval: time.Millisecond}})
	doc := prompt(70, 8)[1:]
	res := run(t, h.s, &Request{ID: "doc", Prompt: doc, Document: true})
	if res.Err != nil || res.FinishReason != FinishStored || len(res.Tokens) != 0 {
		t.Fatalf("result %+v", res)
	}
	steps := w.SeqSteps("doc")
	last := steps[len(steps)-1]
	if len(steps) != 3 || !last.GetStore() || !last.GetDocument() || last.GetSample() || steps[0].GetStore() {
		t.Fatalf("document steps %v", steps)
	}
	if st := checkKV(t, h.s); st.KVUsed != 0 {
		t.Fatalf("document blocks not freed: %+v", st)
	}
}

func TestQueueFullAndTooLong(t *testing.T) {
	w := enginetest.NewWorker(16, 16, 300)
	gate := w.Gate()
	h := newHarness(t, opts{worker: w, cfg: Config{MaxQueue: 1, MaxRunning: 1}})
	h1, err := h.s.Submit(&Request{ID: "1", Prompt: prompt(10, 1), MaxTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "first admitted", func() bool { return h.s.Stats().Running == 1 })
	h2, err := h.s.Submit(&Request{ID: "2", Prompt: prompt(10, 2), MaxTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.s.Submit(&Request{ID: "3", Prompt: prompt(10, 3), MaxTokens: 2}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third submit: %v, want ErrQueueFull", err)
	}
	for _, tc := range []struct {
		name string
		r    Request
		want error
	}{
		{"positions", Request{ID: "x", Prompt: prompt(290, 1), MaxTokens: 20}, ErrTooLong},
		{"pool", Request{ID: "x", Prompt: prompt(200, 1), MaxTokens: 90}, ErrTooLong}, // 290 tokens > 16 blocks of 16
		{"vocab", Request{ID: "x", Prompt: []int32{1, 999}, MaxTokens: 1}, ErrBadRequest},
		{"empty", Request{ID: "x", MaxTokens: 1}, ErrBadRequest},
		{"no tokens", Request{ID: "x", Prompt: []int32{1}}, ErrBadRequest},
		{"duplicate", Request{ID: "1", Prompt: []int32{1}, MaxTokens: 1}, ErrBadRequest},
	} {
		if _, err := h.s.Submit(&tc.r); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	close(gate)
	for _, hd := range []*Handle{h1, h2} {
		if res, _ := hd.Wait(context.Background()); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
}

func TestCancel(t *testing.T) {
	w := enginetest.NewWorker(64, 16, 4096)
	h := newHarness(t, opts{worker: w})
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int32
	hd, err := h.s.Submit(&Request{ID: "c", Prompt: prompt(10, 1), MaxTokens: 1000, Ctx: ctx,
		OnToken: func(int32) bool { n.Add(1); return false }})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "tokens", func() bool { return n.Load() > 3 })
	cancel()
	res, _ := hd.Wait(context.Background())
	if !errors.Is(res.Err, ErrCanceled) {
		t.Fatalf("err %v", res.Err)
	}
	waitFor(t, "finished id", func() bool {
		for _, st := range w.Steps() {
			if slices.Contains(st.GetFinishedRequestIds(), "c") {
				return true
			}
		}
		return false
	})
	if st := checkKV(t, h.s); st.KVUsed != 0 || st.Running != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestWorkerFailureAndRecovery(t *testing.T) {
	w := enginetest.NewWorker(64, 16, 4096)
	w.SetInfoError(errors.New("booting"))
	o := opts{worker: w, cfg: Config{WorkerRetryInterval: 5 * time.Millisecond}}
	// newHarness waits for readiness: build by hand.
	s, err := New(o.cfg, Deps{Worker: enginetest.WorkerClient(t, w)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown(context.Background()) }()
	if _, err := s.Submit(&Request{ID: "a", Prompt: prompt(5, 1), MaxTokens: 1}); !errors.Is(err, ErrWorkerUnavailable) {
		t.Fatalf("before Info: %v", err)
	}
	w.SetInfoError(nil)
	waitFor(t, "ready", func() bool { _, ok := s.WorkerInfo(); return ok })
	w.FailNextExecute(errors.New("worker crashed"))
	hd, err := s.Submit(&Request{ID: "b", Prompt: prompt(5, 1), MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	res, _ := hd.Wait(context.Background())
	if !errors.Is(res.Err, ErrWorkerUnavailable) {
		t.Fatalf("err %v", res.Err)
	}
	waitFor(t, "ready again", func() bool { _, ok := s.WorkerInfo(); return ok })
	hd, err = s.Submit(&Request{ID: "c", Prompt: prompt(5, 2), MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res, _ := hd.Wait(context.Background()); res.Err != nil || len(res.Tokens) != 3 {
		t.Fatalf("after recovery: %+v", res)
	}
}

func TestShutdownFailsInFlight(t *testing.T) {
	w := enginetest.NewWorker(64, 16, 4096)
	gate := w.Gate()
	s, err := New(Config{}, Deps{Worker: enginetest.WorkerClient(t, w)})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Start(context.Background())
	waitFor(t, "ready", func() bool { _, ok := s.WorkerInfo(); return ok })
	hd, err := s.Submit(&Request{ID: "x", Prompt: prompt(5, 1), MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown: %v", err)
	}
	close(gate)
	res, _ := hd.Wait(context.Background())
	if !errors.Is(res.Err, ErrShutdown) {
		t.Fatalf("err %v", res.Err)
	}
	if _, err := s.Submit(&Request{ID: "y", Prompt: prompt(5, 1), MaxTokens: 1}); !errors.Is(err, ErrShutdown) {
		t.Fatalf("submit after shutdown: %v", err)
	}
}

func TestPlanOf(t *testing.T) {
	m := func(ss, se, cs, ce int, prefix bool) *cbv1.Match {
		return &cbv1.Match{StoredSt: int32(ss), StoredEd: int32(se), CurSt: int32(cs), CurEd: int32(ce), Prefix: prefix,
			ChunkKeys: [][]byte{testKey(1), testKey(2), testKey(3)}, FirstChunkStart: 0}
	}
	for _, tc := range []struct {
		name          string
		matches       []*cbv1.Match
		prefixOnly    bool
		local, total  int
		wantStart     int
		wantReused    int
		wantMatches   [][4]int32
		wantNil       bool
		wantFirstKeys int
	}{
		{"no matches", nil, false, 0, 100, 0, 0, nil, true, 0},
		{"prefix and shifted", []*cbv1.Match{m(0, 40, 0, 40, true), m(10, 30, 60, 80, false)}, false, 0, 100, 40, 60,
			[][4]int32{{0, 40, 0, 40}, {10, 30, 60, 80}}, false, 1},
		{"blending off: prefix only", []*cbv1.Match{m(0, 40, 0, 40, true), m(10, 30, 60, 80, false)}, true, 0, 100, 40, 40,
			[][4]int32{{0, 40, 0, 40}}, false, 1},
		{"blending off: nothing but shifted", []*cbv1.Match{m(10, 30, 60, 80, false)}, true, 0, 100, 0, 0, nil, true, 0},
		{"clipped at local cache", []*cbv1.Match{m(0, 600, 0, 600, true)}, false, 512, 1000, 600, 88,
			[][4]int32{{512, 600, 512, 600}}, false, 1},
		{"inside local cache", []*cbv1.Match{m(0, 32, 0, 32, true)}, false, 48, 100, 48, 0, nil, true, 0},
		{"full prompt", []*cbv1.Match{m(0, 100, 0, 100, true)}, false, 0, 100, 99, 100, [][4]int32{{0, 100, 0, 100}}, false, 1},
		{"invalid dropped", []*cbv1.Match{m(0, 10, 0, 20, false)}, false, 0, 100, 0, 0, nil, true, 0},
		{"out of prompt dropped", []*cbv1.Match{m(5, 5, 5, 5, false), m(0, 300, 0, 300, true)}, false, 0, 100, 0, 0, nil, true, 0},
		{"overlap dropped", []*cbv1.Match{m(0, 20, 30, 50, false), m(0, 20, 40, 60, false)}, false, 0, 100, 0, 20,
			[][4]int32{{0, 20, 30, 50}}, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &cbv1.LookupResult{Matches: tc.matches, ChunkSize: 256}
			orig := proto.Clone(res)
			p, ok := planOf(res, tc.local, tc.total, 0.2, tc.prefixOnly)
			if !proto.Equal(res, orig) {
				t.Fatal("planOf modified the lookup result")
			}
			if ok == tc.wantNil {
				t.Fatalf("plan %+v ok %v", p, ok)
			}
			if !ok {
				return
			}
			if p.Start != tc.wantStart || p.ReusedTokens() != tc.wantReused {
				t.Fatalf("start %d reused %d", p.Start, p.ReusedTokens())
			}
			plan := rpc.PlanToProto(p)
			var got [][4]int32
			for _, m := range plan.GetMatches() {
				got = append(got, [4]int32{m.StoredSt, m.StoredEd, m.CurSt, m.CurEd})
			}
			if !slices.Equal(got, tc.wantMatches) || plan.GetPrefixHitTokens() != int32(p.Start) || plan.GetRecompRatio() != 0.2 {
				t.Fatalf("matches %v plan %v", got, plan)
			}
			if len(plan.GetMatches()[0].GetChunkKeys()) != tc.wantFirstKeys {
				t.Fatalf("chunk keys %d, want %d", len(plan.GetMatches()[0].GetChunkKeys()), tc.wantFirstKeys)
			}
		})
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// BenchmarkScheduleStep measures one iteration of the step loop's hot path
// (schedule, build the step request, fold the worker's answer in) on a
// steady batch of 32 decoding sequences; every op is one step of 32
// sequences. The requests that reach their max tokens are replaced outside
// the timer. It should report 0 allocs/op:
//
//	go test ./engine/scheduler -run '^$' -bench ScheduleStep -benchmem
func BenchmarkScheduleStep(b *testing.B) {
	const running = 32
	w := enginetest.NewWorker(1<<16, 16, 1<<20)
	s, err := New(Config{MaxRunning: running}, Deps{Worker: enginetest.WorkerClient(b, w)})
	if err != nil {
		b.Fatal(err)
	}
	// Drive the scheduling functions directly (no loop), with a ready pool.
	s.probe()
	outs := map[string]*cbv1.SeqOutput{}
	gen := 0
	refill := func() {
		for len(s.q.byID) < running {
			id := fmt.Sprint(gen)
			if _, err := s.Submit(&Request{ID: id, Prompt: prompt(200, int32(gen)), MaxTokens: 1024}); err != nil {
				b.Fatal(err)
			}
			outs[id] = &cbv1.SeqOutput{RequestId: id, HasToken: true, Token: 7}
			gen++
		}
	}
	resp := &cbv1.ExecuteResponse{}
	step := func() {
		s.mu.Lock()
		now := time.Now()
		batch := s.schedule(now)
		req := s.buildExecute(batch, now)
		resp.Outputs = resp.Outputs[:0]
		for _, st := range req.GetSeqs() {
			resp.Outputs = append(resp.Outputs, outs[st.GetRequestId()])
		}
		s.applyStep(batch, resp, nil, now)
		s.unlock()
	}
	refill()
	for range 40 { // past the prefills: every sequence decodes
		step()
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(s.q.byID) < running {
			b.StopTimer()
			refill()
			b.StartTimer()
		}
		step()
	}
	b.StopTimer()
	if st := s.Stats(); st.Running != running || st.BatchTokens != running {
		b.Fatalf("not a steady decode batch: %+v", st)
	}
	s.Abort(nil)
	s.loop.cancel()
}

// TestScheduleSpansWithoutLookup: a request computed in full (no lookup)
// still has cb.schedule ⊃ cb.build_meta with true timestamps.
func TestScheduleSpansWithoutLookup(t *testing.T) {
	h := newHarness(t, opts{blend: &enginetest.Blend{}})
	res := run(t, h.s, &Request{ID: "full", Prompt: prompt(40, 5), MaxTokens: 2, NoReuse: true})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range h.rec.Ended() {
		byName[s.Name()] = s
	}
	sched, meta := byName[spanname.CBSchedule], byName[spanname.CBBuildMeta]
	if sched == nil || meta == nil || byName[spanname.CBLookupRPC] != nil {
		t.Fatalf("spans %v", names(h.rec.Ended()))
	}
	wantNoLookup(t, byName[spanname.CBRequest], LookupSkipped, 40)
	if sched.EndTime().Before(sched.StartTime()) || meta.EndTime().Before(meta.StartTime()) ||
		meta.StartTime().Before(sched.StartTime()) || sched.EndTime().Before(meta.EndTime()) {
		t.Fatalf("cb.schedule [%v, %v] ⊃ cb.build_meta [%v, %v] violated", sched.StartTime(), sched.EndTime(), meta.StartTime(), meta.EndTime())
	}
}

// A request's CacheBlend settings reach its plan and its steps: its own
// recompute ratio (0 included: reuse without recompute), its selection
// rule seeded by its sampling seed, and its quality check on the prefill.
func TestRequestBlendOptions(t *testing.T) {
	zero, third := 0.0, 0.3
	tests := []struct {
		name      string
		opts      BlendOptions
		wantRatio float64
		wantSel   cbv1.Selection
	}{
		{"engine default", BlendOptions{}, DefaultRecompRatio, cbv1.Selection_SELECTION_DEVIATION},
		{"own ratio", BlendOptions{RecompRatio: &third}, 0.3, cbv1.Selection_SELECTION_DEVIATION},
		{"no recompute", BlendOptions{RecompRatio: &zero}, 0, cbv1.Selection_SELECTION_DEVIATION},
		{"random with check", BlendOptions{RecompRatio: &third, Selection: cbv1.Selection_SELECTION_RANDOM, QualityCheck: true},
			0.3, cbv1.Selection_SELECTION_RANDOM},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			blend := &enginetest.Blend{Result: prefixResult(100, 200, 300)}
			h := newHarness(t, opts{blend: blend})
			res := run(t, h.s, &Request{ID: "o1", Prompt: prompt(400, 11), MaxTokens: 2, Blend: tc.opts,
				Sampling: &cbv1.SamplingParams{Seed: 77}})
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			first := h.worker.SeqSteps("o1")[0]
			plan := first.GetCbPlan()
			if plan == nil || plan.GetRecompRatio() != tc.wantRatio || plan.GetSelection() != tc.wantSel || plan.GetSelectionSeed() != 77 {
				t.Fatalf("plan %v, want ratio %v selection %v seed 77", plan, tc.wantRatio, tc.wantSel)
			}
			if first.GetQualityCheck() != tc.opts.QualityCheck {
				t.Fatalf("quality_check %v, want %v", first.GetQualityCheck(), tc.opts.QualityCheck)
			}
		})
	}
}
