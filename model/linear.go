package model

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cacheblend/cacheblend/offheap"
	"github.com/cacheblend/cacheblend/quant"
	"github.com/cacheblend/cacheblend/simd"
)

// qmat is a weight computed straight from its file bytes (docs/design.md
// §12): out rows of in elements of one ggml type, each row a slice of the
// memory-mapped file (never copied to float32 as a whole). A projection
// stacked from several tensors (Q|K|V, gate|up), a row permutation (the
// Q/K rows of a llama file, see unpermute), a tensor-parallel slice (a
// subset of rows or of columns) are all just other spans of rows over the
// same bytes (rowSpan: a start, a stride, a count). A product writes the
// slice headers of a run of at most manyRun rows into a task's buffer
// (rowsInto) for the quant kernels, so the model keeps no header per row
// (24 bytes a row: 12 MB at Qwen2.5-0.5B, most of it the embedding's
// 151,936 rows, read from memory at every decode step).
//
// As the right operand of a product x·Wᵀ, output column j of the product
// is row j. Decode-sized products (at most qIntRows rows of x) with
// quantized weights, where quant.IntegerDots says the integer kernels run
// in assembly, quantize x once (Q8_K for the K-quants, Q8_0 for the
// 32-element formats) and dot every weight row with it in integers, as
// llama.cpp does (quant.DotQ8KRowsMany/DotQ80RowsMany: each weight block
// unpacked once for up to four rows of x, one kernel call for a run of a
// task's weight rows; for one row quant.DotQ8KMany/DotQ80Many, see
// manyRows — also where quant.IntegerGEMV says only these run in
// assembly: at the AVX2 level).
// F16 and BF16 weights (where quant.TileKernels holds) take quant.DotTile
// for 2 to qRowDots rows of x: tiles of four weight rows by four rows of x
// (two by eight for rows shorter than 2 KiB, prefetching the next tile),
// each weight vector converted once in registers for all of them; one row
// of x takes quant.DotMany at every width (see manyRows).
// Otherwise at most qDotRows rows of x take the fused float kernels
// (quant.Dot per weight row, quant.DotMany per task for one row of x); up
// to qRowDots rows dequantize a panel of
// weight rows once and multiply it with every row of x (simd.DotTile);
// larger products dequantize panels of qPanel rows and run simd's F32
// GEMM, so the dequantization is amortised over every row of x. The
// matrix-vector paths cut the weight rows into four spans per thread
// (dotChunk).
//
// A stacked projection may mix types (a Q4_K_M file keeps attn_v in Q6_K in
// some layers while Q and K are Q4_K): mixed is then set, each span has its
// type and t is meaningless; products split the rows into runs of one type.
type qmat struct {
	t     quant.Type
	in    int
	n     int // rows
	spans []rowSpan
	mixed bool // the spans' types differ
	// pairRows > 0: some consecutive spans are the two halves of a group
	// of pairRows rows stored interleaved (the first span's rows at even
	// positions, the second's at odd: unpermute's heads), which
	// storageRowsInto hands over in memory order.
	pairRows int
	// runs caches a mixed qmat's rows [0, n) cut into runs of one type
	// (typeRuns), made at the first product over all of them: a product
	// sliced them anew at every call, garbage the heap grew by.
	runs atomic.Pointer[[]*qmat]
}

// rowSpan is rows [first, first+n) of a qmat, all of type t: row first+i
// is data[i·stride:][:rb].
type rowSpan struct {
	data       []byte // from the first row's start
	first, n   int
	stride, rb int
	t          quant.Type
}

// row is row i of the span (0 ≤ i < n).
func (sp *rowSpan) row(i int) []byte {
	o := i * sp.stride
	return sp.data[o : o+sp.rb : o+sp.rb]
}

// spanAt is the index of the span holding row r.
func (q *qmat) spanAt(r int) int {
	i, _ := slices.BinarySearchFunc(q.spans, r, func(sp rowSpan, r int) int {
		switch {
		case r < sp.first:
			return 1
		case r >= sp.first+sp.n:
			return -1
		}
		return 0
	})
	return i
}

// typeAt is row r's type.
func (q *qmat) typeAt(r int) quant.Type {
	if !q.mixed {
		return q.t
	}
	return q.spans[q.spanAt(r)].t
}

// rowAt is row r's bytes.
func (q *qmat) rowAt(r int) []byte {
	sp := &q.spans[q.spanAt(r)]
	return sp.row(r - sp.first)
}

// typeRunEnd is the end of the run of rows of row r's type that starts at
// r, at most limit.
func (q *qmat) typeRunEnd(r, limit int) int {
	s := q.spanAt(r)
	t := q.spans[s].t
	for s < len(q.spans) && q.spans[s].t == t && q.spans[s].first < limit {
		s++
	}
	return min(limit, q.spans[s-1].first+q.spans[s-1].n)
}

