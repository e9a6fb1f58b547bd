package worker

import (
	"cmp"
	"context"
	"crypto/subtle"

	"errors"
	"fmt"
	"io"

	"net"
	"slices"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

// Prefill/decode hand-over, the worker's two sides (docs/design.md §9).
//
// Prefill side: the step that samples a handed-over request's first token
// carries handoff_secret; the worker then keeps the prompt's block table
// (a keep) for one ReadKV under that secret, and reports the keep's end in
// ExecuteResponse.handoff_released_ids so that the engine frees the blocks.
//
// Decode side: PullKV (from the decode engine) reads the blocks from the
// prefill worker's ReadKV, worker to worker, into the blocks the decode
// engine allocated. A pull whose request id appears in an Execute's
// finished_request_ids is stopped, and the step waits until it has
// stopped writing, before the step's sequences run.

// Hand-over limits and defaults.
const (
	// SecretBytes is the length of a hand-over's secret.
	SecretBytes = 32
	// DefaultKeepTimeout is how long a kept hand-over waits for its read.
	DefaultKeepTimeout = 30 * time.Second
	// DefaultMaxKeeps bounds the hand-overs a prefill worker keeps at once.
	DefaultMaxKeeps = 256
	// DefaultMaxPulls bounds the pulls a decode worker runs at once.
	DefaultMaxPulls = 8
	// DefaultPullTimeout bounds one pull.
	DefaultPullTimeout = 60 * time.Second
	// maxChunkBytes bounds the data of one KVBlocks message (at least one
	// block is always sent).
	maxChunkBytes = 1 << 20
	// maxSourceLen bounds a pull's source address.
	maxSourceLen = 255
	// maxPeerConns bounds the connections to other workers kept open.
	maxPeerConns = 16
)

// keep is a handed-over prompt's KV kept for its read. Guarded by
// Worker.hoMu.
type keep struct {
	secret   []byte
	bt       []int32
	nTokens  int
	hashes   []kvcache.BlockHash // per block of bt: the chain hash of the prompt tokens it holds
	deadline time.Time
	reading  bool
	cancel   context.CancelFunc // of the read in progress
	done     chan struct{}      // closed when the read in progress ends
}

// pull is a pull in progress. Guarded by Worker.hoMu.
type pull struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the pull stopped writing
}

// handoffs is the worker's hand-over state.
type handoffs struct {
	mu       sync.Mutex
	keeps    map[string]*keep
	pulls    map[string]*pull
	released []string // keeps ended since the last Execute response
	peers    map[string]*grpc.ClientConn
	closed   bool
	refused  *metrics.HandoffSecurityMetrics // pulls refused (block_mismatch)
}

func newHandoffs(refused *metrics.HandoffSecurityMetrics) *handoffs {
	return &handoffs{keeps: map[string]*keep{}, pulls: map[string]*pull{}, peers: map[string]*grpc.ClientConn{}, refused: refused}
}

// blockHashes returns the chain hash (kvcache.HashBlock) of every block of
// a prompt of tokens in blocks of blockSize, the last, partial block
// included: equal hashes at block i mean equal tokens up to its end.
func blockHashes(tokens []int32, blockSize int) []kvcache.BlockHash {
	out := kvcache.ChainHashes(make([]kvcache.BlockHash, 0, (len(tokens)+blockSize-1)/blockSize), tokens, blockSize)
	if tail := len(tokens) % blockSize; tail > 0 {
		var parent kvcache.BlockHash
		if len(out) > 0 {
			parent = out[len(out)-1]
		}
		out = append(out, kvcache.HashBlock(parent, tokens[len(tokens)-tail:]))
	}
	return out
}

// gauges publishes the hand-over counts; called with mu held.
func (w *Worker) gauges() {
	w.metrics.SetKVHandoffs(metrics.HandoffKept, len(w.ho.keeps))
	w.metrics.SetKVHandoffs(metrics.HandoffPulling, len(w.ho.pulls))
}

