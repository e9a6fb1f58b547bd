package model

import (
	"math"
	"unsafe"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/simd"
)

// Attention tiling: a task covers at most maxTile consecutive query rows of
// one sequence spanning at most maxSpan positions (sparse important sets
// then waste little on masked scores); sequences with at most directRows
// query rows (decode) read K/V straight from the cache instead of gathering
// them.
const (
	maxTile    = 72 // a multiple of every micro-tile height (12, 6, 4)
	maxSpan    = 128
	directRows = 4
)

// maxGroupHeads bounds the query heads one direct-attention task serves
// (Heads); larger models fall back to the gathered path.
const maxGroupHeads = 64

// halfRun is the most slots of an F16 cache that the decode paths read
// as one run (one block of the stack's default size): simd.DotRowsF16
// takes whole runs of 16, and a run converted for a shape it refuses stays
// in L1 while every query head reads it. The runs fix the bits: a score
// depends on its row's place among the 16 that the kernel reduces at once.
const halfRun = 16

// kvPlanes is the K and V planes of one layer as attention reads them.
type kvPlanes struct {
	kv     *kvcache.Memory
	l      int
	k, v   []float32 // the planes of an F32 memory; nil for another type
	kh, vh []uint16  // the planes of an F16 memory, as halves; nil for another type
}

func planes(kv *kvcache.Memory, l int) kvPlanes {
	p := kvPlanes{kv: kv, l: l}
	switch kv.Layout().DType {
	case kvcache.F32:
		p.k, p.v = kv.K(l), kv.V(l)
	case kvcache.F16:
		p.kh, p.vh = kv.Halves(l, kvcache.Keys), kv.Halves(l, kvcache.Values)
	}
	return p
}

// kvRun is a run of n consecutive slots from slot on, of one plane, as the
// decode paths read it: an F32 memory's rows in place; an F16 memory's
// through simd's F16 kernels (DotRowsF16, AxpyRowsF16: converted in
// registers, no pass over a buffer), or, for a shape those kernels refuse,
// converted into conv once, on first need. Both F16 ways give the same
// bits.
type kvRun struct {
	p          kvPlanes
	pl         kvcache.Plane
	slot, n    int
	kvd        int
	conv, rows []float32 // rows: the run as float32, once there
}

// run is the run of n slots from slot on, of plane pl, at stride kvd, with
// conv (at least n·kvd) for a conversion.
func (p kvPlanes) run(pl kvcache.Plane, slot, n, kvd int, conv []float32) kvRun {
	r := kvRun{p: p, pl: pl, slot: slot, n: n, kvd: kvd, conv: conv}
	if p.k != nil {
		r.rows = p.rows(pl, slot, n, kvd, nil)
	}
	return r
}

// floats is the run's rows as float32.
func (r *kvRun) floats() []float32 {
	if r.rows == nil {
		r.rows = r.p.rows(r.pl, r.slot, r.n, r.kvd, r.conv)
	}
	return r.rows
}

// half is the run's rows as halves from element off of the first (nil for
// an F32 memory).
func (r *kvRun) half(off int) []uint16 {
	h := r.p.kh
	if r.pl == kvcache.Values {
		h = r.p.vh
	}
	if h == nil {
		return nil
	}
	return h[r.slot*r.kvd+off : (r.slot+r.n)*r.kvd]
}

// dot writes q·(row t's elements [off, off+len(q))) into dst[t] for t <
// len(dst) (at most n), as simd.DotRows does.
func (r *kvRun) dot(dst, q []float32, off int) {
	if r.rows == nil && simd.DotRowsF16(dst, q, r.half(off), r.kvd) {
		return
	}
	simd.DotRows(dst, q, r.floats()[off:], r.kvd)
}

// axpy adds Σ_t w[t]·(row t's elements [off, off+len(out))) to out for t <
// len(w) (at most n), as simd.AxpyRows does.
func (r *kvRun) axpy(out, w []float32, off int) {
	if r.rows == nil && simd.AxpyRowsF16(out, w, r.half(off), r.kvd) {
		return
	}
	simd.AxpyRows(out, w, r.floats()[off:], r.kvd)
}