// typeRuns returns q's rows cut into runs of one type (sliceRows), made
// once. Safe for concurrent use (two first calls may both make them; one
// is kept).
func (q *qmat) typeRuns() []*qmat {
	if p := q.runs.Load(); p != nil {
		return *p
	}
	var runs []*qmat
	for r := 0; r < q.n; {
		e := q.typeRunEnd(r, q.n)
		runs = append(runs, q.sliceRows(r, e))
		r = e
	}
	q.runs.CompareAndSwap(nil, &runs)
	return *q.runs.Load()
}

// rowsInto writes the slice headers of rows [r0, r1) into buf (reused from
// its start; grown when short) and returns them.
func (q *qmat) rowsInto(buf [][]byte, r0, r1 int) [][]byte {
	buf = slices.Grow(buf[:0], r1-r0)
	for s, r := q.spanAt(r0), r0; r < r1; s++ {
		sp := &q.spans[s]
		e := min(r1, sp.first+sp.n)
		o := (r - sp.first) * sp.stride
		for ; r < e; r++ {
			buf = append(buf, sp.data[o:o+sp.rb:o+sp.rb])
			o += sp.stride
		}
	}
	return buf
}

// withSpans returns a qmat of rows of in elements over spans (renumbered from
// row 0 in order), its type the first span's and mixed when they differ.
func withSpans(in int, spans []rowSpan) *qmat {
	q := &qmat{in: in, spans: spans}
	for i := range spans {
		spans[i].first = q.n
		q.n += spans[i].n
		q.mixed = q.mixed || spans[i].t != spans[0].t
	}
	if len(spans) > 0 {
		q.t = spans[0].t
	}
	for i := 0; i+1 < len(spans); i++ {
		if interleaved(&spans[i], &spans[i+1]) {
			q.pairRows = 2 * spans[i].n
			break
		}
	}
	return q
}

// interleaved reports whether spans a and b are the even and odd rows of
// one run of 2·a.n rows stored back to back.
func interleaved(a, b *rowSpan) bool {
	return a.n > 0 && a.n == b.n && a.t == b.t && a.rb == b.rb && a.stride == 2*a.rb && b.stride == a.stride &&
		len(a.data) > a.rb && unsafe.SliceData(b.data) == &a.data[a.rb]
}

// storageRowsInto writes the slice headers of rows [r0, r1) into buf as
// rowsInto does, except that the rows of two interleaved spans (see
// pairRows) lying wholly inside [r0, r1) come in memory order. inOrder
// reports that no row moved; idx (reused from its backing array) is
// written only when one did: idx[i] is then the row (− r0) of header i.
// A range with no interleaved pair costs what rowsInto does.
func (q *qmat) storageRowsInto(buf [][]byte, idx []int32, r0, r1 int) (_ [][]byte, _ []int32, inOrder bool) {
	buf, idx = slices.Grow(buf[:0], r1-r0), idx[:0]
	inOrder = true
	for s, r := q.spanAt(r0), r0; r < r1; s++ {
		sp := &q.spans[s]
		if r == sp.first && s+1 < len(q.spans) && sp.first+2*sp.n <= r1 && interleaved(sp, &q.spans[s+1]) {
			if inOrder { // the rows before did not move
				idx = slices.Grow(idx, r1-r0)
				for i := range len(buf) {
					idx = append(idx, int32(i))
				}
				inOrder = false
			}
			b := &q.spans[s+1]
			for i := range sp.n {
				buf = append(buf, sp.row(i), b.row(i))
				idx = append(idx, int32(sp.first+i-r0), int32(b.first+i-r0))
			}
			r = b.first + b.n
			s++
			continue
		}
		e := min(r1, sp.first+sp.n)
		buf = appendRows(buf, sp, r-sp.first, e-r)
		if !inOrder {
			for ; r < e; r++ {
				idx = append(idx, int32(r-r0))
			}
		}
		r = e
	}
	return buf, idx, inOrder
}

// appendRows appends the headers of n rows of sp from row i on: one bounds
// check for the run, then headers made from the span's base pointer (a
// three-index slice per row, each checked, took 3 % of a SmolLM2-135M
// decode step's CPU).
func appendRows(buf [][]byte, sp *rowSpan, i, n int) [][]byte {
	if n <= 0 {
		return buf
	}
	o := i * sp.stride
	if i < 0 || o+(n-1)*sp.stride+sp.rb > len(sp.data) {
		panic(fmt.Sprintf("model: rows %d..%d of a span of %d bytes", i, i+n, len(sp.data)))
	}
	base := unsafe.Pointer(unsafe.SliceData(sp.data))
	at := len(buf)
	buf = slices.Grow(buf, n)[:at+n]
	for k := range buf[at:] {
		buf[at+k] = unsafe.Slice((*byte)(unsafe.Add(base, o)), sp.rb)
		o += sp.stride
	}
	return buf
}

const (
	qDotRows = 2
	qIntRows = 8
	qRowDots = 32
	qPanel   = 64
)