// keepKV keeps the prompt's KV of request id (its block table bt, the
// prompt's tokens) for one read with secret. It fails when MaxKeeps are
// kept.
func (w *Worker) keepKV(id string, secret []byte, bt []int32, prompt []int32) error {
	if len(secret) != SecretBytes {
		return fmt.Errorf("handoff_secret of %d bytes, want %d", len(secret), SecretBytes)
	}
	ho := w.ho
	ho.mu.Lock()
	defer ho.mu.Unlock()
	w.expireKeepsLocked(time.Now())
	if _, dup := ho.keeps[id]; dup {
		return fmt.Errorf("request %s is already kept for a hand-over", id)
	}
	if len(ho.keeps) >= w.cfg.MaxKeeps {
		return fmt.Errorf("%d hand-overs kept already (the limit)", len(ho.keeps))
	}
	ho.keeps[id] = &keep{secret: slices.Clone(secret), bt: slices.Clone(bt), nTokens: len(prompt),
		hashes: blockHashes(prompt, w.cfg.BlockSize), deadline: time.Now().Add(w.cfg.KeepTimeout)}
	w.gauges()
	return nil
}

// expireKeepsLocked releases the keeps past their deadline that no read
// holds (a read stops itself at the deadline).
func (w *Worker) expireKeepsLocked(now time.Time) {
	for id, k := range w.ho.keeps {
		if !k.reading && !now.Before(k.deadline) {
			delete(w.ho.keeps, id)
			w.ho.released = append(w.ho.released, id)
		}
	}
	w.gauges()
}

// takeReleased returns the keeps ended since the last call (expired ones
// included).
func (w *Worker) takeReleased() []string {
	ho := w.ho
	ho.mu.Lock()
	defer ho.mu.Unlock()
	w.expireKeepsLocked(time.Now())
	out := ho.released
	ho.released = nil
	return out
}

// stopHandoffs ends the keeps and stops the pulls of the finished ids, and
// returns once no read or pull of them runs: their blocks may be reused.
func (w *Worker) stopHandoffs(ids []string) {
	ho := w.ho
	var waits []chan struct{}
	ho.mu.Lock()
	for _, id := range ids {
		if p := ho.pulls[id]; p != nil {
			p.cancel()
			waits = append(waits, p.done)
		}
		if k := ho.keeps[id]; k != nil {
			if k.reading {
				k.cancel()
				waits = append(waits, k.done)
			} else {
				delete(ho.keeps, id)
				ho.released = append(ho.released, id)
			}
		}
	}
	w.gauges()
	ho.mu.Unlock()
	for _, c := range waits {
		<-c
	}
}

// closeHandoffs stops every read and pull and closes the connections to
// other workers (Shutdown).
func (w *Worker) closeHandoffs() {
	ho := w.ho
	var waits []chan struct{}
	ho.mu.Lock()
	ho.closed = true
	for _, p := range ho.pulls {
		p.cancel()
		waits = append(waits, p.done)
	}
	for _, k := range ho.keeps {
		if k.reading {
			k.cancel()
			waits = append(waits, k.done)
		}
	}
	peers := ho.peers
	ho.peers = map[string]*grpc.ClientConn{}
	ho.mu.Unlock()
	for _, c := range waits {
		<-c
	}
	for _, c := range peers {
		c.Close()
	}
}

// kvService serves KVTransferService.
type kvService struct {
	cbv1.UnimplementedKVTransferServiceServer
	w *Worker
}

// checkLayout compares a reader's layout and model with the worker's.
func (w *Worker) checkLayout(l *cbv1.KVLayout, model string) error {
	mine := w.kv.Layout()
	if model != w.kvModel {
		return fmt.Errorf("model %q, this worker serves %q", model, w.kvModel)
	}
	if int(l.GetNumLayers()) != mine.NumLayers || int(l.GetBlockSize()) != mine.BlockSize ||
		int(l.GetKvHeads()) != mine.KVHeads || int(l.GetHeadDim()) != mine.HeadDim {
		return fmt.Errorf("KV layout %d layers × %d-token blocks × %d heads × %d, this worker's is %d × %d × %d × %d",
			l.GetNumLayers(), l.GetBlockSize(), l.GetKvHeads(), l.GetHeadDim(), mine.NumLayers, mine.BlockSize, mine.KVHeads, mine.HeadDim)
	}
	// The blocks travel as stored: both pools must hold one element type.
	if dt, err := kvcache.ParseDType(cmp.Or(l.GetDtype(), "f32")); err != nil || dt != mine.DType {
		return fmt.Errorf("KV element type %q, this worker's is %v", l.GetDtype(), mine.DType)
	}
	return nil
}

