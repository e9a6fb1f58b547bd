package enginetest

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// EOS is the end-of-sequence id the worker double reports in Info.
const EOS = 257

// Next is the double's deterministic "model": the next token of a sequence.
func Next(seq []int32) int32 {
	h := uint32(2166136261)
	for _, t := range seq {
		h ^= uint32(t)
		h *= 16777619
	}
	return int32(h % 256)
}

// Reference generates n tokens after prompt, the uninterrupted way.
func Reference(prompt []int32, n int) []int32 {
	seq := slices.Clone(prompt)
	for range n {
		seq = append(seq, Next(seq))
	}
	return seq[len(prompt):]
}

// Worker is the cb-worker double. Configure its exported fields before
// serving; read its records through the methods. Safe for concurrent use.
type Worker struct {
	cbv1.UnimplementedWorkerServiceServer

	// Info fields.
	NumBlocks, BlockSize, MaxPositions int32
	// NumLayers is the model depth Info reports; 0 reports 2.
	NumLayers int32
	// ModelIdentity is the model file identity Info reports ("": the
	// built-in model); an engine with another refuses to pair.
	ModelIdentity string
	// EOSAtLen, when > 0, makes the token sampled at sequence length
	// EOSAtLen be EOS.
	EOSAtLen int
	// StoreDelaySteps delays the report of a store by that many further
	// steps (0: reported in the step's own response).
	StoreDelaySteps int
	// ReportNoLoad makes the double report (SeqOutput.reused_tokens) that
	// its forward took nothing of a step's plan as loaded, like a worker
	// whose retrieve failed.
	ReportNoLoad bool

	mu        sync.Mutex
	slots     map[int]int32
	state     map[string][]int32 // request -> prompt tokens
	steps     []*cbv1.ExecuteRequest
	pending   map[string]int // request -> steps left before its store report
	stored    []string
	failNext  error
	infoErr   error
	gate      chan struct{} // when set, Execute waits for a value
	infoCalls int
	keeps     map[string]keep // hand-overs kept (HandoffSecret)
	sources   map[string]*Worker
	pullHook  func(ctx context.Context) error
	released  []string   // keeps ended, for the next response
	finished  [][]string // finished ids of every step
}

// keep is a hand-over the double keeps: the prompt's block table and
// length.
type keep struct {
	bt []int32
	n  int
}

// NewWorker returns a worker double with a pool of numBlocks blocks of
// blockSize tokens and maxPositions positions.
func NewWorker(numBlocks, blockSize, maxPositions int32) *Worker {
	return &Worker{NumBlocks: numBlocks, BlockSize: blockSize, MaxPositions: maxPositions,
		slots: map[int]int32{}, state: map[string][]int32{}, pending: map[string]int{}, keeps: map[string]keep{}}
}

// Info implements cbv1.WorkerServiceServer.
func (w *Worker) Info(context.Context, *cbv1.InfoRequest) (*cbv1.InfoResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.infoCalls++
	if w.infoErr != nil {
		return nil, w.infoErr
	}
	return &cbv1.InfoResponse{Model: "double", Vocab: 258, MaxPositions: w.MaxPositions, NumBlocks: w.NumBlocks,
		BlockSize: w.BlockSize, Bos: 256, Eos: EOS, NumLayers: cmp.Or(w.NumLayers, 2), WorkerId: "w0",
		ModelIdentity: w.ModelIdentity, ModelFileName: "double"}, nil
}

// SetInfoError makes Info fail with err (nil: succeed).
func (w *Worker) SetInfoError(err error) {
	w.mu.Lock()
	w.infoErr = err
	w.mu.Unlock()
}

// FailNextExecute makes the next Execute fail with err.
func (w *Worker) FailNextExecute(err error) {
	w.mu.Lock()
	w.failNext = err
	w.mu.Unlock()
}

// Gate makes every Execute wait for a value on the returned channel (or its
// context's end). Call before serving steps.
func (w *Worker) Gate() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gate = make(chan struct{})
	return w.gate
}

// Steps returns copies of the Execute requests received so far.
func (w *Worker) Steps() []*cbv1.ExecuteRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*cbv1.ExecuteRequest, len(w.steps))
	for i, s := range w.steps {
		out[i] = proto.Clone(s).(*cbv1.ExecuteRequest)
	}
	return out
}