// qScratch recycles the dequantized panels (qPanel × in floats);
// roundScratch the rounded copies of the activations (m × in floats: a
// prefill chunk's are 10 MiB at Qwen2.5's 4,864-wide down projection);
// qPacked the packed activations of qgemm's prefill path (as many). Apart,
// because a panel-sized buffer drawn for a copy was dropped and a new one
// allocated on nearly every F16/BF16 prefill product. Outside the Go heap
// (package offheap): on the heap, in sync.Pools, the collector counted
// them as live — twice their size of resident memory with GOGC=100 — and
// dropped them at every collection, to be allocated again.
var qScratch, roundScratch, qPacked offheap.Pool

// newQmat builds the qmat of a tensor of out rows × in elements of type t
// stored back to back in data.
func newQmat(t quant.Type, in, out int, data []byte) (*qmat, error) {
	rb, err := t.RowBytes(in)
	if err != nil {
		return nil, err
	}
	if len(data) != rb*out {
		return nil, fmt.Errorf("%w: %d bytes for %d rows of %d %s elements (want %d)", ErrBadConfig, len(data), out, in, t, rb*out)
	}
	return withSpans(in, []rowSpan{{data: data, n: out, stride: rb, rb: rb, t: t}}), nil
}

// stack returns the rows of qs one after the other (all must have the same
// row length; types may differ).
func stack(qs ...*qmat) (*qmat, error) {
	var spans []rowSpan
	for _, q := range qs {
		if q.in != qs[0].in {
			return nil, fmt.Errorf("%w: cannot stack %s×%d rows with %s×%d rows", ErrBadConfig, q.t, q.in, qs[0].t, qs[0].in)
		}
		spans = append(spans, q.spans...)
	}
	return withSpans(qs[0].in, slices.Clip(spans)), nil
}

// sliceRows returns rows [r0, r1).
func (q *qmat) sliceRows(r0, r1 int) *qmat {
	if r0 == r1 {
		return &qmat{t: q.t, in: q.in}
	}
	var spans []rowSpan
	for s := q.spanAt(r0); r0 < r1; s++ {
		sp := q.spans[s]
		e := min(r1, sp.first+sp.n)
		sp.data = sp.data[(r0-sp.first)*sp.stride:]
		sp.n = e - r0
		spans = append(spans, sp)
		r0 = e
	}
	return withSpans(q.in, spans)
}

// sliceCols returns every row cut to elements [c0, c1), which must fall on
// the blocks of every row's type.
func (q *qmat) sliceCols(c0, c1 int) (*qmat, error) {
	spans := slices.Clone(q.spans)
	for i := range spans {
		sp := &spans[i]
		bs := sp.t.BlockSize()
		if c0%bs != 0 || c1%bs != 0 {
			return nil, fmt.Errorf("%w: columns [%d, %d) of a %s weight do not fall on its %d-element blocks", ErrBadConfig, c0, c1, sp.t, bs)
		}
		b0, b1 := c0/bs*sp.t.TypeSize(), c1/bs*sp.t.TypeSize()
		sp.data, sp.rb = sp.data[b0:], b1-b0
	}
	return withSpans(c1-c0, spans), nil
}

// unpermute undoes, for heads heads of hd rows, the llama converter's
// permutation of Q and K (file row h·hd + 2i (+1) is Hugging Face row
// h·hd + i (+ hd/2)): each head's two halves become spans of every other
// file row. q must be one tensor's rows (one span).
func (q *qmat) unpermute(heads, hd int) (*qmat, error) {
	if len(q.spans) != 1 || q.n != heads*hd || hd%2 != 0 {
		return nil, fmt.Errorf("%w: cannot unpermute %d rows in %d spans as %d heads of %d", ErrBadConfig, q.n, len(q.spans), heads, hd)
	}
	sp := q.spans[0]
	spans := make([]rowSpan, 0, 2*heads)
	for h := range heads {
		for half := range 2 {
			spans = append(spans, rowSpan{data: sp.data[(h*hd+half)*sp.stride:], n: hd / 2, stride: 2 * sp.stride, rb: sp.rb, t: sp.t})
		}
	}
	return withSpans(q.in, spans), nil
}

// row dequantizes row r into dst (len in).
func (q *qmat) row(r int, dst []float32) {
	if err := quant.DequantizeRow(q.typeAt(r), q.rowAt(r), dst); err != nil {
		panic(fmt.Sprintf("model: dequantize row %d of a %s weight: %v", r, q.typeAt(r), err)) // sizes checked at load
	}
}

