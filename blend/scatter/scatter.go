package scatter

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rope"
)

// ErrBadSegment reports a segment that cannot be scattered: no chunk, a
// range outside the chunk, a negative position, a chunk layout different from
// the destination's, or a shift without a matching RoPE. Other segments of
// the same call are still written.
var ErrBadSegment = errors.New("scatter: bad segment")

// ErrBadGather reports a Gather whose chunk does not fit the source memory or
// whose positions are not allocated.
var ErrBadGather = errors.New("scatter: bad gather")

// Copy is one scatter: the reuse plan's segments to write into Dst through
// BlockTable, each read from its chunk in Chunks (by Segment.Key): tokens
// [ChunkOff, ChunkOff+Cur.Len()) of the chunk go to positions Cur. The
// segments are windowed already (reuseplan.Window): every position has a
// block. K of a Shift segment is re-RoPE'd with RoPE from the chunk's stored
// positions to Cur (non-prefix matches), and its layers below FromLayer are
// not written (the worker recomputes them); other segments are copied as
// stored, every layer.
type Copy struct {
	Dst        *kvcache.Memory
	BlockTable []int32
	RoPE       *rope.RoPE
	Chunks     map[reuseplan.Key]*chunkstore.Chunk
	Segments   []reuseplan.Segment
	FromLayer  int
}

// Stats describes one Scatter call (the cb.scatter span attributes).
type Stats struct {
	ScatteredTokens int   // tokens written (K and V of every layer from their segment's FromLayer)
	SlotWrites      int   // K and V rows written: 2 * the tokens' written layers
	PartialBlocks   int   // blocks that got some but not all of their slots written by this call
	NPrefix         int   // tokens written as stored
	NShifted        int   // tokens written re-RoPE'd
	Invalid         int   // tokens of bad segments, or whose block is outside the table or the memory
	Bytes           int64 // bytes written
}

// Add accumulates o into s.
func (s *Stats) Add(o Stats) {
	s.ScatteredTokens += o.ScatteredTokens
	s.SlotWrites += o.SlotWrites
	s.PartialBlocks += o.PartialBlocks
	s.NPrefix += o.NPrefix
	s.NShifted += o.NShifted
	s.Invalid += o.Invalid
	s.Bytes += o.Bytes
}

// run is a stretch of consecutive tokens of one segment that map to
// consecutive slots (the part of the segment inside one block).
type run struct {
	seg   int // index in segs
	off   int // token index in the chunk
	slot  int // first slot
	n     int // tokens
	delta int // re-RoPE rotation (to - from); used when the segment shifts
}

// Scatter copies the segments' K and V into c.Dst, slot by slot
// (slot = BlockTable[pos/bs]*bs + pos%bs): only the matched slots are
// written, so a partial block keeps its other slots. K of Shift segments is
// rotated with rope.Shift, which must be built for the chunks' head dimension
// and RoPE base. Bad segments (see [ErrBadSegment]; a position beyond the
// block table is one) are skipped and reported with an error wrapping
// ErrBadSegment; the rest is still written. Scatter does not retain its
// argument. It is safe for concurrent use as long as concurrent calls write
// disjoint slots.
func Scatter(c Copy) (Stats, error) { return ScatterParallel(c, 1) }