// SeqSteps returns the steps of one request, in order.
func (w *Worker) SeqSteps(id string) []*cbv1.SeqStep {
	var out []*cbv1.SeqStep
	for _, st := range w.Steps() {
		for _, s := range st.GetSeqs() {
			if s.GetRequestId() == id {
				out = append(out, s)
			}
		}
	}
	return out
}

// Stored returns the ids whose store was reported done.
func (w *Worker) Stored() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.stored)
}

// Execute implements cbv1.WorkerServiceServer.
func (w *Worker) Execute(ctx context.Context, req *cbv1.ExecuteRequest) (*cbv1.ExecuteResponse, error) {
	w.mu.Lock()
	gate := w.gate
	w.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.steps = append(w.steps, proto.Clone(req).(*cbv1.ExecuteRequest))
	if err := w.failNext; err != nil {
		w.failNext = nil
		return nil, err
	}
	resp := &cbv1.ExecuteResponse{}
	for id, left := range w.pending {
		if left <= 0 {
			resp.StoredRequestIds = append(resp.StoredRequestIds, id)
			w.stored = append(w.stored, id)
			delete(w.pending, id)
		} else {
			w.pending[id] = left - 1
		}
	}
	for _, id := range req.GetFinishedRequestIds() {
		delete(w.state, id)
		if _, ok := w.keeps[id]; ok {
			delete(w.keeps, id)
			w.released = append(w.released, id)
		}
	}
	w.finished = append(w.finished, slices.Clone(req.GetFinishedRequestIds()))
	for _, s := range req.GetSeqs() {
		out := w.step(s)
		resp.Outputs = append(resp.Outputs, out)
		if s.GetStore() && out.GetError() == "" {
			if w.StoreDelaySteps == 0 {
				resp.StoredRequestIds = append(resp.StoredRequestIds, s.GetRequestId())
				w.stored = append(w.stored, s.GetRequestId())
			} else {
				w.pending[s.GetRequestId()] = w.StoreDelaySteps - 1
			}
		}
		if len(s.GetHandoffSecret()) > 0 && out.GetHasToken() {
			w.keeps[s.GetRequestId()] = keep{bt: slices.Clone(s.GetBlockTable()), n: len(w.state[s.GetRequestId()])}
			delete(w.state, s.GetRequestId())
		}
	}
	resp.HandoffReleasedIds, w.released = w.released, nil
	return resp, nil
}

// Kept reports whether the double keeps the KV of request id for a
// hand-over.
func (w *Worker) Kept(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.keeps[id]
	return ok
}

// AddSource makes addr (a PullKV source address) name the double src.
func (w *Worker) AddSource(addr string, src *Worker) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sources == nil {
		w.sources = map[string]*Worker{}
	}
	w.sources[addr] = src
}

// SetPullHook makes PullKV call hook first and fail with its error.
func (w *Worker) SetPullHook(hook func(ctx context.Context) error) {
	w.mu.Lock()
	w.pullHook = hook
	w.mu.Unlock()
}

// PullKV implements cbv1.WorkerServiceServer: it copies the kept KV of
// the source double (AddSource) with CopyKV; 4 bytes per position.
func (w *Worker) PullKV(ctx context.Context, req *cbv1.PullKVRequest) (*cbv1.PullKVResponse, error) {
	w.mu.Lock()
	src, hook := w.sources[req.GetSource()], w.pullHook
	w.mu.Unlock()
	if hook != nil {
		if err := hook(ctx); err != nil {
			return nil, err
		}
	}
	if src == nil {
		return nil, status.Errorf(codes.Unavailable, "no worker at %s", req.GetSource())
	}
	n, err := w.CopyKV(src, req.GetRequestId(), req.GetBlockTable(), int(req.GetFromBlock()))
	if err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	return &cbv1.PullKVResponse{Bytes: int64(n) * 4, Blocks: int32(len(req.GetBlockTable()) - int(req.GetFromBlock()))}, nil
}

// Finished returns every finished request id the steps carried.
func (w *Worker) Finished() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Concat(w.finished...)
}

