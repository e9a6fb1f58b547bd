package worker

import (
	"context"
	"fmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/kvsock"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/telemetry/provider"
	"github.com/cacheblend/cacheblend/tokenizer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// smallModel keeps -race runs fast.
var smallModel = model.Config{Layers: 4, Dim: 64, Heads: 4, KVHeads: 2, FFNDim: 128, MaxPositions: 2048, Threads: 2}

type harness struct {
	w      *Worker
	client cbv1.WorkerServiceClient
	conn   *grpc.ClientConn
	rec    *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reg    *prometheus.Registry
}

func start(t *testing.T, cfg Config) *harness { return startWith(t, cfg, nil) }

// startWith is start with a last change to the configuration.
func startWith(t *testing.T, cfg Config, mut func(*Config)) *harness {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	// The id generator of every process's provider (telemetry/provider): option-B roots.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithIDGenerator(provider.NewIDGenerator(nil)))
	cfg.Model = smallModel
	cfg.ShmDir = t.TempDir()
	cfg.NumBlocks = 64
	if cfg.Quality.Gate == "" {
		cfg.Quality.Gate = GateOn // the gate's check has its own tests (gate_test.go)
	}
	if mut != nil {
		mut(&cfg)
	}
	reg := prometheus.NewRegistry()
	w, err := New(cfg, Deps{Deps: component.Deps{TracerProvider: tp, Registerer: reg}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(w.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{w: w, client: cbv1.NewWorkerServiceClient(conn), conn: conn, rec: rec, tp: tp, reg: reg}
	t.Cleanup(func() {
		conn.Close()
		if err := w.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		if ents, _ := os.ReadDir(cfg.ShmDir); len(ents) != 0 {
			t.Errorf("files left in the KV memory's directory: %v", ents)
		}
		tp.Shutdown(context.Background())
	})
	return h
}

func prompt(n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*7 + 3) % 256)
	}
	return p
}

// generate runs a request through the worker: the prompt in chunks of
// chunk tokens, then decode steps; it returns the sampled tokens.
func generate(t *testing.T, h *harness, id string, p []int32, chunk, n int, bt []int32) []int32 {
	t.Helper()
	return generateS(t, h, id, p, chunk, n, bt, nil)
}

// generateS is generate with sampling parameters.
func generateS(t *testing.T, h *harness, id string, p []int32, chunk, n int, bt []int32, sampling *cbv1.SamplingParams) []int32 {
	t.Helper()
	ctx := context.Background()
	var out []int32
	for s := 0; s < len(p); s += chunk {
		e := min(s+chunk, len(p))
		sq := &cbv1.SeqStep{RequestId: id, BlockTable: bt, Tokens: p[s:e], StartPos: int32(s), IsPrefill: true, Sample: e == len(p), Sampling: sampling}
		if s == 0 {
			sq.PromptTokens = p
		}
		resp, err := h.client.Execute(ctx, &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{sq}})
		if err != nil {
			t.Fatal(err)
		}
		if o := resp.Outputs[0]; o.Error != "" {
			t.Fatal(o.Error)
		} else if e == len(p) {
			out = append(out, o.Token)
		}
	}
	for len(out) < n {
		pos := len(p) + len(out) - 1
		resp, err := h.client.Execute(ctx, &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{
			RequestId: id, BlockTable: bt, Tokens: []int32{out[len(out)-1]}, StartPos: int32(pos), Sample: true, Sampling: sampling}}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Outputs[0].Error != "" {
			t.Fatal(resp.Outputs[0].Error)
		}
		out = append(out, resp.Outputs[0].Token)
	}
	if _, err := h.client.Execute(ctx, &cbv1.ExecuteRequest{FinishedRequestIds: []string{id}}); err != nil {
		t.Fatal(err)
	}
	return out
}

func blocks(from, n int) []int32 {
	bt := make([]int32, n)
	for i := range bt {
		bt[i] = int32(from + i)
	}
	return bt
}

func TestChunkedPrefillAndDecodeDeterministic(t *testing.T) {
	h := start(t, Config{})
	var wholes [][]int32
	for i, p := range [][]int32{prompt(100), otherPrompt(100)} {
		whole := generate(t, h, fmt.Sprint("a", i), p, len(p), 8, blocks(0, 8))
		chunked := generate(t, h, fmt.Sprint("b", i), p, 32, 8, blocks(10, 8))
		if len(whole) != 8 {
			t.Fatalf("got %d tokens", len(whole))
		}
		for i := range whole {
			if whole[i] != chunked[i] {
				t.Fatalf("chunked prefill diverged at token %d: %v vs %v", i, whole, chunked)
			}
		}
		wholes = append(wholes, whole)
	}
	requireDistinct(t, wholes...)
}