// end is where a run of consecutive slots from position t (below n) must
// stop: n, or for an F16 memory at most halfRun positions on (halfRun's
// comment says why). slotRun is given it, so that it looks no further than
// the run it returns (a scan to n for every run of halfRun made a decode
// step's attention quadratic in its context: 2.6 % of a 135M decode's CPU).
func (p kvPlanes) end(t, n int) int {
	if p.k == nil {
		return min(n, t+halfRun)
	}
	return n
}

// ahead is what attnSplit asks the CPU to bring closer (simd.Prefetch)
// while its kernels read the run before: over an F16 memory, plane pl's
// rows (at stride kvd) of the run of consecutive slots from position t (below
// lim) on, at most halfRun of them; nil over an F32 memory. The kernels
// read a run head by head, each head two 64-byte lines of every row (a
// strided part), which the hardware prefetchers do not follow from one run
// into the next. The request is cut into one part per head, each asked for
// just before that head's kernel, so that the requests do not all wait at
// once for the core's few outstanding misses. Measured
// (BenchmarkDecodeAttention's shape, 30 layers of 9 query heads over 3 KV
// heads of 64, alternated in one process, medians of 7), no request → the
// whole next run at once: two threads 10.6 → 12.7 GB/s with the cache
// evicted before each pass (as a decode step's weights evict it), 18.0 →
// 22.8 at a 4,096-token context, 18.3 → 17.9 warm; one thread 7.3 → 10.0
// evicted, 9.7 → 12.3 at 4,096. The whole run at once → a part per head
// (two runs, a slower hour): two threads at 4,096 18.3/18.2 → 21.0/20.3,
// evicted 13.4/13.4 → 14.5/13.7, warm 17.9/18.0 → 16.9/17.7; one thread at
// 4,096 8.9/11.7 → 11.7/13.6, evicted 10.7/9.3 → 12.0/10.5. Over an F32
// memory (each head four lines of a row) requests gained nothing (25.3 →
// 24.5 evicted, 31.1 → 32.5 at 4,096), and none are made.
func (p kvPlanes) ahead(pl kvcache.Plane, slots []int, t, lim, kvd int) []uint16 {
	h := p.kh
	if pl == kvcache.Values {
		h = p.vh
	}
	if h == nil {
		return nil
	}
	n := slotRun(slots, t, min(lim, t+halfRun))
	return h[slots[t]*kvd : (slots[t]+n)*kvd]
}

// prefetchPart asks for part i of n of h's bytes (partBounds).
func prefetchPart(h []uint16, i, n int) {
	if len(h) == 0 {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(h))), 2*len(h))
	lo, hi := partBounds(len(b), i, n)
	simd.Prefetch(b[lo:hi])
}

// partBounds is part i of n of [0, size): parts of equal size within a
// 64-byte line, each starting on a line (the first at 0), the last ending
// at size; together they cover [0, size) once.
func partBounds(size, i, n int) (lo, hi int) {
	lo, hi = size*i/n&^63, size*(i+1)/n&^63
	if i == n-1 {
		hi = size
	}
	return lo, hi
}

// rows is the rows of n consecutive slots from slot on, of plane pl, at
// stride kvd: the cache itself for an F32 memory, converted into buf (at
// least n·kvd long) for an F16 one.
func (p kvPlanes) rows(pl kvcache.Plane, slot, n, kvd int, buf []float32) []float32 {
	if p.k != nil {
		if pl == kvcache.Keys {
			return p.k[slot*kvd:]
		}
		return p.v[slot*kvd:]
	}
	b := buf[:n*kvd]
	p.kv.Read(pl, p.l, slot, b)
	return b
}

