package worker

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/mtls"
	"github.com/cacheblend/cacheblend/rpc/mtls/mtlstest"
)

var secret = bytes.Repeat([]byte{7}, SecretBytes)

// prefillFor runs the prompt's prefill on h with a hand-over secret and
// returns the first token; the worker then keeps the prompt's KV.
func prefillFor(t *testing.T, h *harness, id string, p []int32, bt []int32, sampling *cbv1.SamplingParams) int32 {
	t.Helper()
	resp, err := h.client.Execute(context.Background(), &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{
		RequestId: id, BlockTable: bt, Tokens: p, PromptTokens: p, IsPrefill: true, Sample: true,
		Sampling: sampling, HandoffSecret: secret}}})
	if err != nil {
		t.Fatal(err)
	}
	if o := resp.Outputs[0]; o.Error != "" || !o.HasToken {
		t.Fatalf("prefill: %+v", o)
	}
	return resp.Outputs[0].Token
}

// decodeFrom continues a handed-over request on h: the first step carries
// the prompt (and the draws already made), then one token per step.
func decodeFrom(t *testing.T, h *harness, id string, p []int32, first int32, n int, bt []int32, sampling *cbv1.SamplingParams, draws uint32) []int32 {
	t.Helper()
	out := []int32{first}
	for len(out) < n {
		sq := &cbv1.SeqStep{RequestId: id, BlockTable: bt, Tokens: []int32{out[len(out)-1]},
			StartPos: int32(len(p) + len(out) - 1), Sample: true, Sampling: sampling}
		if len(out) == 1 {
			sq.PromptTokens, sq.RngDraws = p, draws
		}
		resp, err := h.client.Execute(context.Background(), &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{sq}})
		if err != nil {
			t.Fatal(err)
		}
		if o := resp.Outputs[0]; o.Error != "" {
			t.Fatal(o.Error)
		}
		out = append(out, resp.Outputs[0].Token)
	}
	return out
}

func released(t *testing.T, h *harness) []string {
	t.Helper()
	resp, err := h.client.Execute(context.Background(), &cbv1.ExecuteRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.HandoffReleasedIds
}

// TestHandOverEqualsOneWorker: a prompt prefilled on worker A, its KV pulled
// by worker B (in full, then with the leading blocks already on B), decodes
// to exactly the tokens one worker generates, greedy and seeded sampling.
func TestHandOverEqualsOneWorker(t *testing.T) {
	a, b := start(t, Config{}), start(t, Config{})
	var refs [][]int32
	for _, tc := range []struct {
		name     string
		p        []int32 // 100 tokens: 7 blocks of 16, the last one partial
		sampling *cbv1.SamplingParams
		from     int // blocks B computes itself (deduped)
	}{
		{"greedy, full pull", prompt(100), nil, 0},
		{"greedy, 4 blocks deduped", otherPrompt(100), nil, 4},
		{"seeded sampling", prompt(100), &cbv1.SamplingParams{Temperature: 0.8, TopP: 0.9, Seed: 42}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			id := "ho-" + tc.name
			ref := generateS(t, a, "ref-"+tc.name, p, len(p), 6, blocks(0, 8), tc.sampling)
			first := prefillFor(t, a, id, p, blocks(8, 7), tc.sampling)
			bt := blocks(20, 7)
			if tc.from > 0 { // B holds the prompt's first blocks already (its prefix cache)
				pre := p[:tc.from*16]
				generate(t, b, "pre-"+tc.name, pre, len(pre), 1, bt[:tc.from])
			}
			resp, err := b.client.PullKV(context.Background(), &cbv1.PullKVRequest{RequestId: id, Source: a.w.Addr(), Secret: secret,
				BlockTable: bt, FromBlock: int32(tc.from), NTokens: int32(len(p)), Tokens: p})
			if err != nil {
				t.Fatal(err)
			}
			l := b.w.kv.Layout()
			if want := int64(len(p)-tc.from*16) * l.TokenBytes(); resp.Bytes != want || int(resp.Blocks) != 7-tc.from {
				t.Errorf("pulled %d bytes, %d blocks; want %d bytes, %d blocks", resp.Bytes, resp.Blocks, want, 7-tc.from)
			}
			draws := uint32(0)
			if tc.sampling != nil {
				draws = 1
			}
			got := decodeFrom(t, b, id, p, first, 6, bt, tc.sampling, draws)
			if !slices.Equal(got, ref) {
				t.Fatalf("handed over %v, one worker %v", got, ref)
			}
			refs = append(refs, ref)
			if r := released(t, a); !slices.Contains(r, id) {
				t.Errorf("released %v, want %s", r, id)
			}
			if _, err := b.client.Execute(context.Background(), &cbv1.ExecuteRequest{FinishedRequestIds: []string{id}}); err != nil {
				t.Fatal(err)
			}
		})
	}
	// Different prompts (and greedy vs sampled) give different tokens: the
	// comparisons above can fail.
	requireDistinct(t, refs...)
	spans := map[string]int{}
	for _, s := range append(a.rec.Ended(), b.rec.Ended()...) {
		spans[s.Name()]++
	}
	if spans[spanname.KVSend] != 3 || spans[spanname.KVReceive] != 3 {
		t.Errorf("spans %v, want 3 kv.send and 3 kv.receive", spans)
	}
}