// qgemm computes c = a·Wᵀ (c += … when acc) for the rows [off, off+c.cols)
// of q on the team's threads; a is [m × q.in].
func qgemm(tm *team, c, a mat, q *qmat, off int, acc bool) {
	m, n, k := c.rows, c.cols, q.in
	if m == 0 || n == 0 {
		return
	}
	if q.mixed { // mixed types: each run of one type on its own
		// With the integer GEMM, one quantization of a serves every run
		// whose type it fits (Q4_K|Q6_K, Q5_0|Q8_0 in a Q4_K_M file).
		var x *quant.GemmTiles
		if t0 := q.typeAt(off); m > qIntRows && intGemm(t0, k) {
			x = quantizeTiles(tm, a, t0, k)
			defer gemmTilesPool.put(x)
		}
		var runs []*qmat
		if off == 0 && n == q.n {
			runs = q.typeRuns()
		}
		for j0, r := 0, 0; j0 < n; r++ {
			var run *qmat
			if runs != nil {
				run = runs[r]
			} else {
				run = q.sliceRows(off+j0, q.typeRunEnd(off+j0, off+n))
			}
			j1 := j0 + run.n
			if x != nil && x.Fits(run.t) {
				gemmPanels(tm, c.view(0, j0, m, j1-j0), x, run, acc)
			} else {
				qgemm(tm, c.view(0, j0, m, j1-j0), a, run, 0, acc)
			}
			j0 = j1
		}
		return
	}
	kq := quant.SupportsQ8K(q.t) && k%quant.QK_K == 0
	zq := quant.SupportsQ80(q.t) && k%quant.QK8_0 == 0
	if m == 1 && quant.IntegerGEMV(q.t) && (kq || zq) {
		// Decode of one sequence: a quantized once, each task's weight
		// rows dotted with it by one kernel call (quant.DotQ8KMany,
		// DotQ80Many: at SmolLM2's 576 columns a call per row cost as
		// much as its dot).
		ia := intActPool.get()
		defer intActPool.put(ia)
		var err error
		if kq {
			err = ia.k1.Quantize(a.row(0)[:k])
		} else {
			err = ia.z1.Quantize(a.row(0)[:k])
		}
		if err != nil {
			panic(fmt.Sprintf("model: %v", err)) // k checked above
		}
		manyRows(tm, c, q, off, acc, func(ws [][]byte, out []float32) {
			if kq {
				quant.DotQ8KMany(q.t, ws, &ia.k1, out)
			} else {
				quant.DotQ80Many(q.t, ws, &ia.z1, out)
			}
		})
		return
	}
	if m <= qIntRows && quant.IntegerGEMV(q.t) && (kq || zq) {
		// Decode (one sequence or a batch) with quantized weights: the
		// rows of a quantized once (Q8_K for the K-quants, Q8_0 for the
		// 32-element formats) in groups of up to four, each weight block
		// unpacked once per group and dotted with its rows in integers
		// (AVX-512 VNNI, or AVX2's VPMADDUBSW), as llama.cpp computes it.
		const g4 = quant.Q8KRowsMax // = quant.Q80RowsMax
		groups := (m + g4 - 1) / g4
		ia := intActPool.get()
		defer intActPool.put(ia)
		var rowBuf [g4][]float32
		for g := range groups {
			rows := rowBuf[:0]
			for i := g * g4; i < min(m, (g+1)*g4); i++ {
				rows = append(rows, a.row(i)[:k])
			}
			var err error
			if kq {
				err = ia.kr[g].Quantize(rows...)
			} else {
				err = ia.zr[g].Quantize(rows...)
			}
			if err != nil {
				panic(fmt.Sprintf("model: %v", err)) // k checked above
			}
		}
		// Each task's weight rows go to one kernel call per group and run
		// of at most manyRun rows (quant.DotQ8KRowsMany, DotQ80RowsMany).
		// The rows come in memory order (storageRowsInto, as manyRows):
		// when they moved, idx[i] is the column of header i.
		chunk, run := runLengths(q, n, tm.threads)
		tm.run((n+chunk-1)/chunk, func(_, t int) {
			buf := rowsBufs.Get().(*[manyRun * g4]float32)
			defer rowsBufs.Put(buf)
			hdr := rowHeaders.Get().(*[][]byte)
			defer rowHeaders.Put(hdr)
			idx := rowIndices.Get().(*[]int32)
			defer rowIndices.Put(idx)
			for j0 := t * chunk; j0 < min(n, (t+1)*chunk); j0 += run {
				j1 := min(n, (t+1)*chunk, j0+run)
				ws, ix, _ := q.storageRowsInto(*hdr, *idx, off+j0, off+j1)
				*hdr, *idx = ws, ix
				for g := range groups {
					R := min(g4, m-g*g4)
					if kq {
						quant.DotQ8KRowsMany(q.t, ws, &ia.kr[g], buf[:])
					} else {
						quant.DotQ80RowsMany(q.t, ws, &ia.zr[g], buf[:])
					}
					scatterRows(c, g*g4, R, j0, j1-j0, buf[:], ix, acc)
				}
			}
		})
		return
	}
	if intGemm(q.t, k) {
		// A prefill (or a decode batch of more than qIntRows rows) with
		// Q4_K, Q6_K, Q8_0, Q5_0 or Q4_0 weights: the integer GEMM.
		x := quantizeTiles(tm, a, q.t, k)
		defer gemmTilesPool.put(x)
		gemmPanels(tm, c, x, q.sliceRows(off, off+n), acc)
		return
	}
	if r := activationRounding(q.t); r != roundNone {
		// The activations llama.cpp multiplies (see actround.go), in a copy.
		rb := roundScratch.Get(m * k)
		defer roundScratch.Put(rb)
		ra := dense(rb, m, k)
		const chunk = 16
		tm.run((m+chunk-1)/chunk, func(_, t int) {
			for i := t * chunk; i < min(m, (t+1)*chunk); i++ {
				row := ra.row(i)
				copy(row, a.row(i)[:k])
				roundRow(r, row)
			}
		})
		a = ra
	}
	// One row: quant.DotMany at every width. Wide F16 rows (Qwen2.5-0.5B's
	// 4,864-column and Llama-3.2-1B's 8,192-column down projections) went
	// through the four-row tiles until the Many kernels asked for their rows
	// ahead (quant's streamAhead); since, switched in one process (2 threads,
	// 8 alternated rounds of 40 decode steps after 512 tokens), the one-row
	// kernel made the Qwen2.5-0.5B F16 step 10–11 % faster (8 of 8 rounds)
	// and Llama-3.2-1B F16's 1–3 % (8 of 8).
	if m == 1 {
		x := a.row(0)[:k]
		manyRows(tm, c, q, off, acc, func(ws [][]byte, out []float32) { quant.DotMany(q.t, ws, x, out) })
		return
	}
	tiles := quant.TileKernels(q.t, k)
	if m <= qRowDots && tiles {
		// A decode batch of F16 or BF16 weights: each task's rows in
		// quant.DotTile's tiles (four rows against up to four activation
		// rows, or two against eight), every weight vector converted once
		// for them (no dequantized copy).
		// Rows in memory order (storageRowsInto, as manyRows); a run
		// whose rows moved goes through a buffer and is scattered.
		chunk, run := runLengths(q, n, tm.threads)
		tm.run((n+chunk-1)/chunk, func(_, t int) {
			hdr := rowHeaders.Get().(*[][]byte)
			defer rowHeaders.Put(hdr)
			idx := rowIndices.Get().(*[]int32)
			defer rowIndices.Put(idx)
			var buf *[manyRun * qRowDots]float32
			defer func() {
				if buf != nil {
					tileBufs.Put(buf)
				}
			}()
			for j0 := t * chunk; j0 < min(n, (t+1)*chunk); j0 += run {
				j1 := min(n, (t+1)*chunk, j0+run)
				ws, ix, inOrder := q.storageRowsInto(*hdr, *idx, off+j0, off+j1)
				*hdr, *idx = ws, ix
				if inOrder {
					quant.DotTile(q.t, ws, a.data, a.stride, m, k, c.data[j0:], c.stride, acc)
					continue
				}
				if buf == nil {
					buf = tileBufs.Get().(*[manyRun * qRowDots]float32)
				}
				nr := j1 - j0
				quant.DotTile(q.t, ws, a.data, a.stride, m, k, buf[:], nr, false)
				for i := range m {
					scatterColumn(c.data[i*c.stride+j0:i*c.stride+j1], buf[i*nr:(i+1)*nr], 1, ix, acc)
				}
			}
		})
		return
	}
	if m <= qDotRows {
		chunk := dotChunk(n, tm.threads)
		tm.run((n+chunk-1)/chunk, func(_, t int) {
			for j := t * chunk; j < min(n, (t+1)*chunk); j++ {
				w := q.rowAt(off + j)
				for i := range m {
					v := quant.Dot(q.t, w, a.row(i)[:k])
					if acc {
						c.data[i*c.stride+j] += v
					} else {
						c.data[i*c.stride+j] = v
					}
				}
			}
		})
		return
	}
	if m <= qRowDots {
		// A few rows (a decode batch): a panel of weight rows is
		// dequantized once into a worker's scratch (sized for L2) and
		// multiplied with every row of a by simd.DotTile (4×4 tiles of
		// dots: one pass over the weights for the whole batch, every load
		// feeding four FMAs, and no packing, which would cost as much as
		// the product).
		pr := min(qPanel, max(16, (1<<16)/k/16*16))
		ld := k + 16 // rows 4 KiB apart would share L1 sets
		// Each task takes a span of panels (see dotChunk).
		span := (dotChunk(n, tm.threads) + pr - 1) / pr * pr
		tm.run((n+span-1)/span, func(_, t int) {
			need := pr*ld + m*pr
			sb := qScratch.Get(max(need, qPanel*k))
			defer qScratch.Put(sb)
			for j0 := t * span; j0 < min(n, (t+1)*span); j0 += pr {
				j1 := min(n, j0+pr, (t+1)*span)
				buf := sb[:(j1-j0)*ld]
				for j := j0; j < j1; j++ {
					q.row(off+j, buf[(j-j0)*ld:(j-j0)*ld+k])
				}
				if !acc {
					simd.DotTile(c.data[j0:], c.stride, a.data, a.stride, m, buf, ld, j1-j0, k)
					continue
				}
				tmp := sb[(j1-j0)*ld : (j1-j0)*ld+m*(j1-j0)]
				simd.DotTile(tmp, j1-j0, a.data, a.stride, m, buf, ld, j1-j0, k)
				for i := range m {
					dst := c.data[i*c.stride+j0 : i*c.stride+j1]
					for j, v := range tmp[i*(j1-j0) : (i+1)*(j1-j0)] {
						dst[j] += v
					}
				}
			}
		})
		return
	}
	// Many rows (a prefill): the product is computed transposed, cᵀ = W·aᵀ,
	// so the weight panel is the GEMM's left operand, read in place by its
	// micro-kernel, and only a — packed once per call — and each panel's
	// m×qPanel result are transposed (packing every weight panel instead
	// cost 15% of a prefill: n·k scalar moves against m·k + m·n).
	pk := qPacked.Get(simd.PackedBLen(k, m))
	pa := simd.NewPackedB(pk, k, m)
	tm.run(pa.Panels(), func(_, p int) { pa.PackPanel(p, a.data, a.stride, true) })
	ld := k + 16   // weight rows 4 KiB apart would share L1 sets
	const mc = 256 // columns of aᵀ per product: ≤ 8 panels, A read in place
	tm.run((n+qPanel-1)/qPanel, func(_, t int) {
		j0, j1 := t*qPanel, min(n, (t+1)*qPanel)
		nr := j1 - j0
		need := nr*ld + qPanel*mc
		sb := qScratch.Get(max(need, qPanel*k))
		buf := sb[:nr*ld]
		ct := sb[nr*ld : nr*ld+qPanel*mc]
		for j := j0; j < j1; j++ {
			q.row(off+j, buf[(j-j0)*ld:(j-j0)*ld+k])
		}
		for i0 := 0; i0 < m; i0 += mc {
			i1 := min(m, i0+mc)
			w := i1 - i0
			pa.Gemm(nr, buf, ld, i0, i1, ct, w, false)
			for i := range w {
				row := c.data[(i0+i)*c.stride+j0 : (i0+i)*c.stride+j1]
				if acc {
					for jj := range row {
						row[jj] += ct[jj*w+i]
					}
				} else {
					for jj := range row {
						row[jj] = ct[jj*w+i]
					}
				}
			}
		}
		qScratch.Put(sb)
	})
	qPacked.Put(pk)
}