// attention computes softmax(QKᵀ/√d)·V for every row and query head,
// causally: a row at position p attends over positions [0, p] of its
// sequence, read from the cache slots (its own K/V included).
func (m *Model) attention(ws *workspace, kv *kvcache.Memory, l int, att, qkv mat, b *batch) {
	for len(ws.scratch) < m.cfg.Threads {
		ws.scratch = append(ws.scratch, nil)
	}
	var split, direct, gathered []int
	for si, s := range b.seqs {
		switch {
		case splitAttention && s.r1-s.r0 == 1 && b.pos[s.r0] < s.ctx:
			split = append(split, si)
		case s.r1-s.r0 <= directRows && m.cfg.Heads <= maxGroupHeads:
			direct = append(direct, si)
		default:
			gathered = append(gathered, si)
		}
	}
	if len(gathered) > 0 {
		m.attnGathered(ws, kv, l, att, qkv, b, gathered)
	}
	if len(direct) > 0 {
		m.attnDirect(ws, kv, l, att, qkv, b, direct)
	}
	if len(split) > 0 {
		m.attnSplit(ws, kv, l, att, qkv, b, split)
	}
}

// splitAttention is whether attention sends the sequences of one query
// row to attnSplit (else attnDirect); the tests compare the two.
var splitAttention = true

// A row's positions are cut into the fewest chunks of at most splitChunk
// positions, but into no more than splitTasks over the rows of the step
// (then longer ones): a step of one row gets up to splitTasks chunks, a
// step of splitTasks rows or more one per row. Chunk
// sizes are equal, rounded up to a multiple of 16 (a cache block). The
// chunking depends on the row's position and the number of rows alone,
// never on the number of threads.
const (
	splitChunk = 64
	splitTasks = 8
)

// splitChunks is the number of chunks and their size for a row attending
// over end positions in a step of rows single-row sequences.
func splitChunks(end, rows int) (n, size int) {
	n = min((end+splitChunk-1)/splitChunk, max(1, splitTasks/rows))
	size = ((end+n-1)/n + 15) &^ 15
	return (end + size - 1) / size, size
}