// layoutProto is the worker's KV layout as sent in ReadKV.
func (w *Worker) layoutProto() *cbv1.KVLayout {
	l := w.kv.Layout()
	return &cbv1.KVLayout{NumLayers: int32(l.NumLayers), NumBlocks: int32(l.NumBlocks), BlockSize: int32(l.BlockSize),
		KvHeads: int32(l.KVHeads), HeadDim: int32(l.HeadDim), Dtype: l.DType.String()}
}

// ReadKV streams a kept request's blocks to another worker (prefill side).
func (s *kvService) ReadKV(req *cbv1.ReadKVRequest, stream grpc.ServerStreamingServer[cbv1.KVBlocks]) error {
	w := s.w
	id := req.GetRequestId()
	switch {
	case id == "" || len(id) > maxRequestID:
		return status.Errorf(codes.InvalidArgument, "read: request_id of %d bytes", len(id))
	case len(req.GetSecret()) != SecretBytes:
		return status.Errorf(codes.InvalidArgument, "read: secret of %d bytes, want %d", len(req.GetSecret()), SecretBytes)
	case req.GetFromBlock() < 0 || req.GetNTokens() < 1:
		return status.Errorf(codes.InvalidArgument, "read: from_block %d, n_tokens %d", req.GetFromBlock(), req.GetNTokens())
	}
	if err := w.checkLayout(req.GetLayout(), req.GetModel()); err != nil {
		return status.Errorf(codes.FailedPrecondition, "read: %v", err)
	}
	ho := w.ho
	ho.mu.Lock()
	k := ho.keeps[id]
	var err error
	switch {
	case ho.closed:
		err = status.Error(codes.Unavailable, "read: the worker is shutting down")
	case k == nil || !time.Now().Before(k.deadline) && !k.reading:
		err = status.Errorf(codes.NotFound, "read: no KV kept for request %s (never handed over, already read, or expired)", id)
	case subtle.ConstantTimeCompare(k.secret, req.GetSecret()) != 1:
		err = status.Errorf(codes.PermissionDenied, "read: wrong secret for request %s", id)
	case k.reading:
		err = status.Errorf(codes.FailedPrecondition, "read: request %s is being read already", id)
	case int(req.GetNTokens()) != k.nTokens:
		err = status.Errorf(codes.InvalidArgument, "read: n_tokens %d, the kept prompt has %d", req.GetNTokens(), k.nTokens)
	case int(req.GetFromBlock()) > len(k.bt):
		err = status.Errorf(codes.InvalidArgument, "read: from_block %d beyond the %d kept blocks", req.GetFromBlock(), len(k.bt))
	}
	if err != nil {
		ho.mu.Unlock()
		return err
	}
	ctx, cancel := context.WithDeadline(stream.Context(), k.deadline)
	k.reading, k.cancel, k.done = true, cancel, make(chan struct{})
	ho.mu.Unlock()
	defer func() {
		cancel()
		ho.mu.Lock()
		delete(ho.keeps, id) // one read per hand-over, whatever its outcome
		ho.released = append(ho.released, id)
		w.gauges()
		close(k.done)
		ho.mu.Unlock()
	}()

	sctx := telemetry.ExtractStrings(ctx, req.GetTraceContext(), req.GetTraceState())
	_, sp := w.spans.Start(sctx, spanname.KVSend, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrRequestID.String(id), attribute.Int("from_block", int(req.GetFromBlock()))))
	bytes, blocks, err := w.sendBlocks(ctx, stream, k, int(req.GetFromBlock()))
	sp.SetAttributes(attribute.Int64("bytes", bytes), attribute.Int("blocks", blocks))
	if err != nil {
		sp.SetError("kv_send_failed", err)
	}
	sp.End()
	if err != nil && status.Code(err) == codes.Unknown {
		err = status.Errorf(codes.Aborted, "read: %v", err)
	}
	return err
}

