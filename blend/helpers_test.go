package blend

import (
	"github.com/cacheblend/cacheblend/telemetry/provider"

	"context"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rope"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/kvsock"
)

func TestMain(m *testing.M) {
	if path := os.Getenv("CB_KVSOCK_CHILD"); path != "" {
		kvsockPeer(path) // a child process of TestKVSocketRefusesAnotherUser
		return
	}
	goleak.VerifyTestMain(m)
}

const (
	testModel = "m-test"
	theta     = 10000.0
	bs        = 16
)

var testLayout = kvcache.Layout{NumLayers: 2, NumBlocks: 160, BlockSize: bs, KVHeads: 2, HeadDim: 8}

// sentinel marks slots nobody wrote.
const sentinel = float32(-7777)

type env struct {
	t    testing.TB
	s    *Server
	c    cbv1.BlendServiceClient // fills in the registration token of workers registered by the env
	raw  cbv1.BlendServiceClient // sends requests as they are
	reg  *prometheus.Registry
	exp  *tracetest.InMemoryExporter
	tp   *sdktrace.TracerProvider
	rope *rope.RoPE

	tmu    sync.Mutex
	tokens map[workerKey][]byte // of the registrations made by register
}

// newEnv starts a server for cfg (before-start hooks applied) served over
// real gRPC on a loopback port and its KV socket, with an in-memory span
// exporter.
func newEnv(t testing.TB, cfg Config, hooks ...func(*Server)) *env {
	t.Helper()
	e := &env{t: t, reg: prometheus.NewRegistry(), exp: tracetest.NewInMemoryExporter(), rope: rope.New(testLayout.HeadDim, theta),
		tokens: map[workerKey][]byte{}}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(e.exp), sdktrace.WithIDGenerator(provider.NewIDGenerator(nil)))
	s, err := New(cfg, component.Deps{TracerProvider: e.tp, Registerer: e.reg})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		h(s)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(e.addToken))
	if err != nil {
		t.Fatal(err)
	}
	rawConn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.s, e.c, e.raw = s, cbv1.NewBlendServiceClient(conn), cbv1.NewBlendServiceClient(rawConn)
	t.Cleanup(func() {
		conn.Close()
		rawConn.Close()
		e.shutdown()
		e.tp.Shutdown(context.Background())
	})
	return e
}