// ScatterParallel is Scatter with the layers split among up to workers
// goroutines (at most one per layer; workers <= 1 runs in the caller), all
// joined before it returns. The result is identical to Scatter's; it lowers
// the latency of one large re-RoPE'd retrieve on an otherwise idle machine.
func ScatterParallel(c Copy, workers int) (Stats, error) {
	l := c.Dst.Layout()
	p := planRuns(c)
	st, runs, chunks, fromLayer, segs := p.st, p.runs, p.chunks, p.fromLayer, c.Segments
	dst := c.Dst
	tf := l.TokenFloats()
	// Group the re-RoPE'd runs that continue each other in the chunk with the
	// same rotation, so K is rotated with one Shift call (one set of sines)
	// per group and layer, in a cache-resident scratch buffer.
	groups, maxGroup := groupRuns(runs, segs)
	copyLayers := func(lo, hi int) {
		var scratch *[]float32
		if maxGroup > 0 {
			scratch = getScratch(maxGroup * tf)
			defer scratchPool.Put(scratch)
		}
		for layer := lo; layer < hi; layer++ {
			for _, g := range groups {
				if layer < fromLayer[g.seg] {
					continue
				}
				ck, cv := chunks[g.seg].K(layer), chunks[g.seg].V(layer)
				if g.shift {
					buf := (*scratch)[:g.n*tf]
					copy(buf, ck[g.off*tf:(g.off+g.n)*tf])
					c.RoPE.Shift(buf, 0, g.delta)
					for _, r := range runs[g.lo:g.hi] {
						o := r.off - g.off
						dst.Write(kvcache.Keys, layer, r.slot, buf[o*tf:(o+r.n)*tf])
					}
				} else {
					for _, r := range runs[g.lo:g.hi] {
						dst.Write(kvcache.Keys, layer, r.slot, ck[r.off*tf:(r.off+r.n)*tf])
					}
				}
				for _, r := range runs[g.lo:g.hi] {
					dst.Write(kvcache.Values, layer, r.slot, cv[r.off*tf:(r.off+r.n)*tf])
				}
			}
		}
	}
	workers = min(max(workers, 1), l.NumLayers)
	if len(runs) == 0 {
		workers = 1
	}
	if workers == 1 {
		copyLayers(0, l.NumLayers)
	} else {
		var wg sync.WaitGroup
		for w := range workers {
			lo, hi := w*l.NumLayers/workers, (w+1)*l.NumLayers/workers
			wg.Go(func() { copyLayers(lo, hi) })
		}
		wg.Wait()
	}
	for _, w := range p.written {
		if w > 0 && int(w) < l.BlockSize {
			st.PartialBlocks++
		}
	}
	st.SlotWrites = p.tokenLayers * 2
	st.Bytes = int64(p.tokenLayers) * (l.TokenBytes() / int64(l.NumLayers))
	return st, errors.Join(p.errs...)
}

// runPlan is the runs of a Copy and its statistics so far.
type runPlan struct {
	st          Stats
	runs        []run
	chunks      []*chunkstore.Chunk // segment i's chunk
	fromLayer   []int               // segment i's first written layer
	written     []int32             // per block of the table: its slots written
	tokenLayers int                 // Σ tokens × layers written
	errs        []error
}

// planRuns checks the segments of c and cuts the good ones into runs of
// consecutive slots (and, for re-RoPE, consecutive stored positions).
func planRuns(c Copy) runPlan {
	var st Stats
	dst, segs := c.Dst, c.Segments
	l := dst.Layout()
	bs := l.BlockSize
	var errs []error
	var runs []run
	tokenLayers := 0 // Σ tokens × layers written
	written := make([]int32, len(c.BlockTable))
	chunks := make([]*chunkstore.Chunk, len(segs)) // segs[i]'s chunk
	fromLayer := make([]int, len(segs))            // segs[i]'s first written layer
	for si, sg := range segs {
		chunks[si] = c.Chunks[sg.Key]
		if sg.Shift {
			fromLayer[si] = c.FromLayer
		}
		err := checkSegment(sg, chunks[si], fromLayer[si], l, c.RoPE, len(c.BlockTable))
		if err != nil {
			st.Invalid += sg.Cur.Len()
			if len(errs) < 4 {
				errs = append(errs, fmt.Errorf("segment %d: %w", si, err))
			}
			continue
		}
		for i := 0; i < sg.Cur.Len(); {
			pos := sg.Cur.Start + i
			b := pos / bs
			n := min(bs-pos%bs, sg.Cur.Len()-i)
			if id := c.BlockTable[b]; id < 0 || int(id) >= l.NumBlocks {
				st.Invalid += n
				if len(errs) < 4 {
					errs = append(errs, fmt.Errorf("%w: segment %d: block id %d outside the memory's %d blocks", ErrBadSegment, si, id, l.NumBlocks))
				}
				i += n
				continue
			}
			r := run{seg: si, off: sg.ChunkOff + i, slot: int(c.BlockTable[b])*bs + pos%bs, n: n}
			if sg.Shift {
				r.delta = pos - int(chunks[si].Positions[r.off])
				// Split where the stored positions stop being consecutive.
				for j := 1; j < r.n; j++ {
					if pos+j-int(chunks[si].Positions[r.off+j]) != r.delta {
						r.n = j
						break
					}
				}
				st.NShifted += r.n
			} else {
				st.NPrefix += r.n
			}
			runs = append(runs, r)
			written[b] += int32(r.n)
			st.ScatteredTokens += r.n
			tokenLayers += r.n * (l.NumLayers - fromLayer[si])
			i += r.n
		}
	}
	return runPlan{st: st, runs: runs, chunks: chunks, fromLayer: fromLayer, written: written, tokenLayers: tokenLayers, errs: errs}
}

// group is runs[lo:hi]: runs of one segment covering chunk tokens
// [off, off+n) contiguously; with shift, all rotated by delta (non-zero).
type group struct {
	seg, lo, hi, off, n, delta int
	shift                      bool
}