// intGemm reports whether products of more than qIntRows activation rows
// with k-column weights of type t run the integer GEMM: faster than the
// float GEMM and without dequantizing, where the kernels run in assembly
// (quant.IntegerGEMM: AVX-512 VNNI, or AVX2).
func intGemm(t quant.Type, k int) bool {
	return quant.IntegerGEMM() && (quant.SupportsQ8K(t) && k%quant.QK_K == 0 || quant.SupportsQ80(t) && k%quant.QK8_0 == 0)
}

// sharedTiles quantizes a once for the integer GEMMs of several products
// with weight w's type (the MLP's two gate|up halves): nil when w does not
// go through the integer GEMM at a's rows (a's rows are then quantized, or
// rounded, per product as gemm does). The caller puts non-nil tiles back
// in gemmTilesPool.
func sharedTiles(tm *team, a mat, w mat) *quant.GemmTiles {
	q := w.q
	if q == nil || q.mixed || a.rows <= qIntRows || !intGemm(q.t, q.in) {
		return nil
	}
	return quantizeTiles(tm, a, q.t, q.in)
}

// gemmTiles is gemm(tm, c, a, w, true, acc) with a's rows already
// quantized in x (sharedTiles; nil: not quantized).
func gemmTiles(tm *team, c, a, w mat, x *quant.GemmTiles, acc bool) {
	if x == nil || w.q == nil || w.q.mixed || !x.Fits(w.q.t) {
		gemm(tm, c, a, w, true, acc)
		return
	}
	gemmPanels(tm, c, x, w.q, acc)
}