// attnSplit is the attention of sequences with one query row (decode),
// split over positions as well as sequences, as flash decoding does: a task
// is one chunk of consecutive positions of one sequence (splitChunks), over
// every query head. It streams the chunk's K and V rows from memory in order, once:
// each query head's pass after the first finds them in the cache (where
// attnDirect's task of one KV head reads a strided part of every row, and
// each of its query heads reads it again). The work spreads over the
// threads in equal chunks whatever the number of KV heads; with many
// sequences a task is one whole sequence. A task leaves,
// per head, the chunk's largest scaled score, the sum of its weights and
// its weighted values; a second pass merges each sequence's chunks. A
// sequence of one chunk is computed into the output directly, with
// attnDirect's operations in attnDirect's order (the same bits).
func (m *Model) attnSplit(ws *workspace, kv *kvcache.Memory, l int, att, qkv mat, b *batch, seqs []int) {
	hd, kvd, grp, nh := m.headDim, m.kvDim, m.group, m.cfg.Heads
	kp := planes(kv, l)
	k2 := float32(1/math.Sqrt(float64(hd))) * log2e
	first := ws.int(intChunks, len(seqs)+1) // the first task of seqs[i]
	tasks := 0
	for i, si := range seqs {
		s := b.seqs[si]
		first[i] = tasks
		n, _ := splitChunks(b.pos[s.r0]+1, len(seqs))
		tasks += n
	}
	first[len(seqs)] = tasks
	owner := ws.int(intChunkSeq, tasks) // the index in seqs of every task
	for i := range seqs {
		for ti := first[i]; ti < first[i+1]; ti++ {
			owner[ti] = i
		}
	}
	per := nh * (hd + 2) // a task's partials: every head's hd values, then every head's max and sum
	part := ws.f32(bufSplit, tasks*per)
	m.team.run(tasks, func(w, ti int) {
		i := owner[ti]
		s := b.seqs[seqs[i]]
		end := b.pos[s.r0] + 1
		n, size := splitChunks(end, len(seqs))
		c := ti - first[i]
		t0, t1 := c*size, min(end, (c+1)*size)
		row := qkv.row(s.r0)
		// sc[h*size+t-t0]: the score, then the weight, of head h at
		// position t; then every head's sum of weights; then the rows of
		// an F16 run converted.
		sc := ws.worker(w, nh*(size+1)+halfRun*kvd)
		sums, conv := sc[nh*size:nh*(size+1)], sc[nh*(size+1):]
		for t := t0; t < t1; {
			run := slotRun(s.slots, t, kp.end(t, t1))
			// The next run's keys, or after the last the first values,
			// asked for a part before each head (ahead's comment says why).
			var next []uint16
			if nx := t + run; nx < t1 {
				next = kp.ahead(kvcache.Keys, s.slots, nx, t1, kvd)
			} else {
				next = kp.ahead(kvcache.Values, s.slots, t0, t1, kvd)
			}
			ks := kp.run(kvcache.Keys, s.slots[t], run, kvd, conv)
			for h := range nh {
				prefetchPart(next, h, nh)
				ks.dot(sc[h*size+t-t0:h*size+t-t0+run], row[h*hd:(h+1)*hd], (h/grp)*hd)
			}
			t += run
		}
		p := part[ti*per : (ti+1)*per]
		for h := range nh {
			v := sc[h*size : h*size+t1-t0]
			mx := simd.Max(v) * k2
			sums[h] = simd.ExpSum(v, k2, mx)
			if n > 1 {
				p[nh*hd+2*h], p[nh*hd+2*h+1] = mx, sums[h]
			}
		}
		out := p[:nh*hd]
		if n == 1 {
			out = att.row(s.r0)[:nh*hd]
		}
		clear(out)
		for t := t0; t < t1; {
			run := slotRun(s.slots, t, kp.end(t, t1))
			// The next run's values, or after the last the next chunk's
			// first keys (this thread's next task, as a rule).
			var next []uint16
			if nx := t + run; nx < t1 {
				next = kp.ahead(kvcache.Values, s.slots, nx, t1, kvd)
			} else if t1 < end {
				next = kp.ahead(kvcache.Keys, s.slots, t1, end, kvd)
			}
			vs := kp.run(kvcache.Values, s.slots[t], run, kvd, conv)
			for h := range nh {
				prefetchPart(next, h, nh)
				vs.axpy(out[h*hd:(h+1)*hd], sc[h*size+t-t0:h*size+t-t0+run], (h/grp)*hd)
			}
			t += run
		}
		if n == 1 {
			for h := range nh {
				simd.Scale(out[h*hd:(h+1)*hd], 1/sums[h])
			}
		}
	})
	// Merge, on the calling goroutine (at most splitTasks chunks and the
	// sequences' heads: little work): every head's output is
	// Σ_c f_c·o_c / Σ_c f_c·sum_c with f_c = 2^(max_c − max over the chunks).
	for i, si := range seqs {
		if first[i+1]-first[i] == 1 {
			continue
		}
		chunks := part[first[i]*per : first[i+1]*per]
		orow := att.row(b.seqs[si].r0)
		var e [splitTasks]float64 // 2^(max_c − top) of every chunk
		for h := range nh {
			top := float32(math.Inf(-1))
			for c := 0; c < len(chunks); c += per {
				top = max(top, chunks[c+nh*hd+2*h])
			}
			var den float64
			for c, j := 0, 0; c < len(chunks); c, j = c+per, j+1 {
				e[j] = math.Exp2(float64(chunks[c+nh*hd+2*h] - top))
				den += e[j] * float64(chunks[c+nh*hd+2*h+1])
			}
			o := orow[h*hd : (h+1)*hd]
			clear(o)
			for c, j := 0, 0; c < len(chunks); c, j = c+per, j+1 {
				simd.Axpy(float32(e[j]/den), chunks[c+h*hd:c+(h+1)*hd], o)
			}
		}
	}
}

