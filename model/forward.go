package model

import (
	"fmt"
	"runtime"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/offheap"
	"github.com/cacheblend/cacheblend/simd"
)

// PrefillInput is one chunk of a sequence's prompt (a plain value; the
// model only reads it).
type PrefillInput struct {
	// Tokens are computed at positions [Start, Start+len(Tokens)).
	Tokens []int32
	// Start is the first position computed; positions [0, Start) must
	// already be in the cache (an earlier chunk or a reused prefix).
	Start int
	// BlockTable maps the sequence's positions to cache blocks; it must
	// cover positions [0, Start+len(Tokens)).
	BlockTable []int32
	// Logits is how many trailing positions' logits Prefill returns, in
	// position order, Vocab values each (teacher-forced scoring of a
	// continuation, cb eval); 0 means 1 (the last token's). At most
	// len(Tokens).
	Logits int
	// Into, when its length holds those logits (max(Logits, 1) × Vocab
	// floats), receives them and Prefill returns its first ones instead of
	// a new slice: a caller's reused buffer, as DecodeInto's (nil: a new
	// slice per call).
	Into []float32
}

// DecodeInput is one sequence's next token in a decode batch (a plain
// value; the model only reads it).
type DecodeInput struct {
	Token      int32   // token id fed at Pos
	Pos        int     // its position; positions [0, Pos) are in the cache
	BlockTable []int32 // must cover positions [0, Pos]
}

// batch describes the rows of one forward: every row is a token at a
// position with a cache slot; rows of one sequence are contiguous and sorted
// by position.
type batch struct {
	pos  []int
	slot []int
	seqs []seqInfo
	// cos and sin are every row's RoPE angles (HeadDim/2 values a row),
	// computed by Model.angles once per batch and used by every layer.
	cos, sin []float64
}

type seqInfo struct {
	r0, r1 int   // rows [r0, r1) of the batch
	ctx    int   // the rows attend over positions [0, ctx)
	slots  []int // slot of every position in [0, ctx)
}

// workspace holds the scratch buffers of one forward call; the Model keeps
// up to maxFreeWS of them between calls, and concurrent calls use different
// ones. Its float buffers of offheapMin bytes or more live outside the Go
// heap (package offheap): the collector then does not count them as live
// and let the heap grow by as much again before it collects (GOGC=100), so
// a 19 MiB gate|up buffer costs 19 MiB of resident memory, not up to 38.
type workspace struct {
	f       *wsFloats
	ints    [numInts][]int
	scratch [][]float32 // per worker
}

// The batches of one call whose RoPE angles a workspace holds: every
// forward's rows, and a BlendForward's recomputed rows.
const (
	anglesRows = iota
	anglesImp
	numAngles
)

// wsFloats is a workspace's float buffers, apart from the workspace so that
// the cleanup of a workspace dropped without release can free them.
type wsFloats struct {
	bufs   [numBufs][]float32
	mapped [numBufs]bool // bufs[i] comes from offheap.Floats
	// retired holds mapped buffers replaced by bigger ones during the
	// current call: slices of them may still be in use until it returns.
	retired [][]float32
	// angles holds the RoPE angles of a call's batches (Model.angles),
	// each computed once per call, so a buffer that grows holds nothing
	// still read.
	angles [numAngles]offheap.Buf[float64]
}

// offheapMin is the smallest buffer (bytes) a workspace maps off the heap;
// smaller ones are not worth a system call.
const offheapMin = 64 << 10

func newWorkspace() *workspace {
	ws := &workspace{f: &wsFloats{}}
	runtime.AddCleanup(ws, (*wsFloats).free, ws.f)
	return ws
}

// grow makes bufs[id] hold n floats with capacity c (c ≥ n), dropping its
// contents.
func (f *wsFloats) grow(id, n, c int) {
	if f.mapped[id] {
		f.retired = append(f.retired, f.bufs[id])
	}
	f.bufs[id], f.mapped[id] = nil, false
	if c*4 >= offheapMin {
		if b, err := offheap.Floats(c); err == nil {
			f.bufs[id], f.mapped[id] = b[:n], true
			return
		}
		// Refused mapping: the heap still works.
	}
	f.bufs[id] = make([]float32, n, c)
}