// quantizeTiles quantizes the rows of a (k columns) for the integer GEMM
// with weights of type t (and every type the tiles fit), in tiles of six
// rows on the team's threads. The caller puts the tiles back in
// gemmTilesPool.
func quantizeTiles(tm *team, a mat, t quant.Type, k int) *quant.GemmTiles {
	m := a.rows
	x := gemmTilesPool.get()
	if err := x.Reset(t, m, k); err != nil {
		panic(fmt.Sprintf("model: %v", err)) // k checked by intGemm
	}
	const tr = quant.GemmTileRows
	tm.run(x.Tiles(), func(_, t int) {
		var rows [tr][]float32
		nr := min(tr, m-t*tr)
		for i := range nr {
			rows[i] = a.row(t*tr + i)[:k]
		}
		if err := x.QuantizeTile(t, rows[:nr]...); err != nil {
			panic(fmt.Sprintf("model: %v", err))
		}
	})
	return x
}

// gemmPanels computes c = a·Wᵀ (c += … when acc) for the rows of q (one
// type, which x fits) from a's quantized tiles x: each task unpacks a
// panel of 32 weight rows to bytes and multiplies every tile with it in
// integers.
func gemmPanels(tm *team, c mat, x *quant.GemmTiles, q *qmat, acc bool) {
	const tr, pr = quant.GemmTileRows, quant.GemmPanelRows
	m, n := c.rows, c.cols
	tm.run((n+pr-1)/pr, func(_, t int) {
		j0, j1 := t*pr, min(n, (t+1)*pr)
		p := gemmPanelPool.get()
		defer gemmPanelPool.put(p)
		var hdr [pr][]byte
		if err := p.Pack(q.t, q.rowsInto(hdr[:0], j0, j1), q.in); err != nil {
			panic(fmt.Sprintf("model: %v", err)) // sizes checked at load
		}
		for ti := range x.Tiles() {
			i0 := ti * tr
			quant.Gemm(p, x, ti, min(tr, m-i0), c.data[i0*c.stride+j0:], c.stride, acc)
		}
	})
}