func groupRuns(runs []run, segs []reuseplan.Segment) ([]group, int) {
	var gs []group
	maxShift := 0
	for i, r := range runs {
		shift := segs[r.seg].Shift && r.delta != 0
		if n := len(gs); n > 0 {
			g := &gs[n-1]
			if g.seg == r.seg && g.shift == shift && g.off+g.n == r.off && (!shift || g.delta == r.delta) {
				g.hi, g.n = i+1, g.n+r.n
				if shift {
					maxShift = max(maxShift, g.n)
				}
				continue
			}
		}
		gs = append(gs, group{seg: r.seg, lo: i, hi: i + 1, off: r.off, n: r.n, delta: r.delta, shift: shift})
		if shift {
			maxShift = max(maxShift, r.n)
		}
	}
	return gs, maxShift
}

var scratchPool sync.Pool

// getScratch returns a pooled buffer of at least n floats.
func getScratch(n int) *[]float32 {
	if p, ok := scratchPool.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	b := make([]float32, n)
	return &b
}

func checkSegment(sg reuseplan.Segment, c *chunkstore.Chunk, fromLayer int, l kvcache.Layout, rope *rope.RoPE, blocks int) error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: no chunk %s", ErrBadSegment, sg.Key)
	case sg.Cur.End < sg.Cur.Start || sg.ChunkOff < 0 || sg.ChunkOff+sg.Cur.Len() > c.Len() || sg.Cur.Start < 0:
		return fmt.Errorf("%w: tokens [%d,+%d) of a %d-token chunk at position %d", ErrBadSegment, sg.ChunkOff, sg.Cur.Len(), c.Len(), sg.Cur.Start)
	case !sg.Cur.Empty() && (sg.Cur.End-1)/l.BlockSize >= blocks:
		return fmt.Errorf("%w: positions [%d,%d) beyond the %d blocks of the table", ErrBadSegment, sg.Cur.Start, sg.Cur.End, blocks)
	case fromLayer < 0 || fromLayer > l.NumLayers:
		return fmt.Errorf("%w: from layer %d outside [0,%d]", ErrBadSegment, fromLayer, l.NumLayers)
	case !c.Layout.Compatible(l):
		return fmt.Errorf("%w: chunk layout %+v does not fit memory layout %+v", ErrBadSegment, c.Layout, l)
	case c.Validate() != nil:
		return fmt.Errorf("%w: %w", ErrBadSegment, c.Validate())
	case sg.Shift && (rope == nil || rope.HeadDim() != l.HeadDim || l.HeadDim%2 != 0):
		return fmt.Errorf("%w: re-RoPE needs a RoPE for head dimension %d", ErrBadSegment, l.HeadDim)
	}
	return nil
}

// Gather is the store direction: it fills c.KV with the K and V of prompt
// positions c.Positions[0], c.Positions[0]+1, … read from src through
// blockTable. The chunk's positions must be consecutive, its layout
// compatible with src and every position allocated; otherwise it returns an
// error wrapping ErrBadGather and leaves c partly written.
func Gather(c *chunkstore.Chunk, src *kvcache.Memory, blockTable []int32) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadGather, err)
	}
	l := src.Layout()
	if !c.Layout.Compatible(l) {
		return fmt.Errorf("%w: chunk layout %+v does not fit memory layout %+v", ErrBadGather, c.Layout, l)
	}
	start := int(c.Positions[0])
	for i, p := range c.Positions {
		if int(p) != start+i {
			return fmt.Errorf("%w: positions not consecutive at token %d", ErrBadGather, i)
		}
	}
	bs, tf := l.BlockSize, l.TokenFloats()
	type span struct{ off, slot, n int }
	var spans []span
	for i := 0; i < c.Len(); {
		pos := start + i
		b := pos / bs
		if b >= len(blockTable) || blockTable[b] < 0 || int(blockTable[b]) >= l.NumBlocks {
			return fmt.Errorf("%w: position %d has no valid block", ErrBadGather, pos)
		}
		n := min(bs-pos%bs, c.Len()-i)
		spans = append(spans, span{i, int(blockTable[b])*bs + pos%bs, n})
		i += n
	}
	for layer := range l.NumLayers {
		ck, cv := c.K(layer), c.V(layer)
		for _, s := range spans {
			src.Read(kvcache.Keys, layer, s.slot, ck[s.off*tf:(s.off+s.n)*tf])
			src.Read(kvcache.Values, layer, s.slot, cv[s.off*tf:(s.off+s.n)*tf])
		}
	}
	return nil
}