// sendBlocks streams the kept blocks from block from on, at most
// maxChunkBytes per message and, with Config.KVSendRate, at that rate.
func (w *Worker) sendBlocks(ctx context.Context, stream grpc.ServerStreamingServer[cbv1.KVBlocks], k *keep, from int) (int64, int, error) {
	l := w.kv.Layout()
	perBlock := int(int64(l.BlockSize) * l.TokenBytes())
	batch := max(1, maxChunkBytes/perBlock)
	t0 := time.Now()
	var sent int64
	blocks := 0
	for first := from; first < len(k.bt); first += batch {
		if err := ctx.Err(); err != nil {
			return sent, blocks, status.FromContextError(err).Err()
		}
		n := min(batch, len(k.bt)-first)
		data := packBlocks(w.kv, k.bt, first, n, k.nTokens)
		hashes := make([][]byte, n)
		for i := range n {
			hashes[i] = k.hashes[first+i][:]
		}
		if err := stream.Send(&cbv1.KVBlocks{FirstBlock: int32(first), NBlocks: int32(n), Data: data, BlockHashes: hashes}); err != nil {
			return sent, blocks, err
		}
		sent += int64(len(data))
		blocks += n
		if rate := w.cfg.KVSendRate; rate > 0 {
			due := t0.Add(time.Duration(float64(sent) / float64(rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return sent, blocks, status.FromContextError(ctx.Err()).Err()
				case <-t.C:
				}
			}
		}
	}
	return sent, blocks, nil
}

// blockTokens is the number of prompt tokens in block i of a table for
// nTokens tokens.
func blockTokens(i, blockSize, nTokens int) int {
	return max(0, min(blockSize, nTokens-i*blockSize))
}

// chunkBytes is the size of a KVBlocks message's data for blocks
// [first, first+n) of a prompt of nTokens tokens.
func chunkBytes(l kvcache.Layout, first, n, nTokens int) int {
	tokens := 0
	for b := first; b < first+n; b++ {
		tokens += blockTokens(b, l.BlockSize, nTokens)
	}
	return tokens * int(l.TokenBytes())
}

// littleEndian reports whether the machine's byte order is the wire's.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// packBlocks copies blocks [first, first+n) of bt out of m: for each layer,
// K then V, for each block its tokens' vectors (values of m's element type,
// little-endian).
func packBlocks(m *kvcache.Memory, bt []int32, first, n, nTokens int) []byte {
	l := m.Layout()
	out := make([]byte, 0, chunkBytes(l, first, n, nTokens))
	rb, es := l.RowBytes(), l.DType.Size()
	for layer := range l.NumLayers {
		for _, p := range []kvcache.Plane{kvcache.Keys, kvcache.Values} {
			plane := m.Plane(layer, p)
			for b := first; b < first+n; b++ {
				slot := int(bt[b]) * l.BlockSize
				cnt := blockTokens(b, l.BlockSize, nTokens)
				out = appendLE(out, plane[slot*rb:(slot+cnt)*rb], es)
			}
		}
	}
	return out
}

// unpackBlocks writes a KVBlocks message's data (already checked to be
// chunkBytes long) into blocks [first, first+n) of bt in m.
func unpackBlocks(m *kvcache.Memory, bt []int32, first, n, nTokens int, data []byte) {
	l := m.Layout()
	rb, es := l.RowBytes(), l.DType.Size()
	off := 0
	for layer := range l.NumLayers {
		for _, p := range []kvcache.Plane{kvcache.Keys, kvcache.Values} {
			plane := m.Plane(layer, p)
			for b := first; b < first+n; b++ {
				slot := int(bt[b]) * l.BlockSize
				nb := blockTokens(b, l.BlockSize, nTokens) * rb
				copyLE(plane[slot*rb:slot*rb+nb], data[off:off+nb], es)
				off += nb
			}
		}
	}
}

// appendLE appends src, values of es bytes in the machine's order, to dst
// in little-endian order.
func appendLE(dst, src []byte, es int) []byte {
	n := len(dst)
	dst = append(dst, src...)
	if !littleEndian {
		swapBytes(dst[n:], es)
	}
	return dst
}

// copyLE copies src, little-endian values of es bytes, into dst in the
// machine's order.
func copyLE(dst, src []byte, es int) {
	copy(dst, src)
	if !littleEndian {
		swapBytes(dst[:len(src)], es)
	}
}

// swapBytes reverses the bytes of every es-byte value of b.
func swapBytes(b []byte, es int) {
	for i := 0; i+es <= len(b); i += es {
		slices.Reverse(b[i : i+es])
	}
}

// checkPull bounds every field of a PullKV request against the worker's
// layout and model before anything is sized from it.
func (w *Worker) checkPull(req *cbv1.PullKVRequest) error {
	id, src := req.GetRequestId(), req.GetSource()
	bs := w.cfg.BlockSize
	n := int(req.GetNTokens())
	bt := req.GetBlockTable()
	switch {
	case id == "" || len(id) > maxRequestID:
		return fmt.Errorf("request_id of %d bytes", len(id))
	case len(req.GetSecret()) != SecretBytes:
		return fmt.Errorf("secret of %d bytes, want %d", len(req.GetSecret()), SecretBytes)
	case n < 1 || n > w.model.Config().MaxPositions:
		return fmt.Errorf("n_tokens %d outside [1, %d]", n, w.model.Config().MaxPositions)
	case len(req.GetTokens()) != n:
		return fmt.Errorf("%d prompt tokens for n_tokens %d", len(req.GetTokens()), n)
	case len(bt) != (n+bs-1)/bs:
		return fmt.Errorf("block table of %d blocks for %d tokens, want %d", len(bt), n, (n+bs-1)/bs)
	case len(bt) > w.cfg.NumBlocks:
		return fmt.Errorf("block table of %d blocks, the pool has %d", len(bt), w.cfg.NumBlocks)
	case req.GetFromBlock() < 0 || int(req.GetFromBlock()) > len(bt):
		return fmt.Errorf("from_block %d outside [0, %d]", req.GetFromBlock(), len(bt))
	}
	if err := checkSource(src); err != nil {
		return err
	}
	seen := make(map[int32]bool, len(bt))
	for i, b := range bt {
		if b < 0 || int(b) >= w.cfg.NumBlocks {
			return fmt.Errorf("block_table[%d] = %d outside the pool of %d", i, b, w.cfg.NumBlocks)
		}
		if seen[b] {
			return fmt.Errorf("block %d twice in the block table", b)
		}
		seen[b] = true
	}
	return nil
}

// checkSource bounds a pull's source address: host:port, at most
// maxSourceLen bytes, a port 1–65535.
func checkSource(src string) error {
	if src == "" || len(src) > maxSourceLen {
		return fmt.Errorf("source address of %d bytes", len(src))
	}
	host, port, err := net.SplitHostPort(src)
	if err != nil || host == "" {
		return fmt.Errorf("source %q is not host:port", src)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("source %q: bad port", src)
	}
	return nil
}

// PullKV copies a handed-over prompt's KV from the prefill worker into the
// decode engine's blocks (decode side).
func (w *Worker) PullKV(ctx context.Context, req *cbv1.PullKVRequest) (*cbv1.PullKVResponse, error) {
	if err := w.checkPull(req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "pull: %v", err)
	}
	if w.group.world > 1 {
		return nil, status.Errorf(codes.FailedPrecondition, "pull: a tensor-parallel worker (world size %d) does not take hand-overs", w.group.world)
	}
	id := req.GetRequestId()
	if int(req.GetFromBlock()) == len(req.GetBlockTable()) {
		return &cbv1.PullKVResponse{}, nil // every block was already here
	}
	ho := w.ho
	ho.mu.Lock()
	switch {
	case ho.closed:
		ho.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "pull: the worker is shutting down")
	case ho.pulls[id] != nil:
		ho.mu.Unlock()
		return nil, status.Errorf(codes.AlreadyExists, "pull: request %s is being pulled already", id)
	case len(ho.pulls) >= w.cfg.MaxPulls:
		ho.mu.Unlock()
		return nil, status.Errorf(codes.ResourceExhausted, "pull: %d pulls in progress (the limit)", len(ho.pulls))
	}
	pctx, cancel := context.WithTimeout(ctx, w.cfg.PullTimeout)
	p := &pull{cancel: cancel, done: make(chan struct{})}
	ho.pulls[id] = p
	w.gauges()
	ho.mu.Unlock()
	defer func() {
		cancel()
		ho.mu.Lock()
		delete(ho.pulls, id)
		w.gauges()
		close(p.done)
		ho.mu.Unlock()
	}()

	sctx := telemetry.ExtractStrings(pctx, req.GetTraceContext(), req.GetTraceState())
	sctx, sp := w.spans.Start(sctx, spanname.KVReceive, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrRequestID.String(id), attribute.String("source", req.GetSource()),
			attribute.Int("from_block", int(req.GetFromBlock()))))
	bytes, blocks, err := w.receiveBlocks(sctx, req)
	sp.SetAttributes(attribute.Int64("bytes", bytes), attribute.Int("blocks", blocks))
	if err != nil {
		code := "kv_receive_failed"
		if errors.Is(err, errBlockMismatch) {
			code = "block_mismatch"
			w.ho.refused.Refused(metrics.RefusedBlockMismatch)
			err = status.Errorf(codes.PermissionDenied, "pull: %v", err)
		}
		sp.SetError(code, err)
		sp.End()
		if _, ok := status.FromError(err); !ok || status.Code(err) == codes.Unknown {
			err = status.Errorf(codes.Aborted, "pull: %v", err)
		}
		return nil, err
	}
	sp.End()
	return &cbv1.PullKVResponse{Bytes: bytes, Blocks: int32(blocks)}, nil
}