func TestInfoAndBadInput(t *testing.T) {
	h := start(t, Config{})
	info, err := h.client.Info(context.Background(), &cbv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.NumBlocks != 64 || info.BlockSize != 16 || info.Model != defaults.Model || info.Eos != tokenizer.EOS {
		t.Fatalf("info %+v", info)
	}
	tests := []struct {
		name string
		sq   *cbv1.SeqStep
	}{
		{"no prompt on first step", &cbv1.SeqStep{RequestId: "x", IsPrefill: true, Tokens: []int32{1}, BlockTable: blocks(0, 1)}},
		{"chunk outside prompt", &cbv1.SeqStep{RequestId: "y", IsPrefill: true, PromptTokens: []int32{1, 2}, Tokens: []int32{1, 2, 3}, BlockTable: blocks(0, 1)}},
		{"block table too short", &cbv1.SeqStep{RequestId: "z", IsPrefill: true, PromptTokens: prompt(40), Tokens: prompt(40), BlockTable: blocks(0, 1)}},
		{"decode unknown request", &cbv1.SeqStep{RequestId: "u", Tokens: []int32{1}, StartPos: 3, BlockTable: blocks(0, 1)}},
		{"token out of vocabulary", &cbv1.SeqStep{RequestId: "v", IsPrefill: true, PromptTokens: []int32{9999}, Tokens: []int32{9999}, BlockTable: blocks(0, 1)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := h.client.Execute(context.Background(), &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{tc.sq}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Outputs[0].Error == "" {
				t.Fatal("bad input accepted")
			}
		})
	}
}

func TestExecuteSpanIsRemoteChild(t *testing.T) {
	h := start(t, Config{})
	caller := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	p := prompt(20)
	_, err := h.client.Execute(context.Background(), &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{
		RequestId: "r1", TraceContext: caller, BlockTable: blocks(0, 2), Tokens: p, PromptTokens: p, IsPrefill: true, Sample: true}}})
	if err != nil {
		t.Fatal(err)
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range h.rec.Ended() {
		spans[s.Name()] = s
	}
	exec, fwd := spans[spanname.CBExecute], spans[spanname.CBModelForward]
	if exec == nil || fwd == nil {
		t.Fatalf("spans %v", spans)
	}
	sc, _ := telemetry.ParseTraceparent(caller)
	if exec.SpanContext().TraceID() != sc.TraceID() || exec.Parent().SpanID() != sc.SpanID() || !exec.Parent().IsRemote() {
		t.Fatalf("cb.execute parent %v, want remote %v", exec.Parent(), sc)
	}
	if fwd.Parent().SpanID() != exec.SpanContext().SpanID() {
		t.Fatal("cb.model_forward not under cb.execute")
	}
	// A sampled-out caller records nothing.
	n := len(h.rec.Ended())
	_, err = h.client.Execute(context.Background(), &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{
		RequestId: "r2", TraceContext: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", BlockTable: blocks(2, 2), Tokens: p, PromptTokens: p, IsPrefill: true, Sample: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.rec.Ended()) != n {
		t.Fatal("sampled-out request recorded spans")
	}
}

// TestExecuteOptionB: a step without a trace context (the engine does not trace) opens
// cb.execute as a root of the trace derived from the request id, where the blend server's
// spans of the request land too; a step with one and a trace_state carries the caller's
// vendor entries to every worker span.
func TestExecuteOptionB(t *testing.T) {
	h := start(t, Config{})
	p := prompt(20)
	// gRPC metadata of the step call is not a request's context: ignored.
	mdCtx := telemetry.InjectGRPC(trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})))
	_, err := h.client.Execute(mdCtx, &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{
		RequestId: "untraced-1", BlockTable: blocks(0, 2), Tokens: p, PromptTokens: p, IsPrefill: true, Sample: true}}})
	if err != nil {
		t.Fatal(err)
	}
	want := telemetry.TraceIDFromRequestID("untraced-1")
	var exec sdktrace.ReadOnlySpan
	for _, s := range h.rec.Ended() {
		if s.SpanContext().TraceID() != want {
			t.Errorf("%s in trace %s, want the derived %s", s.Name(), s.SpanContext().TraceID(), want)
		}
		if s.Name() == spanname.CBExecute {
			exec = s
		}
	}
	if exec == nil || exec.Parent().IsValid() {
		t.Fatalf("cb.execute %v: want a root", exec)
	}

	caller := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const vendor = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
	n := len(h.rec.Ended())
	_, err = h.client.Execute(context.Background(), &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{
		RequestId: "traced-1", TraceContext: caller, TraceState: vendor, BlockTable: blocks(2, 2), Tokens: p, PromptTokens: p, IsPrefill: true, Sample: true}}})
	if err != nil {
		t.Fatal(err)
	}
	ended := h.rec.Ended()[n:]
	if len(ended) == 0 {
		t.Fatal("no spans")
	}
	for _, s := range ended {
		if got := s.SpanContext().TraceState().String(); got != vendor {
			t.Errorf("%s tracestate %q, want %q", s.Name(), got, vendor)
		}
	}
}