// endCall unmaps the buffers retired during the call that just ended.
func (f *wsFloats) endCall() {
	for i, b := range f.retired {
		_ = offheap.Free(b) // cannot fail for a buffer of offheap.Floats
		f.retired[i] = nil
	}
	f.retired = f.retired[:0]
}

// free unmaps every mapped buffer; the workspace must not be used again.
func (f *wsFloats) free() {
	f.endCall()
	for i := range f.angles {
		f.angles[i].Free()
	}
	for id, b := range f.bufs {
		if f.mapped[id] {
			_ = offheap.Free(b)
		}
		f.bufs[id], f.mapped[id] = nil, false
	}
}

const (
	bufX = iota
	bufH
	bufQKV
	bufAtt
	// bufMix is attnGathered's K and V of the context, then the MLP's
	// gate|up intermediate: a layer's attention has ended before its MLP
	// starts, so one buffer serves both (the larger of the two resident,
	// not their sum: 3.1 MiB at SmolLM2-135M for a 2,048-token context).
	bufMix
	bufOut
	bufXAll
	bufDev
	bufPart  // a rank's partial projection output before its all-reduce
	bufMask  // the reused-position agreement of a sharded BlendForward
	bufSplit // attnSplit's per-chunk partial results
	numBufs
)

const (
	intPos = iota
	intSlot
	intCtx
	intRows
	intPosImp
	intSlotImp
	intOrder
	intImp
	intLim
	intLimStack // intLim repeated per query head of a group, tile by tile (attnGathered)
	intChunks   // attnSplit's first task of every sequence
	intChunkSeq // attnSplit's sequence of every task
	numInts
)

func (ws *workspace) f32(id, n int) []float32 {
	if cap(ws.f.bufs[id]) < n {
		ws.f.grow(id, n, n+n/4)
	}
	return ws.f.bufs[id][:n]
}

// f32Exact is f32 without the quarter of headroom, for a buffer whose size
// is bounded by the rows of one product (mlpRows), not by a context that
// grows a token at a time.
func (ws *workspace) f32Exact(id, n int) []float32 {
	if cap(ws.f.bufs[id]) < n {
		ws.f.grow(id, n, n)
	}
	return ws.f.bufs[id][:n]
}

// anglesBuf returns n float64s for the RoPE angles of batch id.
func (ws *workspace) anglesBuf(id, n int) []float64 {
	return ws.f.angles[id].Grow(n)
}

func (ws *workspace) int(id, n int) []int {
	if cap(ws.ints[id]) < n {
		ws.ints[id] = make([]int, n, n+n/4)
	}
	return ws.ints[id][:n]
}

// worker returns worker w's scratch; ws.scratch must already have an entry
// for every worker (so concurrent workers never grow the slice).
func (ws *workspace) worker(w, n int) []float32 {
	if cap(ws.scratch[w]) < n {
		ws.scratch[w] = make([]float32, n, n+n/4)
	}
	return ws.scratch[w][:n]
}

func (m *Model) getWS() *workspace {
	select {
	case ws := <-m.free:
		return ws
	default:
		return newWorkspace()
	}
}

// maxFreeWS is how many workspaces a Model keeps between calls: a worker
// runs one forward at a time; more concurrent callers allocate their own.
const maxFreeWS = 2

func (m *Model) putWS(ws *workspace) {
	ws.f.endCall()
	select {
	case m.free <- ws:
	default: // enough kept: this one is released
		ws.f.free()
	}
}

// checkKV verifies the KV memory matches the model.
func (m *Model) checkKV(kv *kvcache.Memory) error {
	if kv == nil {
		return fmt.Errorf("%w: nil KV memory", ErrLayout)
	}
	l := kv.Layout()
	if l.NumLayers != m.cfg.Layers || l.KVHeads != m.cfg.KVHeads || l.HeadDim != m.headDim {
		return fmt.Errorf("%w: memory has %d layers × %d KV heads × %d, model needs %d × %d × %d",
			ErrLayout, l.NumLayers, l.KVHeads, l.HeadDim, m.cfg.Layers, m.cfg.KVHeads, m.headDim)
	}
	return nil
}

// checkTokens verifies every id is in the vocabulary.
func (m *Model) checkTokens(tokens []int32) error {
	for i, t := range tokens {
		if t < 0 || int(t) >= m.cfg.Vocab {
			return fmt.Errorf("%w: token %d at index %d, vocabulary has %d", ErrToken, t, i, m.cfg.Vocab)
		}
	}
	return nil
}