// manyRows computes row 0 of c = a·Wᵀ (c += … when acc) for a single row
// of a: each task takes a span of the weight rows (dotChunk) and hands
// them to dots in runs of at most manyRun, whose results go straight into
// c (or through a pooled buffer when acc: one on the stack escaped to the
// heap, as dots is a function value, and made a decode step's garbage).
// Rows are handed over in the order they lie in memory (storageRowsInto):
// a llama file's Q and K heads, read in their logical order, jump every
// other row, which the hardware prefetchers do not follow (F16 rows of
// 2,048 columns on one core: 23 GB/s in order, 10 every other row); their
// results are then scattered to their columns through the buffer. The
// products are the same, row for row: only their order changes. The decode
// batch paths (quant.DotQ8KRowsMany/DotQ80RowsMany, quant.DotTile) take
// their rows the same way.
func manyRows(tm *team, c mat, q *qmat, off int, acc bool, dots func(ws [][]byte, out []float32)) {
	n := c.cols
	chunk, run := runLengths(q, n, tm.threads)
	tm.run((n+chunk-1)/chunk, func(_, t int) {
		var buf *[manyRun]float32
		defer func() {
			if buf != nil {
				manyBufs.Put(buf)
			}
		}()
		hdr := rowHeaders.Get().(*[][]byte)
		defer rowHeaders.Put(hdr)
		idx := rowIndices.Get().(*[]int32)
		defer rowIndices.Put(idx)
		for j0 := t * chunk; j0 < min(n, (t+1)*chunk); j0 += run {
			j1 := min(n, (t+1)*chunk, j0+run)
			ws, ix, inOrder := q.storageRowsInto(*hdr, *idx, off+j0, off+j1)
			*hdr, *idx = ws, ix
			dst := c.data[j0:j1]
			if !acc && inOrder {
				dots(ws, dst)
				continue
			}
			if buf == nil {
				buf = manyBufs.Get().(*[manyRun]float32)
			}
			dots(ws, buf[:])
			scatterColumn(dst, buf[:], 1, ix, acc)
		}
	})
}

// scatterRows writes (acc: adds) a Rows kernel's results for R (1–4)
// activation rows, src[i·R+r] for weight row i and activation row r, to
// row row0+r of c at column j0+ix[i], or j0+i when ix is empty (the rows
// did not move: storageRowsInto writes no indices then), for i < n. Four rows (every full group of a decode batch) go
// column by column to all four destinations at once, one bounds check per
// column: row by row (scatterColumn) the strided reads took 5.2 % of the
// CPU of `cb bench --shapes smollm2-135m --formats q4_k_m --prompts 16
// --decode-steps 400` (its decode steps at batch 1 and 8), this way 1.6 %.
func scatterRows(c mat, row0, R, j0, n int, src []float32, ix []int32, acc bool) {
	if R != 4 {
		for r := range R {
			scatterColumn(c.data[(row0+r)*c.stride+j0:(row0+r)*c.stride+j0+n], src[r:], R, ix, acc)
		}
		return
	}
	at := func(r int) []float32 { return c.data[(row0+r)*c.stride+j0 : (row0+r)*c.stride+j0+n] }
	d0, d1, d2, d3 := at(0), at(1), at(2), at(3)
	d1, d2, d3 = d1[:len(d0)], d2[:len(d0)], d3[:len(d0)] // one bounds check per column, not five
	src = src[:4*n]
	switch {
	case len(ix) == 0 && acc:
		for i := range d0 {
			s := src[4*i : 4*i+4 : 4*i+4]
			d0[i] += s[0]
			d1[i] += s[1]
			d2[i] += s[2]
			d3[i] += s[3]
		}
	case len(ix) == 0:
		for i := range d0 {
			s := src[4*i : 4*i+4 : 4*i+4]
			d0[i], d1[i], d2[i], d3[i] = s[0], s[1], s[2], s[3]
		}
	default:
		ix = ix[:n]
		for i, j := range ix {
			s := src[4*i : 4*i+4 : 4*i+4]
			if acc {
				d0[j] += s[0]
				d1[j] += s[1]
				d2[j] += s[2]
				d3[j] += s[3]
			} else {
				d0[j], d1[j], d2[j], d3[j] = s[0], s[1], s[2], s[3]
			}
		}
	}
}