// TestExecuteRejectsOversizedSteps replays the crash-on-request attack
// (hundreds of thousands of decode inputs at the last position) and its
// variants through the worker's gRPC port: each is refused with
// InvalidArgument before anything is sized from it, and the worker serves
// a normal step afterwards.
func TestExecuteRejectsOversizedSteps(t *testing.T) {
	h := start(t, Config{})
	ctx := context.Background()
	maxPos := int32(smallModel.MaxPositions)
	decode := func(n int, pos int32) *cbv1.ExecuteRequest {
		req := &cbv1.ExecuteRequest{}
		for i := range n {
			req.Seqs = append(req.Seqs, &cbv1.SeqStep{RequestId: fmt.Sprint("r", i), Tokens: []int32{1}, StartPos: pos, BlockTable: blocks(0, 64)})
		}
		return req
	}
	for _, tc := range []struct {
		name string
		req  *cbv1.ExecuteRequest
	}{
		{"400k decodes at the last position", decode(400_000, maxPos-1)},
		{"too many sequences", decode(MaxStepSeqs+1, 0)},
		{"same request twice", &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{RequestId: "a", Tokens: []int32{1}, BlockTable: blocks(0, 1)}, {RequestId: "a", Tokens: []int32{1}, BlockTable: blocks(0, 1)}}}},
		{"too many tokens", &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{RequestId: "a", Tokens: make([]int32, MaxStepTokens+1), IsPrefill: true}}}},
		{"no request id", &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{Tokens: []int32{1}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := h.client.Execute(ctx, tc.req); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("Execute: %v, want InvalidArgument", err)
			}
		})
	}
	// Per-sequence problems fail that sequence alone, before any compute.
	for _, tc := range []struct {
		name string
		sq   *cbv1.SeqStep
	}{
		{"position beyond the model", &cbv1.SeqStep{RequestId: "p", Tokens: []int32{1}, StartPos: maxPos, BlockTable: blocks(0, 64)}},
		{"block outside the pool", &cbv1.SeqStep{RequestId: "b", Tokens: []int32{1}, BlockTable: []int32{1 << 30}}},
		{"negative block", &cbv1.SeqStep{RequestId: "n", Tokens: []int32{1}, BlockTable: []int32{-1}}},
		{"block table longer than the pool", &cbv1.SeqStep{RequestId: "l", Tokens: []int32{1}, BlockTable: make([]int32, 65)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := h.client.Execute(ctx, &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{tc.sq}})
			if err != nil || len(resp.GetOutputs()) != 1 || resp.GetOutputs()[0].GetError() == "" {
				t.Fatalf("Execute: %v %v, want the sequence failed", resp, err)
			}
		})
	}
	// Still alive and correct.
	p := prompt(20)
	got, want := generate(t, h, "after", p, 8, 3, blocks(0, 4)), generate(t, h, "again", p, 20, 3, blocks(4, 4))
	if !slices.Equal(got, want) {
		t.Fatalf("generation after the attacks %v, want %v", got, want)
	}
	requireDistinct(t, want, generate(t, h, "other", otherPrompt(20), 20, 3, blocks(8, 4)))
}

// fakeBlend is a blend server for the registration: its KV socket
// records the registrations (and their descriptors' sizes) and answers
// each with a fresh token; as a client it records UnregisterKV calls. Any
// other call panics (the embedded interface is nil).
type fakeBlend struct {
	cbv1.BlendServiceClient
	ln *kvsock.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	regs   []*cbv1.KVRegistration
	sizes  []int64
	tokens [][]byte
	conns  []*kvsock.Conn
	unregs []*cbv1.UnregisterKVRequest
}

func newFakeBlend(t *testing.T) *fakeBlend {
	t.Helper()
	ln, err := kvsock.Listen("")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBlend{ln: ln}
	f.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var r cbv1.KVRegistration
			files, err := c.Recv(time.Now().Add(5*time.Second), &r)
			if err != nil || len(files) != 1 {
				c.Close()
				continue
			}
			st, _ := files[0].Stat()
			files[0].Close()
			tok := []byte(fmt.Sprintf("token-%032d", len(f.regs)))
			f.mu.Lock()
			f.regs, f.sizes, f.tokens, f.conns = append(f.regs, &r), append(f.sizes, st.Size()), append(f.tokens, tok), append(f.conns, c)
			f.mu.Unlock()
			c.Send(time.Now().Add(5*time.Second), &cbv1.KVRegistered{RegistrationToken: tok, ServerEpoch: "e1"}, nil)
		}
	})
	t.Cleanup(func() {
		ln.Close()
		f.wg.Wait()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			c.Close()
		}
	})
	return f
}