// mapSlots fills dst with the slots of positions [0, len(dst)) after checking
// the block table covers them with blocks inside the pool.
func mapSlots(dst []int, bt []int32, layout kvcache.Layout) error {
	end := len(dst)
	need := (end + layout.BlockSize - 1) / layout.BlockSize
	if len(bt) < need {
		return fmt.Errorf("%w: positions [0, %d) need %d blocks, table has %d", ErrBlockTable, end, need, len(bt))
	}
	for i := range need {
		if bt[i] < 0 || int(bt[i]) >= layout.NumBlocks {
			return fmt.Errorf("%w: block table entry %d is block %d, pool has %d", ErrBlockTable, i, bt[i], layout.NumBlocks)
		}
	}
	if n := kvcache.SlotMapping(dst, bt, 0, end, layout.BlockSize); n != end {
		return fmt.Errorf("%w: mapped %d of %d positions", ErrBlockTable, n, end)
	}
	return nil
}

// Prefill computes in.Tokens at positions [in.Start, in.Start+len(in.Tokens))
// — positions [0, in.Start) must already be in kv — writes their K/V into
// kv's slots, and returns the logits (len Vocab) of the last token (in
// in.Into when it holds them). Calling it chunk after chunk is a chunked
// prefill.
func (m *Model) Prefill(kv *kvcache.Memory, in PrefillInput) ([]float32, error) {
	if err := m.checkKV(kv); err != nil {
		return nil, err
	}
	n := len(in.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("%w: prefill of no tokens", ErrInput)
	}
	if in.Start < 0 || in.Start+n > m.cfg.MaxPositions {
		return nil, fmt.Errorf("%w: positions [%d, %d), model accepts [0, %d)", ErrPosition, in.Start, in.Start+n, m.cfg.MaxPositions)
	}
	if err := m.checkTokens(in.Tokens); err != nil {
		return nil, err
	}
	nl, err := logitRows(in.Logits, n)
	if err != nil {
		return nil, err
	}
	ws := m.getWS()
	defer m.putWS(ws)
	ctx := in.Start + n
	slots := ws.int(intCtx, ctx)
	if err := mapSlots(slots, in.BlockTable, kv.Layout()); err != nil {
		return nil, err
	}
	pos := ws.int(intPos, n)
	for i := range pos {
		pos[i] = in.Start + i
	}
	b := &batch{pos: pos, slot: slots[in.Start:ctx], seqs: []seqInfo{{r0: 0, r1: n, ctx: ctx, slots: slots}}}
	m.angles(b, ws, anglesRows)
	x := dense(ws.f32(bufX, n*m.cfg.Dim), n, m.cfg.Dim)
	m.embedRows(x, in.Tokens)
	if err := m.forwardLayers(ws, kv, 0, x, b, nl); err != nil {
		return nil, err
	}
	out := in.Into
	if len(out) < nl*m.cfg.Vocab {
		out = make([]float32, nl*m.cfg.Vocab)
	}
	out = out[:nl*m.cfg.Vocab]
	m.logits(ws, dense(out, nl, m.cfg.Vocab), x.view(n-nl, 0, nl, m.cfg.Dim))
	return out, nil
}

// logitRows is the number of trailing positions whose logits a forward
// over n positions returns when the caller asks for want (0: 1).
func logitRows(want, n int) (int, error) {
	if want < 0 || want > n {
		return 0, fmt.Errorf("%w: logits of %d trailing positions of %d", ErrInput, want, n)
	}
	return max(want, 1), nil
}

// Decode runs one decode step for a batch of sequences: each input's token
// is computed at its Pos (writing its K/V), attending over positions
// [0, Pos] of its own block table. It returns one logits slice per input,
// newly allocated (see DecodeInto to reuse a buffer). The projections of
// the whole batch run as one matrix multiply and the attention of the
// sequences runs in parallel.
func (m *Model) Decode(kv *kvcache.Memory, in []DecodeInput) ([][]float32, error) {
	if len(in) == 0 {
		return nil, m.checkKV(kv)
	}
	flat := make([]float32, len(in)*m.cfg.Vocab)
	if err := m.DecodeInto(kv, in, flat); err != nil {
		return nil, err
	}
	out := make([][]float32, len(in))
	for i := range out {
		out[i] = flat[i*m.cfg.Vocab : (i+1)*m.cfg.Vocab : (i+1)*m.cfg.Vocab]
	}
	return out, nil
}