// addToken is e.c's interceptor: a Retrieve, Store or UnregisterKV without
// a token gets the token of the env's registration of its worker and rank,
// so the tests of the data path need not carry it; the attack tests use
// e.raw.
func (e *env) addToken(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	e.tmu.Lock()
	switch r := req.(type) {
	case *cbv1.RetrieveRequest:
		if r.RegistrationToken == nil {
			r.RegistrationToken = e.tokens[workerKey{r.GetWorkerId(), int(r.GetRank())}]
		}
	case *cbv1.StoreRequest:
		if r.RegistrationToken == nil {
			r.RegistrationToken = e.tokens[workerKey{r.GetWorkerId(), int(r.GetRank())}]
		}
	case *cbv1.UnregisterKVRequest:
		if r.RegistrationToken == nil {
			r.RegistrationToken = e.tokens[workerKey{r.GetWorkerId(), int(r.GetRank())}]
		}
	}
	e.tmu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// shutdown stops the server, which drains the event bus into the
// subscribers (spans, metrics).
func (e *env) shutdown() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.s.Shutdown(ctx); err != nil {
		e.t.Errorf("shutdown: %v", err)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newWorker creates a worker-like KV memory filled with the sentinel and
// registers it on the KV socket.
func (e *env) newWorker(id string, rank int) *kvcache.Memory {
	e.t.Helper()
	mem := newMem(e.t)
	e.register(id, rank, mem)
	return mem
}

// register registers mem on the server's KV socket as (id, rank), as a
// worker does, and records the token for e.c. The registration lives until
// the returned connection closes (at the test's end at the latest).
func (e *env) register(id string, rank int, mem *kvcache.Memory) (*kvsock.Conn, []byte) {
	e.t.Helper()
	return e.registerRank(id, rank, 0, mem)
}

// registerRank is register for rank of a tensor-parallel group of world
// ranks (0: a whole-model worker).
func (e *env) registerRank(id string, rank, world int, mem *kvcache.Memory) (*kvsock.Conn, []byte) {
	e.t.Helper()
	reg := registration(id, rank, mem.Layout())
	reg.WorldSize = int32(world)
	c, ans, err := kvsock.Register(ctxT(e.t), e.s.KVSocket(), reg, mem.File())
	if err != nil {
		e.t.Fatalf("register %s/%d: %v", id, rank, err)
	}
	e.t.Cleanup(func() { c.Close() })
	tok := ans.GetRegistrationToken()
	if len(tok) != TokenBytes {
		e.t.Fatalf("token of %d bytes", len(tok))
	}
	e.tmu.Lock()
	e.tokens[workerKey{id, rank}] = tok
	e.tmu.Unlock()
	return c, tok
}

func newMem(t testing.TB) *kvcache.Memory {
	t.Helper()
	mem, err := kvcache.Create(t.TempDir(), testLayout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	fillSentinel(mem)
	return mem
}

func registration(id string, rank int, l kvcache.Layout) *cbv1.KVRegistration {
	return &cbv1.KVRegistration{
		WorkerId: id, Rank: int32(rank), Model: testModel,
		Layout: &cbv1.KVLayout{NumLayers: int32(l.NumLayers), NumBlocks: int32(l.NumBlocks), BlockSize: int32(l.BlockSize),
			KvHeads: int32(l.KVHeads), HeadDim: int32(l.HeadDim), RopeTheta: theta, Dtype: l.DType.String()},
	}
}

func fillSentinel(mem *kvcache.Memory) {
	for layer := range mem.Layout().NumLayers {
		for _, p := range [][]float32{mem.K(layer), mem.V(layer)} {
			for i := range p {
				p[i] = sentinel
			}
		}
	}
}

// rawK and rawV are the deterministic pre-RoPE K and the V of token i of
// sequence seq.
func rawK(seq, i, layer, f int) float32 {
	return float32(math.Sin(float64(seq*1_000_003+i*131+layer*17+f) * 0.37))
}

func rawV(seq, i, layer, f int) float32 {
	return float32(math.Cos(float64(seq*999_983+i*71+layer*29+f) * 0.53))
}

// wantK is rawK rotated at position pos.
func (e *env) wantK(seq, i, layer, pos int) []float32 {
	k := make([]float32, testLayout.TokenFloats())
	for f := range k {
		k[f] = rawK(seq, i, layer, f)
	}
	e.rope.RotateHeads(k, pos)
	return k
}

// prefill writes sequence seq's KV for n tokens at positions 0..n-1
// through bt, as a worker's prefill would: K = RotateHeads(raw, pos).
func (e *env) prefill(mem *kvcache.Memory, bt []int32, seq, n int) {
	for i := range n {
		slot := int(bt[i/bs])*bs + i%bs
		for layer := range testLayout.NumLayers {
			copy(mem.TokenK(layer, slot), e.wantK(seq, i, layer, i))
			v := mem.TokenV(layer, slot)
			for f := range v {
				v[f] = rawV(seq, i, layer, f)
			}
		}
	}
}

// blocks returns n block ids starting at first, in order.
func blocks(first, n int) []int32 {
	bt := make([]int32, n)
	for i := range bt {
		bt[i] = int32(first + i)
	}
	return bt
}

// tokens returns n random tokens in [lo, lo+span).
func tokens(r *rand.Rand, n int, lo, span int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = lo + r.Int32N(span)
	}
	return out
}

// waitRegistrations returns once the registration goroutine has handled
// everything queued before the call.
func (s *Server) waitRegistrations(t testing.TB) {
	t.Helper()
	b := make(chan struct{})
	s.chunks.regQ <- func() { close(b) }
	select {
	case <-b:
	case <-time.After(20 * time.Second):
		t.Fatal("registrations not processed")
	}
}

// lookup runs a lookup and returns its result.
func (e *env) lookup(req *cbv1.LookupRequest) *cbv1.LookupResult {
	e.t.Helper()
	res, err := e.c.Lookup(ctxT(e.t), req)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

// gather returns the registry's metric families by name.
func (e *env) gather() map[string]*dto.MetricFamily {
	e.t.Helper()
	fams, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	out := make(map[string]*dto.MetricFamily, len(fams))
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// value is the value of the counter or gauge series name{labels}; -1 when
// absent.
func (e *env) value(name string, labels map[string]string) float64 {
	e.t.Helper()
	f := e.gather()[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
				continue next
			}
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}