func (f *fakeBlend) UnregisterKV(_ context.Context, r *cbv1.UnregisterKVRequest, _ ...grpc.CallOption) (*cbv1.UnregisterKVResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unregs = append(f.unregs, r)
	return &cbv1.UnregisterKVResponse{}, nil
}

func (f *fakeBlend) registrations() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.regs)
}

// dropLast closes the server side of the latest registration, as a blend
// server that restarts does.
func (f *fakeBlend) dropLast() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conns[len(f.conns)-1].Close()
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The worker registers its KV memory on the blend server's socket (the
// descriptor, no path), registers again when the server drops the
// connection, unregisters with its token on Shutdown, follows the
// component lifecycle, and leaves the blend client open for its owner.
func TestBlendRegistrationAndLifecycle(t *testing.T) {
	fb := newFakeBlend(t)
	cfg := Config{Model: smallModel, ShmDir: t.TempDir(), NumBlocks: 8, RegisterInterval: 10 * time.Millisecond, BlendKVSocket: fb.ln.Path()}
	w, err := New(cfg, Deps{Blend: fb})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if w.Addr() != "" || w.KVMemory() != "" {
		t.Fatal("bound before Start")
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err == nil {
		t.Fatal("second Start succeeded")
	}
	if w.KVMemory() != "memfd:cb-kv" {
		t.Fatalf("KV memory %q", w.KVMemory())
	}
	// Start returns once the first attempt ended: with the server up, the
	// worker is registered when it says it started (READY).
	if !w.Registered() {
		t.Fatal("Start returned before the first registration with a live blend server")
	}
	fb.mu.Lock()
	r, size := fb.regs[0], fb.sizes[0]
	fb.mu.Unlock()
	l := w.kv.Layout()
	if r.GetModel() != defaults.Model || r.GetWorkerId() == "" || size != l.Bytes() || int(r.GetLayout().GetNumBlocks()) != l.NumBlocks {
		t.Fatalf("registration %+v of a %d-byte descriptor", r, size)
	}
	if string(w.token()) != string(fb.tokens[0]) {
		t.Fatal("the worker does not use its registration's token")
	}
	// Held, not renewed: one registration while the connection lives.
	time.Sleep(50 * time.Millisecond)
	if n := fb.registrations(); n != 1 {
		t.Fatalf("%d registrations while the first one lives", n)
	}
	// The server drops it (a restart): the worker registers again.
	fb.dropLast()
	waitUntil(t, "the second registration", func() bool { return fb.registrations() == 2 && w.Registered() })
	if string(w.token()) != string(fb.tokens[1]) {
		t.Fatal("the worker kept the old token")
	}
	if err := w.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if w.Registered() {
		t.Fatal("registered after Shutdown")
	}
	fb.mu.Lock()
	unregs := fb.unregs
	fb.mu.Unlock()
	if len(unregs) != 1 || string(unregs[0].GetRegistrationToken()) != string(fb.tokens[1]) || unregs[0].GetWorkerId() != r.GetWorkerId() {
		t.Fatalf("unregistrations %v", unregs)
	}
	if err := w.Shutdown(ctx); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	if err := w.Start(ctx); err == nil {
		t.Fatal("Start after Shutdown succeeded")
	}
	n := fb.registrations()
	time.Sleep(30 * time.Millisecond)
	if fb.registrations() != n {
		t.Fatal("registration loop still running after Shutdown")
	}

	// Shutdown without Start releases nothing and succeeds.
	w2, err := New(Config{}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// Without a blend server listening the worker serves without reuse and
// keeps trying; once the server is up it registers.
func TestRegistersWhenTheBlendServerComesUp(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	path := dir + "/kv.sock"
	cfg := Config{Model: smallModel, ShmDir: t.TempDir(), NumBlocks: 8, RegisterInterval: 10 * time.Millisecond, BlendKVSocket: path}
	fb := &fakeBlend{}
	w, err := New(cfg, Deps{Blend: fb})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Shutdown(context.Background())
	time.Sleep(50 * time.Millisecond)
	if w.Registered() {
		t.Fatal("registered with no server")
	}
	ln, err := kvsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var r cbv1.KVRegistration
	files, err := c.Recv(time.Now().Add(5*time.Second), &r)
	if err != nil || len(files) != 1 {
		t.Fatalf("registration: %v, %d descriptors", err, len(files))
	}
	files[0].Close()
	if err := c.Send(time.Now().Add(5*time.Second), &cbv1.KVRegistered{RegistrationToken: []byte("t")}, nil); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the registration", func() bool { return w.Registered() })
}