// DecodeInto is Decode writing input i's logits into
// logits[i·Vocab:(i+1)·Vocab] (logits must hold len(in)·Vocab floats; a
// shorter one is an ErrInput): a serving loop that reuses one buffer
// allocates nothing the size of the vocabulary per step (600 KiB a
// sequence at Qwen2.5's 151,936 tokens, which otherwise keeps the garbage
// collector busy and the heap at twice its live size).
func (m *Model) DecodeInto(kv *kvcache.Memory, in []DecodeInput, logits []float32) error {
	if err := m.checkKV(kv); err != nil {
		return err
	}
	n := len(in)
	if n == 0 {
		return nil
	}
	if len(logits) < n*m.cfg.Vocab {
		return fmt.Errorf("%w: %d floats for the logits of %d inputs of %d", ErrInput, len(logits), n, m.cfg.Vocab)
	}
	layout := kv.Layout()
	toks := make([]int32, n)
	b := &batch{pos: make([]int, n), slot: make([]int, n), seqs: make([]seqInfo, n)}
	seen := make(map[int]int, n)
	ws := m.getWS()
	defer m.putWS(ws)
	total := 0
	for _, d := range in {
		if d.Pos >= 0 && d.Pos < m.cfg.MaxPositions {
			total += d.Pos + 1
		}
	}
	allSlots := ws.int(intCtx, total)
	for i, d := range in {
		if d.Pos < 0 || d.Pos >= m.cfg.MaxPositions {
			return fmt.Errorf("%w: decode input %d at position %d, model accepts [0, %d)", ErrPosition, i, d.Pos, m.cfg.MaxPositions)
		}
		if d.Token < 0 || int(d.Token) >= m.cfg.Vocab {
			return fmt.Errorf("%w: decode input %d has token %d, vocabulary has %d", ErrToken, i, d.Token, m.cfg.Vocab)
		}
		slots := allSlots[: d.Pos+1 : d.Pos+1]
		allSlots = allSlots[d.Pos+1:]
		if err := mapSlots(slots, d.BlockTable, layout); err != nil {
			return fmt.Errorf("decode input %d: %w", i, err)
		}
		s := slots[d.Pos]
		if j, dup := seen[s]; dup {
			return fmt.Errorf("%w: decode inputs %d and %d write the same slot %d", ErrInput, j, i, s)
		}
		seen[s] = i
		toks[i] = d.Token
		b.pos[i] = d.Pos
		b.slot[i] = s
		b.seqs[i] = seqInfo{r0: i, r1: i + 1, ctx: d.Pos + 1, slots: slots}
	}
	m.angles(b, ws, anglesRows)
	x := dense(ws.f32(bufX, n*m.cfg.Dim), n, m.cfg.Dim)
	m.embedRows(x, toks)
	for l := range m.cfg.Layers {
		if err := m.layer(ws, kv, l, x, b); err != nil {
			return err
		}
	}
	m.logits(ws, dense(logits[:n*m.cfg.Vocab], n, m.cfg.Vocab), x)
	return nil
}

func (m *Model) embedRows(x mat, tokens []int32) {
	for i, t := range tokens {
		if m.embed.q != nil {
			m.embed.q.row(int(t), x.row(i))
		} else {
			copy(x.row(i), m.embed.row(int(t)))
		}
	}
}

// logits writes finalNorm(x)·Wᵀ (W the LM head) for every row of x into out.
func (m *Model) logits(ws *workspace, out, x mat) {
	h := dense(ws.f32(bufH, x.rows*m.cfg.Dim), x.rows, m.cfg.Dim)
	for i := range x.rows {
		m.rmsNorm(h.row(i), x.row(i), m.finalNorm)
	}
	gemm(m.team, out, h, m.output, true, false)
}

// rowChunks runs fn over [0, n) in chunks of rows on the model's threads.
func (m *Model) rowChunks(n int, fn func(r0, r1 int)) {
	const chunk = 64
	m.team.run((n+chunk-1)/chunk, func(_, t int) {
		fn(t*chunk, min(n, (t+1)*chunk))
	})
}