// receiveBlocks reads the blocks from the source worker and writes them.
func (w *Worker) receiveBlocks(ctx context.Context, req *cbv1.PullKVRequest) (int64, int, error) {
	conn, done, err := w.peer(req.GetSource())
	if err != nil {
		return 0, 0, status.Errorf(codes.Unavailable, "pull: %v", err)
	}
	defer done()
	bt, n := req.GetBlockTable(), int(req.GetNTokens())
	want := blockHashes(req.GetTokens(), w.cfg.BlockSize)
	next := int(req.GetFromBlock())
	tp, ts := telemetry.InjectStrings(ctx)
	stream, err := cbv1.NewKVTransferServiceClient(conn).ReadKV(ctx, &cbv1.ReadKVRequest{
		RequestId: req.GetRequestId(), TraceContext: tp, TraceState: ts, Secret: req.GetSecret(),
		FromBlock: int32(next), NTokens: int32(n), Layout: w.layoutProto(), Model: w.kvModel,
	})
	if err != nil {
		return 0, 0, err
	}
	l := w.kv.Layout()
	var got int64
	blocks := 0
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return got, blocks, err
		}
		first, cnt := int(msg.GetFirstBlock()), int(msg.GetNBlocks())
		if first != next || cnt < 1 || first+cnt > len(bt) {
			return got, blocks, status.Errorf(codes.DataLoss, "pull: blocks [%d, %d) from the source, expected block %d of %d", first, first+cnt, next, len(bt))
		}
		if want := chunkBytes(l, first, cnt, n); len(msg.GetData()) != want {
			return got, blocks, status.Errorf(codes.DataLoss, "pull: %d bytes for blocks [%d, %d), want %d", len(msg.GetData()), first, first+cnt, want)
		}
		// The keeper says which tokens each block holds: a block of other
		// tokens than the prompt's is refused before anything of it is
		// written (the decode engine then commits none of the pull).
		if hs := msg.GetBlockHashes(); len(hs) != cnt {
			return got, blocks, fmt.Errorf("%w: %d block hashes for %d blocks", errBlockMismatch, len(hs), cnt)
		}
		for i, h := range msg.GetBlockHashes() {
			if string(h) != string(want[first+i][:]) {
				return got, blocks, fmt.Errorf("%w: block %d of request %s holds other tokens than the prompt's", errBlockMismatch, first+i, req.GetRequestId())
			}
		}
		if err := ctx.Err(); err != nil { // stopped (finished id, timeout): write nothing more
			return got, blocks, status.FromContextError(err).Err()
		}
		unpackBlocks(w.kv, bt, first, cnt, n, msg.GetData())
		got += int64(len(msg.GetData()))
		blocks += cnt
		next += cnt
	}
	if next != len(bt) {
		return got, blocks, status.Errorf(codes.DataLoss, "pull: the source stopped after block %d of %d", next, len(bt))
	}
	return got, blocks, nil
}

// errBlockMismatch marks a pull refused because a block the source sent
// holds other tokens than the prompt the decode engine pulls for.
var errBlockMismatch = errors.New("KV block mismatch")

// peer returns a connection to the worker at addr (cached, at most
// maxPeerConns; beyond, a connection of its own that done closes).
func (w *Worker) peer(addr string) (*grpc.ClientConn, func(), error) {
	ho := w.ho
	ho.mu.Lock()
	defer ho.mu.Unlock()
	if c, ok := ho.peers[addr]; ok {
		return c, func() {}, nil
	}
	c, err := w.dialPeer(addr)
	if err != nil {
		return nil, nil, err
	}
	if len(ho.peers) < maxPeerConns {
		ho.peers[addr] = c
		return c, func() {}, nil
	}
	return c, func() { c.Close() }, nil
}

// dialPeer dials another worker: Deps.DialPeer, or plaintext rpc.Dial.
func (w *Worker) dialPeer(addr string) (*grpc.ClientConn, error) {
	if w.dial != nil {
		return w.dial(addr)
	}
	return rpc.Dial(addr)
}