// CopyKV is a hand-over's pull: it copies the positions of the kept
// prompt of request id in src from block from on into dst's blocks bt,
// releases the keep (reported in src's next response) and returns the
// positions copied. It fails when src keeps nothing for id.
func (w *Worker) CopyKV(src *Worker, id string, bt []int32, from int) (int, error) {
	src.mu.Lock()
	k, ok := src.keeps[id]
	vals := map[int]int32{}
	if ok {
		for pos := from * int(src.BlockSize); pos < k.n; pos++ {
			sl, ok := src.slot(k.bt, pos)
			if !ok {
				break
			}
			vals[pos] = src.slots[sl]
		}
		delete(src.keeps, id)
		src.released = append(src.released, id)
	}
	src.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("no KV kept for %s", id)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for pos, t := range vals {
		sl, ok := w.slot(bt, pos)
		if !ok {
			return 0, fmt.Errorf("position %d has no block", pos)
		}
		w.slots[sl] = t
	}
	return len(vals), nil
}

func (w *Worker) slot(bt []int32, pos int) (int, bool) {
	b := pos / int(w.BlockSize)
	if b >= len(bt) || bt[b] < 0 || bt[b] >= w.NumBlocks {
		return 0, false
	}
	return int(bt[b])*int(w.BlockSize) + pos%int(w.BlockSize), true
}

func (w *Worker) step(s *cbv1.SeqStep) *cbv1.SeqOutput {
	id := s.GetRequestId()
	out := &cbv1.SeqOutput{RequestId: id}
	fail := func(format string, args ...any) *cbv1.SeqOutput {
		out.Error = fmt.Sprintf(format, args...)
		return out
	}
	if len(s.GetPromptTokens()) > 0 {
		w.state[id] = slices.Clone(s.GetPromptTokens())
	}
	prompt, ok := w.state[id]
	if !ok {
		return fail("no state for request %s (prompt_tokens never sent)", id)
	}
	bt := s.GetBlockTable()
	start := int(s.GetStartPos())
	// Retrieve: matched tokens are those of the current prompt (the stored
	// sequence had the same tokens there).
	for _, m := range s.GetCbPlan().GetMatches() {
		for pos := int(m.GetCurSt()); pos < int(m.GetCurEd()) && pos < len(prompt); pos++ {
			if sl, ok := w.slot(bt, pos); ok {
				w.slots[sl] = prompt[pos]
			}
		}
	}
	for i, t := range s.GetTokens() {
		sl, ok := w.slot(bt, start+i)
		if !ok {
			return fail("position %d has no block", start+i)
		}
		w.slots[sl] = t
	}
	end := start + len(s.GetTokens())
	if !s.GetSample() {
		return out
	}
	seq := make([]int32, end)
	for pos := range end {
		sl, ok := w.slot(bt, pos)
		if !ok {
			return fail("position %d has no block", pos)
		}
		t, ok := w.slots[sl]
		if !ok {
			return fail("position %d was never computed", pos)
		}
		seq[pos] = t
	}
	out.HasToken = true
	out.Token = Next(seq)
	if plan := s.GetCbPlan(); plan != nil && !w.ReportNoLoad {
		// Like the worker's blended forward: the skipped prefix plus the
		// loaded positions computed from there.
		out.ReusedTokens = int32(start)
		for _, m := range plan.GetMatches() {
			out.ReusedTokens += int32(max(0, min(int(m.GetCurEd()), end)-max(int(m.GetCurSt()), start)))
		}
	}
	if w.EOSAtLen > 0 && end+1 == w.EOSAtLen {
		out.Token = EOS
	}
	return out
}

// Blend is the cb-blend double: Lookup, FleetStatus and StoreStatus. A lookup answers at once with
// Result's result, or Err's error, unless its request id is held (Hold),
// in which case it waits for Release or the caller's deadline. Safe for
// concurrent use once serving; set the fields before.
type Blend struct {
	cbv1.UnimplementedBlendServiceServer

	// Result computes a lookup's result from its tokens; nil: no hit.
	Result func(tokens []int32) *cbv1.LookupResult
	// Err, when set and returning non-nil, fails the lookup with that error.
	Err func(r *cbv1.LookupRequest) error
	// Hold lists the request ids whose lookups wait for Release.
	Hold []string
	// Fleet, when set, gives the fleet state of each document request id
	// (BlendService.FleetStatus); nil: a blend server without a fleet tier.
	Fleet func(id string) string
	// Stores, when set, answers BlendService.StoreStatus (where the stored
	// documents' chunks are held: one StoreState per request id, in
	// order, "stored", "memory_only", "failed" or "unknown"; or an error,
	// e.g. codes.Unimplemented for a blend server older than the RPC).
	// nil: every store durable, each id "stored", on a server without an
	// L2.
	Stores func(r *cbv1.StoreStatusRequest) (*cbv1.StoreStatusResponse, error)

	mu       sync.Mutex
	lookups  []*cbv1.LookupRequest
	released map[string]chan struct{}
}