// normRows writes RMSNorm(x)·gain into h row by row.
func (m *Model) normRows(h, x mat, gain []float32) {
	m.rowChunks(x.rows, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			m.rmsNorm(h.row(i), x.row(i), gain)
		}
	})
}

// layer runs transformer layer l on the rows of x in place (x is the
// residual stream), writing every row's K/V into its slot. It fails only
// when a sharded model's all-reduce fails.
func (m *Model) layer(ws *workspace, kv *kvcache.Memory, l int, x mat, b *batch) error {
	if x.rows <= mlpRows || len(b.seqs) != 1 {
		qkv := m.storeKV(ws, kv, l, x, b, true)
		return m.attendAndMLP(ws, kv, l, x, qkv, b)
	}
	// One sequence of many rows (a CacheBlend forward's full layers, its
	// important rows): mlpRows rows at a time, so that the layer's
	// buffers (Q/K/V, attention output, norms) stay the size of a
	// prefill chunk's. A chunk's rows attend causally, by position, so the
	// K/V of later chunks not yet written is never read.
	for r0 := 0; r0 < x.rows; r0 += mlpRows {
		r1 := min(x.rows, r0+mlpRows)
		xc, bc := x.view(r0, 0, r1-r0, x.cols), b.sub(r0, r1)
		qkv := m.storeKV(ws, kv, l, xc, bc, true)
		if err := m.attendAndMLP(ws, kv, l, xc, qkv, bc); err != nil {
			return err
		}
	}
	return nil
}

// sub is rows [r0, r1) of a one-sequence batch, attending over the same
// positions.
func (b *batch) sub(r0, r1 int) *batch {
	s := b.seqs[0]
	out := &batch{pos: b.pos[r0:r1], slot: b.slot[r0:r1], seqs: []seqInfo{{r0: 0, r1: r1 - r0, ctx: s.ctx, slots: s.slots}}}
	if len(b.pos) > 0 && b.cos != nil {
		half := len(b.cos) / len(b.pos)
		out.cos, out.sin = b.cos[r0*half:r1*half], b.sin[r0*half:r1*half]
	}
	return out
}

// angles computes b's RoPE angles (b.cos, b.sin) unless it has them, into
// the workspace's buffer id: once per forward instead of once per layer,
// the same bits as rope.RotateHeads. Every forward computes its batches'
// when it makes them; a batch made without them (the one-layer benchmark's)
// gets them from the heap at its first rotation (nil ws). Not safe for
// concurrent use on one batch (a forward owns its batch).
func (m *Model) angles(b *batch, ws *workspace, id int) {
	if b.cos != nil {
		return
	}
	half, n := m.headDim/2, len(b.pos)
	var buf []float64
	if ws != nil {
		buf = ws.anglesBuf(id, 2*n*half)
	} else {
		buf = make([]float64, 2*n*half)
	}
	b.cos, b.sin = buf[:n*half:n*half], buf[n*half:]
	fill := func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			m.rope.Angles(b.pos[i], b.cos[i*half:(i+1)*half], b.sin[i*half:(i+1)*half])
		}
	}
	if n < 64 {
		fill(0, n)
		return
	}
	m.rowChunks(n, fill)
}

// rotate rotates every head of x to the position of b's row i.
func (m *Model) rotate(x []float32, b *batch, i int) {
	half := m.headDim / 2
	m.rope.RotateBy(x, b.cos[i*half:(i+1)*half], b.sin[i*half:(i+1)*half])
}

// storeKV computes the Q, K and V of every row of x at layer l (returned,
// rotated), writing K and V into the rows' slots; Q is rotated only when
// withQ (a row whose output nobody reads needs none).
func (m *Model) storeKV(ws *workspace, kv *kvcache.Memory, l int, x mat, b *batch, withQ bool) mat {
	n, d := x.rows, m.cfg.Dim
	lw := &m.layers[l]
	h := dense(ws.f32(bufH, n*d), n, d)
	m.normRows(h, x, lw.attnNorm)
	qkv := dense(ws.f32(bufQKV, n*m.qkvDim), n, m.qkvDim)
	m.projectQKV(lw, qkv, h, 0, m.qkvDim)
	m.ropeAndStore(kv, l, qkv, b, withQ)
	return qkv
}