// attnDirect is the attention of sequences with few query rows (decode):
// it reads K and V straight from the cache slots, a run of consecutive
// slots (a block) at a time: simd.DotRows scores one query head against
// the run's keys and simd.AxpyRows adds the run's weighted values, both
// over rows at the cache's stride. With at least as many sequences as
// threads a task is one sequence over all KV heads; with fewer, a task is
// one sequence and one KV head, to use every core.
func (m *Model) attnDirect(ws *workspace, kv *kvcache.Memory, l int, att, qkv mat, b *batch, seqs []int) {
	hd, kvd, grp, kvh := m.headDim, m.kvDim, m.group, m.cfg.KVHeads
	kp := planes(kv, l)
	scale := float32(1 / math.Sqrt(float64(hd)))
	split := 1 // tasks per sequence
	if len(seqs) < m.cfg.Threads {
		split = kvh
	}
	gPer := kvh / split
	m.team.run(len(seqs)*split, func(w, ti int) {
		s := b.seqs[seqs[ti/split]]
		h0 := (ti % split) * gPer * grp
		nh := gPer * grp
		pos := b.pos[s.r0:s.r1]
		ctx := s.ctx
		// sc[(r*nh+h-h0)*ctx+t]: score of row r, head h, position t;
		// then the rows of an F16 run converted.
		sc := ws.worker(w, len(pos)*nh*ctx+halfRun*kvd)
		conv := sc[len(pos)*nh*ctx:]
		for t := 0; t < ctx; {
			run := slotRun(s.slots, t, kp.end(t, ctx))
			ks := kp.run(kvcache.Keys, s.slots[t], run, kvd, conv)
			for r, p := range pos {
				n := min(run, p+1-t)
				if n <= 0 {
					continue
				}
				row := qkv.row(s.r0 + r)
				for h := h0; h < h0+nh; h++ {
					i := (r*nh + h - h0) * ctx
					ks.dot(sc[i+t:i+t+n], row[h*hd:(h+1)*hd], (h/grp)*hd)
				}
			}
			t += run
		}
		var invs [directRows * maxGroupHeads]float32
		for r, p := range pos {
			orow := att.row(s.r0 + r)
			for h := h0; h < h0+nh; h++ {
				i := (r*nh + h - h0) * ctx
				invs[r*nh+h-h0] = softmaxPrefix(sc[i:i+p+1], p+1, scale)
				clear(orow[h*hd : (h+1)*hd])
			}
		}
		for t := 0; t < ctx; {
			run := slotRun(s.slots, t, kp.end(t, ctx))
			vs := kp.run(kvcache.Values, s.slots[t], run, kvd, conv)
			for r, p := range pos {
				n := min(run, p+1-t)
				if n <= 0 {
					continue
				}
				orow := att.row(s.r0 + r)
				for h := h0; h < h0+nh; h++ {
					i := (r*nh + h - h0) * ctx
					vs.axpy(orow[h*hd:(h+1)*hd], sc[i+t:i+t+n], (h/grp)*hd)
				}
			}
			t += run
		}
		for r := range pos {
			orow := att.row(s.r0 + r)
			for h := h0; h < h0+nh; h++ {
				simd.Scale(orow[h*hd:(h+1)*hd], invs[r*nh+h-h0])
			}
		}
	})
}

// slotRun is the number of positions from t (below n) whose slots follow
// slots[t] consecutively.
func slotRun(slots []int, t, n int) int {
	r := 1
	for t+r < n && slots[t+r] == slots[t]+r {
		r++
	}
	return r
}