// TestReadKVRefusals: a read needs the kept request, its secret, the same
// layout and model, and happens once.
func TestReadKVRefusals(t *testing.T) {
	a, b := start(t, Config{}), start(t, Config{})
	p := prompt(40)
	prefillFor(t, a, "k", p, blocks(0, 3), nil)
	pull := func(mut func(*cbv1.PullKVRequest)) error {
		req := &cbv1.PullKVRequest{RequestId: "k", Source: a.w.Addr(), Secret: secret, BlockTable: blocks(5, 3), NTokens: 40, Tokens: p}
		mut(req)
		_, err := b.client.PullKV(context.Background(), req)
		return err
	}
	wrong := bytes.Repeat([]byte{8}, SecretBytes)
	for _, tc := range []struct {
		name string
		mut  func(*cbv1.PullKVRequest)
		want codes.Code
	}{
		{"unknown request", func(r *cbv1.PullKVRequest) { r.RequestId = "nope" }, codes.NotFound},
		{"wrong secret", func(r *cbv1.PullKVRequest) { r.Secret = wrong }, codes.PermissionDenied},
		{"other prompt length", func(r *cbv1.PullKVRequest) { r.NTokens, r.BlockTable, r.Tokens = 33, blocks(5, 3), p[:33] }, codes.InvalidArgument},
		{"tokens not n_tokens", func(r *cbv1.PullKVRequest) { r.Tokens = p[:39] }, codes.InvalidArgument},
		{"short secret", func(r *cbv1.PullKVRequest) { r.Secret = secret[:8] }, codes.InvalidArgument},
		{"block outside the pool", func(r *cbv1.PullKVRequest) { r.BlockTable = []int32{5, 6, 64} }, codes.InvalidArgument},
		{"negative block", func(r *cbv1.PullKVRequest) { r.BlockTable = []int32{5, -1, 7} }, codes.InvalidArgument},
		{"block twice", func(r *cbv1.PullKVRequest) { r.BlockTable = []int32{5, 6, 5} }, codes.InvalidArgument},
		{"table too short", func(r *cbv1.PullKVRequest) { r.BlockTable = blocks(5, 2) }, codes.InvalidArgument},
		{"from_block beyond", func(r *cbv1.PullKVRequest) { r.FromBlock = 4 }, codes.InvalidArgument},
		{"negative from_block", func(r *cbv1.PullKVRequest) { r.FromBlock = -1 }, codes.InvalidArgument},
		{"too many tokens", func(r *cbv1.PullKVRequest) { r.NTokens, r.BlockTable = 1<<20, nil }, codes.InvalidArgument},
		{"source without port", func(r *cbv1.PullKVRequest) { r.Source = "127.0.0.1" }, codes.InvalidArgument},
		{"source port 0", func(r *cbv1.PullKVRequest) { r.Source = "127.0.0.1:0" }, codes.InvalidArgument},
		{"long source", func(r *cbv1.PullKVRequest) { r.Source = string(make([]byte, 300)) + ":1" }, codes.InvalidArgument},
		{"nothing listening", func(r *cbv1.PullKVRequest) { r.Source = "127.0.0.1:1" }, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := pull(tc.mut); status.Code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
	// A layout that differs (another model width) is refused by the keeper.
	c := startWith(t, Config{}, func(m *Config) { m.Model.KVHeads = 4 })
	if _, err := c.client.PullKV(context.Background(), &cbv1.PullKVRequest{RequestId: "k", Source: a.w.Addr(), Secret: secret,
		BlockTable: blocks(0, 3), NTokens: 40, Tokens: p}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("other layout: %v", err)
	}
	// So is another element type (the blocks travel as stored).
	d := start(t, Config{KVType: "f32"})
	if _, err := d.client.PullKV(context.Background(), &cbv1.PullKVRequest{RequestId: "k", Source: a.w.Addr(), Secret: secret,
		BlockTable: blocks(0, 3), NTokens: 40, Tokens: p}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "element type") {
		t.Errorf("other element type: %v", err)
	}
	// Failed attempts did not consume the keep; a good read does, once.
	if err := pull(func(*cbv1.PullKVRequest) {}); err != nil {
		t.Fatal(err)
	}
	if err := pull(func(*cbv1.PullKVRequest) {}); status.Code(err) != codes.NotFound {
		t.Errorf("second read: %v", err)
	}
}

// TestFinishedStopsPullAndReleasesKeep: a finished id stops a pull in
// progress (the step returns once it stopped writing) and drops a keep, and
// a keep nobody reads expires; each keep's end is reported once.
func TestFinishedStopsPullAndReleasesKeep(t *testing.T) {
	a := start(t, Config{KVSendRate: 64 << 10, KeepTimeout: 300 * time.Millisecond}) // ~1.5 s for the prompt
	b := start(t, Config{})
	p := prompt(200)
	prefillFor(t, a, "slow", p, blocks(0, 13), nil)
	errc := make(chan error, 1)
	go func() {
		_, err := b.client.PullKV(context.Background(), &cbv1.PullKVRequest{RequestId: "slow", Source: a.w.Addr(), Secret: secret,
			BlockTable: blocks(20, 13), NTokens: 200, Tokens: p})
		errc <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.w.ho.mu.Lock()
		n := len(b.w.ho.pulls)
		b.w.ho.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pull never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := b.client.Execute(context.Background(), &cbv1.ExecuteRequest{FinishedRequestIds: []string{"slow"}}); err != nil {
		t.Fatal(err)
	}
	b.w.ho.mu.Lock()
	n := len(b.w.ho.pulls)
	b.w.ho.mu.Unlock()
	if n != 0 {
		t.Fatal("the step returned while the pull still ran")
	}
	if err := <-errc; err == nil {
		t.Fatal("the stopped pull succeeded")
	}
	// The keeper saw its read end and releases the keep.
	waitReleased(t, a, "slow")

	// Dropped by a finished id without a read.
	prefillFor(t, a, "drop", p[:40], blocks(0, 3), nil)
	resp, err := a.client.Execute(context.Background(), &cbv1.ExecuteRequest{FinishedRequestIds: []string{"drop"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.HandoffReleasedIds, []string{"drop"}) {
		t.Errorf("released %v by the step that finished it, want [drop]", resp.HandoffReleasedIds)
	}
	// Expired.
	prefillFor(t, a, "old", p[:40], blocks(0, 3), nil)
	time.Sleep(350 * time.Millisecond)
	waitReleased(t, a, "old")
	if r := released(t, a); len(r) != 0 {
		t.Errorf("released again: %v", r)
	}
}

func waitReleased(t *testing.T, h *harness, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if slices.Contains(released(t, h), id) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never released", id)
}

// TestKVTransferRoles: under mutual TLS the KVTransferService admits only
// workers, the WorkerService (PullKV included) only the engine.
func TestKVTransferRoles(t *testing.T) {
	load := mtlstest.Identities(t)
	if cbv1.KVTransferService_ServiceDesc.ServiceName != mtls.KVTransferService {
		t.Fatalf("service %s, mtls names %s", cbv1.KVTransferService_ServiceDesc.ServiceName, mtls.KVTransferService)
	}
	newWorker := func() *Worker {
		w, err := New(Config{Model: smallModel, ShmDir: t.TempDir(), NumBlocks: 16}, Deps{
			Deps: component.Deps{Registerer: prometheus.NewRegistry(), GRPCServerOptions: load(mtls.Worker).ServerOptionsFor(mtls.WorkerPolicy())},
			DialPeer: func(addr string) (*grpc.ClientConn, error) {
				return rpc.Dial(addr, load(mtls.Worker).DialOption(mtls.Worker))
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Shutdown(context.Background()) })
		return w
	}
	a, b := newWorker(), newWorker()
	call := func(role mtls.Role, f func(*grpc.ClientConn) error) codes.Code {
		conn, err := rpc.Dial(a.Addr(), load(role).DialOption(mtls.Worker))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return status.Code(f(conn))
	}
	read := func(c *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := cbv1.NewKVTransferServiceClient(c).ReadKV(ctx, &cbv1.ReadKVRequest{RequestId: "x", Secret: secret, NTokens: 1,
			Layout: a.layoutProto(), Model: a.cfg.ModelName})
		if err == nil {
			_, err = st.Recv()
		}
		return err
	}
	pull := func(c *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := cbv1.NewWorkerServiceClient(c).PullKV(ctx, &cbv1.PullKVRequest{RequestId: "x", Secret: secret, NTokens: 1,
			BlockTable: []int32{0}, Source: b.Addr(), Tokens: []int32{1}})
		return err
	}
	info := func(c *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := cbv1.NewWorkerServiceClient(c).Info(ctx, &cbv1.InfoRequest{})
		return err
	}
	for _, tc := range []struct {
		name string
		role mtls.Role
		f    func(*grpc.ClientConn) error
		want codes.Code
	}{
		{"worker reads KV", mtls.Worker, read, codes.NotFound}, // admitted; nothing kept
		{"engine reads KV", mtls.Engine, read, codes.PermissionDenied},
		{"blend reads KV", mtls.Blend, read, codes.PermissionDenied},
		{"engine pulls", mtls.Engine, pull, codes.NotFound}, // admitted; a reaches b over mutual TLS, nothing kept there
		{"worker pulls", mtls.Worker, pull, codes.PermissionDenied},
		{"worker asks Info", mtls.Worker, info, codes.PermissionDenied},
		{"engine asks Info", mtls.Engine, info, codes.OK},
	} {
		if got := call(tc.role, tc.f); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestKeepRefusals: a step's hand-over secret must be 32 bytes on a
// sampling step; MaxKeeps bounds the keeps.
func TestKeepRefusals(t *testing.T) {
	h := start(t, Config{MaxKeeps: 1})
	p := prompt(20)
	step := func(id string, s []byte, sample bool) string {
		resp, err := h.client.Execute(context.Background(), &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{
			RequestId: id, BlockTable: blocks(0, 2), Tokens: p, PromptTokens: p, IsPrefill: true, Sample: sample, HandoffSecret: s}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Outputs[0].Error
	}
	if e := step("a", secret[:5], true); e == "" {
		t.Error("short secret accepted")
	}
	if e := step("b", secret, false); e == "" {
		t.Error("secret on a step that does not sample accepted")
	}
	if e := step("c", secret, true); e != "" {
		t.Fatal(e)
	}
	if e := step("d", secret, true); e == "" {
		t.Error("a keep beyond MaxKeeps accepted")
	}
	resp, err := h.client.Execute(context.Background(), &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{
		RequestId: "e", BlockTable: blocks(0, 2), Tokens: []int32{1}, StartPos: 20, PromptTokens: p, RngDraws: 1 << 30}}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Outputs[0].Error == "" {
		t.Error("rng_draws beyond the positions accepted")
	}
}

// BenchmarkKVHandOver: a decode worker pulling a 2,048-token prompt's KV
// (default model: 16 layers, 2 KV heads × 32, K and V: 8 KiB per token, 16 MiB)
// from a prefill worker over loopback gRPC, plaintext and mutual TLS.
func BenchmarkKVHandOver(b *testing.B) {
	id := mtlstest.Identities(b)(mtls.Worker)
	for _, tc := range []struct {
		name string
		deps func() Deps
	}{
		{"in-process copy", nil},
		{"plaintext", func() Deps { return Deps{Deps: component.Deps{Registerer: prometheus.NewRegistry()}} }},
		{"mutual TLS", func() Deps {
			return Deps{Deps: component.Deps{Registerer: prometheus.NewRegistry(), GRPCServerOptions: id.ServerOptionsFor(mtls.WorkerPolicy())},
				DialPeer: func(addr string) (*grpc.ClientConn, error) { return rpc.Dial(addr, id.DialOption(mtls.Worker)) }}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			if tc.deps == nil { // the ceiling: pack and unpack in one process, no network
				w, err := New(Config{NumBlocks: 384, ShmDir: b.TempDir()}, Deps{Deps: component.Deps{Registerer: prometheus.NewRegistry()}})
				if err != nil {
					b.Fatal(err)
				}
				if err := w.Start(context.Background()); err != nil {
					b.Fatal(err)
				}
				defer w.Shutdown(context.Background())
				const n = 2048
				b.SetBytes(int64(n) * w.kv.Layout().TokenBytes())
				for b.Loop() {
					for first := 0; first < n/16; first += 10 {
						cnt := min(10, n/16-first)
						unpackBlocks(w.kv, blocks(128, n/16), first, cnt, n, packBlocks(w.kv, blocks(0, n/16), first, cnt, n))
					}
				}
				return
			}
			start := func() *Worker {
				w, err := New(Config{NumBlocks: 384, ShmDir: b.TempDir()}, tc.deps())
				if err != nil {
					b.Fatal(err)
				}
				if err := w.Start(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { w.Shutdown(context.Background()) })
				return w
			}
			a, d := start(), start()
			const n = 2048
			bt := blocks(0, n/16)
			p := make([]int32, n)
			// The KV content does not matter for the copy: keep the
			// (zero) memory directly instead of prefilling.
			b.SetBytes(int64(n) * a.kv.Layout().TokenBytes())
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				rid := fmt.Sprintf("b%d", i)
				if err := a.keepKV(rid, secret, bt, p); err != nil {
					b.Fatal(err)
				}
				if _, err := d.PullKV(context.Background(), &cbv1.PullKVRequest{RequestId: rid, Source: a.Addr(), Secret: secret,
					BlockTable: blocks(128, n/16), NTokens: n, Tokens: p}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzCheckPull: a PullKV request from the wire (any bytes) never panics
// the check, and one it accepts is within the worker's pool and layout.
func FuzzCheckPull(f *testing.F) {
	w, err := New(Config{Model: smallModel, ShmDir: f.TempDir(), NumBlocks: 64}, Deps{Deps: component.Deps{Registerer: prometheus.NewRegistry()}})
	if err != nil {
		f.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { w.Shutdown(context.Background()) })
	seed, _ := proto.Marshal(&cbv1.PullKVRequest{RequestId: "r", Source: "127.0.0.1:1", Secret: secret, BlockTable: blocks(3, 3), FromBlock: 1, NTokens: 40, Tokens: make([]int32, 40)})
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req cbv1.PullKVRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		if w.checkPull(&req) != nil {
			return
		}
		bt, n := req.GetBlockTable(), int(req.GetNTokens())
		if n < 1 || n > smallModel.MaxPositions || len(bt) != (n+15)/16 || int(req.GetFromBlock()) > len(bt) || req.GetFromBlock() < 0 {
			t.Fatalf("accepted %v", &req)
		}
		seen := map[int32]bool{}
		for _, x := range bt {
			if x < 0 || x >= 64 || seen[x] {
				t.Fatalf("accepted block table %v", bt)
			}
			seen[x] = true
		}
		// Every message size the pull would accept fits the table.
		l := w.kv.Layout()
		if got := chunkBytes(l, 0, len(bt), n); got != n*int(l.TokenBytes()) {
			t.Fatalf("chunk bytes %d for %d tokens", got, n)
		}
	})
}

// TestPullRefusesOtherTokens replays a forged hand-over at the workers: the
// decode worker pulls prompt A's keep (its id and secret, captured) for the
// tokens of another prompt B. The keeper's block hashes are A's, so the
// pull is refused (PermissionDenied) before anything is written, the
// refusal is counted (cb_handoff_refused_total{reason="block_mismatch"}),
// and the decode worker's blocks keep what they held. The same keep pulled
// for its own tokens is taken, whole and from a later block.
func TestPullRefusesOtherTokens(t *testing.T) {
	a, b := start(t, Config{}), start(t, Config{})
	pa, pb := prompt(100), otherPrompt(100)
	for _, tc := range []struct {
		name   string
		tokens []int32 // the tokens the decode engine pulls for
		from   int
		ok     bool
	}{
		{"other prompt", pb, 0, false},
		{"other prompt from block 3", pb, 3, false},
		{"one token differs in the partial block", append(slices.Clone(pa[:99]), pa[99]+1), 0, false},
		{"own prompt", pa, 0, true},
		{"own prompt from block 3", pa, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "forged-" + tc.name
			prefillFor(t, a, id, pa, blocks(0, 7), nil)
			bt := blocks(20, 7)
			// The decode worker's blocks hold B's KV: a refused pull leaves it.
			generate(t, b, "victim-"+tc.name, pb, len(pb), 1, bt)
			before := packBlocks(b.w.kv, bt, 0, 7, len(pb))
			_, err := b.client.PullKV(context.Background(), &cbv1.PullKVRequest{RequestId: id, Source: a.w.Addr(), Secret: secret,
				BlockTable: bt, FromBlock: int32(tc.from), NTokens: int32(len(tc.tokens)), Tokens: tc.tokens})
			after := packBlocks(b.w.kv, bt, 0, 7, len(pb))
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				if bytes.Equal(before[len(before)/2:], after[len(after)/2:]) {
					t.Fatal("a pull for the keep's own tokens wrote nothing")
				}
			} else {
				if status.Code(err) != codes.PermissionDenied {
					t.Fatalf("pull for other tokens: %v, want PermissionDenied", err)
				}
				if !bytes.Equal(before, after) {
					t.Fatal("a refused pull wrote into the decode worker's blocks")
				}
			}
			if _, err := b.client.Execute(context.Background(), &cbv1.ExecuteRequest{FinishedRequestIds: []string{id, "victim-" + tc.name}}); err != nil {
				t.Fatal(err)
			}
		})
	}
	if v := counterValue(t, b.reg, "cb_handoff_refused_total", "reason", "block_mismatch"); v != 3 {
		t.Errorf("block_mismatch refusals counted %v, want 3", v)
	}
}

// counterValue reads one counter series from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// TestHandOverTraceState: the decode engine's trace context and W3C
// tracestate (PullKVRequest.trace_state) reach kv.receive on the decode
// worker and, through ReadKVRequest.trace_state, kv.send on the prefill
// worker: the caller's vendor entries are on every span of a hand-over.
func TestHandOverTraceState(t *testing.T) {
	a, b := start(t, Config{}), start(t, Config{})
	p := prompt(40)
	prefillFor(t, a, "ts", p, blocks(0, 3), nil)
	const (
		tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		ts = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
	)
	if _, err := b.client.PullKV(context.Background(), &cbv1.PullKVRequest{RequestId: "ts", Source: a.w.Addr(), Secret: secret,
		BlockTable: blocks(5, 3), NTokens: 40, Tokens: p, TraceContext: tp, TraceState: ts}); err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, s := range append(a.rec.Ended(), b.rec.Ended()...) {
		if s.Name() == spanname.KVSend || s.Name() == spanname.KVReceive {
			found[s.Name()] = s.SpanContext().TraceState().String()
			if got := s.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
				t.Errorf("%s in trace %s", s.Name(), got)
			}
		}
	}
	for _, name := range []string{spanname.KVReceive, spanname.KVSend} {
		if found[name] != ts {
			t.Errorf("%s tracestate %q, want %q", name, found[name], ts)
		}
	}
}