// lastLayer runs layer l, the model's last, on the rows of x (one
// sequence, batch b) when only the last tail rows' outputs are read
// afterwards (the logits of the prompt's last token, or of its last tail
// tokens): every row's K and V are computed and stored (later steps attend
// over them), but the attention, the output projection and the MLP run for
// the tail rows alone — the others' results would feed no layer.
func (m *Model) lastLayer(ws *workspace, kv *kvcache.Memory, l int, x mat, b *batch, tail int) error {
	r := x.rows - tail
	for r0 := 0; r0 < r; r0 += mlpRows { // K and V only, a chunk at a time
		r1 := min(r, r0+mlpRows)
		m.storeKV(ws, kv, l, x.view(r0, 0, r1-r0, x.cols), b.sub(r0, r1), false)
	}
	return m.layer(ws, kv, l, x.view(r, 0, tail, x.cols), b.sub(r, x.rows))
}

// forwardLayers runs layers [from, L) on the rows of x (one sequence, batch
// b) for the logits of its last tail rows: the last layer through lastLayer.
func (m *Model) forwardLayers(ws *workspace, kv *kvcache.Memory, from int, x mat, b *batch, tail int) error {
	last := m.cfg.Layers - 1
	for l := from; l < last; l++ {
		if err := m.layer(ws, kv, l, x, b); err != nil {
			return err
		}
	}
	if from > last {
		return nil
	}
	return m.lastLayer(ws, kv, last, x, b, tail)
}

// ropeAndStore rotates the Q (when withQ) and K columns of every row of qkv
// to the row's position and writes K and V into the row's cache slot.
func (m *Model) ropeAndStore(kv *kvcache.Memory, l int, qkv mat, b *batch, withQ bool) {
	kvd := m.kvDim
	m.angles(b, nil, 0)
	m.rowChunks(qkv.rows, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			row := qkv.row(i)
			if withQ {
				m.rotate(row[:m.qDim], b, i)
			}
			k := row[m.qDim : m.qDim+kvd]
			m.rotate(k, b, i)
			s := b.slot[i]
			kv.Write(kvcache.Keys, l, s, k)
			kv.Write(kvcache.Values, l, s, row[m.qDim+kvd:m.qDim+2*kvd])
		}
	})
}

// attendAndMLP finishes layer l for the rows of x: attention of the (already
// rotated) queries in qkv over the cache, the output projection, and the
// SwiGLU MLP, both added to the residual x. On a sharded model both are
// partial sums, all-reduced before they are added.
func (m *Model) attendAndMLP(ws *workspace, kv *kvcache.Memory, l int, x, qkv mat, b *batch) error {
	n, d := x.rows, m.cfg.Dim
	lw := &m.layers[l]
	att := dense(ws.f32(bufAtt, n*m.qDim), n, m.qDim)
	m.attention(ws, kv, l, att, qkv, b)
	if err := m.project(ws, x, att, lw.wo); err != nil {
		return err
	}

	h := dense(ws.f32(bufH, n*d), n, d)
	m.normRows(h, x, lw.mlpNorm)
	return m.mlp(ws, lw, x, h)
}

// mlp adds the SwiGLU MLP of the normed rows h to the residual x.
func (m *Model) mlp(ws *workspace, lw *layerWeights, x, h mat) error {
	n, d, f := x.rows, m.cfg.Dim, m.cfg.FFNDim
	// The MLP runs mlpRows rows at a time: its intermediate (2·FFNDim
	// floats a row, 64 KiB a row for Llama-3.2-1B) then stays a few tens
	// of MiB whatever the prompt, instead of growing with it. The
	// activation silu(gate)·up is written over the gate half of each row
	// and read from there by the down projection (a view of stride
	// 2·FFNDim), so it needs no buffer of its own. A chunk of splitRows
	// rows or more, when the layer is split, computes the FFN columns in
	// two halves (the gate|up and down products of the first, then of the
	// second, adding to the residual): the intermediate is then half as
	// big (16 MiB of 32 at Llama-3.2-1B's width) and every product keeps
	// its rows, so its weight panels are unpacked as often as before.
	cn := min(n, mlpRows)
	halves := lw.split > 0 && cn >= splitRows
	w := 2 * f
	if halves {
		w = 2 * lw.split
	}
	gu := dense(ws.f32Exact(bufMix, cn*w), cn, w)
	for r0 := 0; r0 < n; r0 += mlpRows {
		rows := min(n, r0+mlpRows) - r0
		hc, xc := h.view(r0, 0, rows, d), x.view(r0, 0, rows, d)
		if !halves {
			guc := dense(gu.data[:rows*2*f], rows, 2*f)
			gemm(m.team, guc, hc, lw.gu, true, false)
			m.gatedActivation(guc, lw.split, f)
			if err := m.project(ws, xc, guc.view(0, 0, rows, f), lw.down); err != nil {
				return err
			}
			continue
		}
		if err := m.mlpHalves(ws, lw, xc, hc, gu.data); err != nil {
			return err
		}
	}
	return nil
}