// attnGathered is the attention of sequences with many query rows (prefill,
// blend): their K and V are gathered once per layer into contiguous
// buffers, and every task (a tile of query rows and one query head) runs
// simd.Attention, the fused flash-style kernel (scores, online softmax and
// weighted values block by block, matrix multiplies on the SIMD kernels).
func (m *Model) attnGathered(ws *workspace, kv *kvcache.Memory, l int, att, qkv mat, b *batch, seqs []int) {
	hd, kvh, kvd := m.headDim, m.cfg.KVHeads, m.kvDim
	kp := planes(kv, l)

	// Gather every sequence's K transposed to [kvh][hd][ctx] (scores are
	// q·Kᵀ with K as the right operand) and V as [kvh][ctx][hd] (the right
	// operand of the weighted sum).
	total := 0
	for _, si := range seqs {
		total += b.seqs[si].ctx * kvd
	}
	kvAll := ws.f32(bufMix, 2*total) // the MLP's buffer too (bufMix)
	ktAll, vAll := kvAll[:total:total], kvAll[total:]
	offs := ws.int(intRows, len(seqs)+1) // offs[j]: start of seqs[j]
	offs[0] = 0
	for j, si := range seqs {
		offs[j+1] = offs[j] + b.seqs[si].ctx*kvd
	}
	const gatherChunk = 256
	type gtask struct{ seq, t0 int }
	nt := 0
	for _, si := range seqs {
		nt += (b.seqs[si].ctx + gatherChunk - 1) / gatherChunk
	}
	gts := make([]gtask, 0, nt)
	for j, si := range seqs {
		for t0 := 0; t0 < b.seqs[si].ctx; t0 += gatherChunk {
			gts = append(gts, gtask{j, t0})
		}
	}
	m.team.run(len(gts), func(w, ti int) {
		conv := ws.worker(w, 2*kvd) // an F16 slot's K and V converted
		g := gts[ti]
		s := b.seqs[seqs[g.seq]]
		ctx := s.ctx
		kt := ktAll[offs[g.seq]:offs[g.seq+1]]
		vv := vAll[offs[g.seq]:offs[g.seq+1]]
		t1 := min(ctx, g.t0+gatherChunk)
		for t := g.t0; t < t1; t++ {
			slot := s.slots[t]
			src := kp.rows(kvcache.Keys, slot, 1, kvd, conv)[:kvd]
			for h := range kvh {
				base := h*hd*ctx + t
				for dd, v := range src[h*hd : (h+1)*hd] {
					kt[base+dd*ctx] = v
				}
			}
			vsrc := kp.rows(kvcache.Values, slot, 1, kvd, conv[kvd:])[:kvd]
			for h := range kvh {
				copy(vv[(h*ctx+t)*hd:(h*ctx+t+1)*hd], vsrc[h*hd:(h+1)*hd])
			}
		}
	})

	// Row tiles: consecutive rows of one sequence, at most maxTile rows
	// spanning at most maxSpan positions (sparse important sets waste
	// little on masked scores).
	type atask struct{ seq, r0, r1 int }
	var tiles []atask
	for j, si := range seqs {
		s := b.seqs[si]
		for r := s.r0; r < s.r1; {
			r1 := r + 1
			for r1 < s.r1 && r1-r < maxTile && b.pos[r1]-b.pos[r] < maxSpan {
				r1++
			}
			tiles = append(tiles, atask{seq: j, r0: r, r1: r1})
			r = r1
		}
	}
	scale := float32(1 / math.Sqrt(float64(hd)))
	lims := ws.int(intLim, len(b.pos))
	for i, p := range b.pos {
		lims[i] = p + 1
	}
	// One task is a tile and a KV head: the group's query heads are stacked
	// as group×nr rows of one Attention call, so the K/V of the tile's
	// keys are read once for the group (grouped-query attention) instead of
	// once per query head. slims holds each tile's limits repeated per
	// head: rows [grp*r0, grp*r1) are head 0's nr limits, then head 1's, …
	grp := m.group
	slims := ws.int(intLimStack, grp*len(b.pos))
	for _, tk := range tiles {
		nr := tk.r1 - tk.r0
		for j := range grp {
			copy(slims[grp*tk.r0+j*nr:grp*tk.r0+(j+1)*nr], lims[tk.r0:tk.r1])
		}
	}
	m.team.run(len(tiles)*kvh, func(w, ti int) {
		// Latest (most expensive) tiles first, so the cheap ones balance
		// the threads at the end.
		tk := tiles[len(tiles)-1-ti/kvh]
		g := ti % kvh
		ctx := b.seqs[seqs[tk.seq]].ctx
		nr := tk.r1 - tk.r0
		base := offs[tk.seq] + g*hd*ctx
		buf := ws.worker(w, 2*grp*nr*hd)
		qs, os := buf[:grp*nr*hd], buf[grp*nr*hd:]
		for j := range grp {
			q := qkv.view(tk.r0, (g*grp+j)*hd, nr, hd)
			for r := range nr {
				copy(qs[(j*nr+r)*hd:(j*nr+r+1)*hd], q.row(r))
			}
		}
		simd.Attention(grp*nr, hd, qs, hd, ktAll[base:base+hd*ctx], ctx, vAll[base:base+ctx*hd], hd,
			slims[grp*tk.r0:grp*tk.r1], scale, os, hd)
		for j := range grp {
			o := att.view(tk.r0, (g*grp+j)*hd, nr, hd)
			for r := range nr {
				copy(o.row(r), os[(j*nr+r)*hd:(j*nr+r+1)*hd])
			}
		}
	})
}