// FleetStatus answers from Fleet.
func (b *Blend) FleetStatus(_ context.Context, r *cbv1.FleetStatusRequest) (*cbv1.FleetStatusResponse, error) {
	if b.Fleet == nil {
		return &cbv1.FleetStatusResponse{}, nil
	}
	resp := &cbv1.FleetStatusResponse{Fleet: true}
	for _, id := range r.GetRequestIds() {
		resp.States = append(resp.States, b.Fleet(id))
	}
	return resp, nil
}

// StoreStatus answers from Stores (nil: every id "stored").
func (b *Blend) StoreStatus(_ context.Context, r *cbv1.StoreStatusRequest) (*cbv1.StoreStatusResponse, error) {
	if b.Stores != nil {
		return b.Stores(r)
	}
	resp := &cbv1.StoreStatusResponse{}
	for range r.GetRequestIds() {
		resp.States = append(resp.States, &cbv1.StoreState{State: "stored"})
	}
	return resp, nil
}

func (b *Blend) gate(id string) chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !slices.Contains(b.Hold, id) {
		return nil
	}
	if b.released == nil {
		b.released = map[string]chan struct{}{}
	}
	ch, ok := b.released[id]
	if !ok {
		ch = make(chan struct{})
		b.released[id] = ch
	}
	return ch
}

// Release lets the held lookups of id (and later ones) answer.
func (b *Blend) Release(id string) {
	ch := b.gate(id)
	if ch == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// Lookup implements cbv1.BlendServiceServer.
func (b *Blend) Lookup(ctx context.Context, r *cbv1.LookupRequest) (*cbv1.LookupResult, error) {
	b.mu.Lock()
	b.lookups = append(b.lookups, proto.Clone(r).(*cbv1.LookupRequest))
	b.mu.Unlock()
	if ch := b.gate(r.GetRequestId()); ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if b.Err != nil {
		if err := b.Err(r); err != nil {
			return nil, err
		}
	}
	if b.Result != nil {
		return b.Result(r.GetTokens()), nil
	}
	return &cbv1.LookupResult{RequestedTokens: int32(len(r.GetTokens())), ChunkSize: defaults.ChunkSize}, nil
}

// Lookups returns the lookups received so far.
func (b *Blend) Lookups() []*cbv1.LookupRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.lookups)
}

// LookupsFor counts the lookups received for one request.
func (b *Blend) LookupsFor(id string) int {
	n := 0
	for _, l := range b.Lookups() {
		if l.GetRequestId() == id {
			n++
		}
	}
	return n
}

// Serve registers the services on a gRPC server listening on 127.0.0.1:0
// and returns a client connection to it; both are closed at test cleanup.
func Serve(t testing.TB, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		<-done
	})
	return conn
}

// WorkerClient serves w and returns a client of it.
func WorkerClient(t testing.TB, w *Worker) cbv1.WorkerServiceClient {
	conn := Serve(t, func(s *grpc.Server) { cbv1.RegisterWorkerServiceServer(s, w) })
	return cbv1.NewWorkerServiceClient(conn)
}

// BlendClient serves b and returns a client of it.
func BlendClient(t testing.TB, b *Blend) cbv1.BlendServiceClient {
	conn := Serve(t, func(s *grpc.Server) { cbv1.RegisterBlendServiceServer(s, b) })
	return cbv1.NewBlendServiceClient(conn)
}

// DeadBlendClient returns a blend client whose server is not running (a
// port that was listened on, then closed): every call fails Unavailable.
func DeadBlendClient(t testing.TB) cbv1.BlendServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return cbv1.NewBlendServiceClient(conn)
}

// InfoCalls is the number of Info calls the double has answered or failed.
func (w *Worker) InfoCalls() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.infoCalls
}