// mlpHalves is mlp's chunk of rows (h's, added to x) in the two halves of
// the layer's FFN columns, the intermediate in buf: both halves' gate|up
// products take h's rows quantized once.
func (m *Model) mlpHalves(ws *workspace, lw *layerWeights, x, h mat, buf []float32) error {
	rows, d, f := h.rows, m.cfg.Dim, m.cfg.FFNDim
	xq := sharedTiles(m.team, h, lw.gu)
	if xq != nil {
		defer gemmTilesPool.put(xq)
	}
	for hf, c := range [2][2]int{{0, lw.split}, {lw.split, f}} {
		fh := c[1] - c[0]
		guc := dense(buf[:rows*2*fh], rows, 2*fh)
		gemmTiles(m.team, guc, h, lw.gu.view(2*c[0], 0, 2*fh, d), xq, false)
		m.gatedActivation(guc, 0, fh)
		if err := m.project(ws, x, guc.view(0, 0, rows, fh), lw.downHalf[hf]); err != nil {
			return err
		}
	}
	return nil
}

// gatedActivation writes swiglu's silu(gate)·up over the first f columns
// of every row of gu, whose row holds gate | up (split 0) or the halves
// gate[:split] | up[:split] | gate[split:] | up[split:].
func (m *Model) gatedActivation(gu mat, split, f int) {
	m.rowChunks(gu.rows, func(i0, i1 int) {
		for i := i0; i < i1; i++ {
			g := gu.row(i)
			if split <= 0 {
				swiglu(g[:f], g[:f], g[f:2*f])
				continue
			}
			s, t := split, f-split
			swiglu(g[:s], g[:s], g[s:2*s])
			// Columns [s, f) are up[:s], already read; gate[s:] starts at
			// 2s ≥ f, so the writes never reach what is still to be read.
			swiglu(g[s:f], g[2*s:2*s+t], g[2*s+t:2*s+2*t])
		}
	})
}

// splitRows is the fewest rows of a chunk whose MLP runs in halves (see
// attendAndMLP): a decode batch's few rows keep one product per weight.
const splitRows = 64

// mlpRows is the most rows one MLP product computes (a prefill's chunk in
// the engine, StepTokenBudget, is 512 by default).
const mlpRows = 512

// project adds a·w to the residual x; on a sharded model a·w is the rank's
// partial sum, all-reduced first.
func (m *Model) project(ws *workspace, x, a, w mat) error {
	if m.tp == nil {
		gemm(m.team, x, a, w, true, true)
		return nil
	}
	p := dense(ws.f32(bufPart, x.rows*x.cols), x.rows, x.cols)
	gemm(m.team, p, a, w, true, false)
	if err := m.allReduce(p.data); err != nil {
		return err
	}
	m.rowChunks(x.rows, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			addTo(x.row(i), p.row(i))
		}
	})
	return nil
}

func addTo(dst, src []float32) {
	simd.Axpy(1, src[:len(dst)], dst)
}

// projectQKV writes columns [c0, c1) of the Q|K|V projection of the rows
// of h (and their biases) into out (len(h) rows × c1−c0).
func (m *Model) projectQKV(lw *layerWeights, out, h mat, c0, c1 int) {
	gemm(m.team, out, h, lw.qkv.view(c0, 0, c1-c0, lw.qkv.cols), true, false)
	if lw.qkvBias == nil {
		return
	}
	b := lw.qkvBias[c0:c1]
	m.rowChunks(out.rows, func(r0, r1 int) {
		for i := r0; i < r1; i++ {
			addTo(out.row(i), b)
		}
	})
}