// scatterColumn writes (acc: adds) src[i·stride] to dst[ix[i]] for every
// column i of dst, or to dst[i] when ix is empty (the rows did not move).
func scatterColumn(dst, src []float32, stride int, ix []int32, acc bool) {
	switch {
	case len(ix) == 0 && acc:
		for i := range dst {
			dst[i] += src[i*stride]
		}
	case len(ix) == 0:
		for i := range dst {
			dst[i] = src[i*stride]
		}
	case acc:
		for i, j := range ix {
			dst[j] += src[i*stride]
		}
	default:
		for i, j := range ix {
			dst[j] = src[i*stride]
		}
	}
}

// runLengths is how many of n weight rows of q one task of a decode-sized
// product takes (dotChunk) and how many it hands to one kernel call (at
// most manyRun): where q has interleaved heads (pairRows), both cut
// between heads, so that storageRowsInto hands each head in memory order.
func runLengths(q *qmat, n, threads int) (chunk, run int) {
	chunk, run = dotChunk(n, threads), manyRun
	if g := q.pairRows; g > 0 && g <= manyRun {
		chunk, run = (chunk+g-1)/g*g, manyRun/g*g
	}
	return chunk, run
}

// manyRun is the most weight rows manyRows hands to one dots call;
// manyBufs recycles its accumulation buffers.
const manyRun = 256

var manyBufs = sync.Pool{New: func() any { return new([manyRun]float32) }}

// rowHeaders recycles the slice headers of a task's run of weight rows
// (qmat.rowsInto), manyRun of them.
var rowHeaders = sync.Pool{New: func() any { b := make([][]byte, 0, manyRun); return &b }}

// rowIndices recycles the columns of a run of rows handed over in storage
// order (qmat.storageRowsInto), manyRun of them.
var rowIndices = sync.Pool{New: func() any { b := make([]int32, 0, manyRun); return &b }}

// tileBufs recycles the results of a decode batch's run of half-precision
// weight rows handed over out of column order (manyRun rows × up to
// qRowDots activation rows).
var tileBufs = sync.Pool{New: func() any { return new([manyRun * qRowDots]float32) }}

// rowsBufs recycles the results of a decode batch's runs of weight rows
// (manyRun rows × up to four activation rows).
var rowsBufs = sync.Pool{New: func() any { return new([manyRun * quant.Q8KRowsMax]float32) }}

// intActs holds a decode step's activation rows quantized for the integer
// kernels, in groups of four; intActPool recycles them.
type intActs struct {
	k1 quant.Q8K // one row (manyRows)
	z1 quant.Q80
	kr [(qIntRows + quant.Q8KRowsMax - 1) / quant.Q8KRowsMax]quant.Q8KRows
	zr [(qIntRows + quant.Q80RowsMax - 1) / quant.Q80RowsMax]quant.Q80Rows
}

var intActPool = make(freeList[intActs], freeListMax)

// gemmTilesPool and gemmPanelPool recycle the integer GEMM's quantized
// activations and unpacked weight panels.
var (
	gemmTilesPool = make(freeList[quant.GemmTiles], freeListMax)
	gemmPanelPool = make(freeList[quant.GemmPanel], freeListMax)
)

// freeList recycles values of T between calls, as a sync.Pool does, but
// keeps at most its capacity of them for the life of the process (a
// buffered channel, as Model.free keeps workspaces): a sync.Pool drops its
// values at every collection, and the buffers they grew (a prefill chunk's
// quantized activations) were allocated again after it — garbage that
// made the heap grow. Safe for concurrent use.
type freeList[T any] chan *T

// freeListMax bounds a freeList: calls running at once (a Model's
// maxFreeWS forwards, each on its team's threads) rarely hold more.
const freeListMax = 8

// get returns a free value, or a new zero one.
func (f freeList[T]) get() *T {
	select {
	case x := <-f:
		return x
	default:
		return new(T)
	}
}

// put gives x back; when the list is full it is left to the collector.
func (f freeList[T]) put(x *T) {
	select {
	case f <- x:
	default:
	}
}

// dotChunk is how many weight rows one task of a matrix-vector product
// (one to qIntRows activation rows) takes: the rows cut into four spans
// per thread, at least 32 rows. Tasks of 32 rows (36 KiB of a 2,048-wide
// Q4_K weight, about a microsecond of work) made a decode step 1.5×
// slower when the threads took tasks in turns from one counter: every
// task cost two atomic operations on counters the threads share, and the
// hardware prefetcher restarted on every jump. Since a thread takes a
// contiguous range of tasks (teamJob), 8 or 16 spans per thread were
// tried again: no faster (SmolLM2-135M Q4_K_M steps 4.41–4.53 ms at 4,
// 4.56–4.98 at 8 or 16).
func dotChunk(n, threads int) int {
	return max(32, (n+4*threads-1)/(4*threads))
}
