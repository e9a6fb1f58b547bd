package scatter

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/quant"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rope"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const theta = 10000.0

var kvLayout = kvcache.Layout{NumLayers: 2, NumBlocks: 16, BlockSize: 4, KVHeads: 2, HeadDim: 8}

var sentinel = float32(math.Inf(-1))

// dtypes are the memories' element types the tests run on.
var dtypes = []kvcache.DType{kvcache.F32, kvcache.F16}

// newMem maps a fresh memory filled with a sentinel value.
func newMem(t testing.TB, l kvcache.Layout) *kvcache.Memory {
	t.Helper()
	m, err := kvcache.Create(t.TempDir(), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	row := make([]float32, l.TokenFloats())
	for i := range row {
		row[i] = sentinel
	}
	for layer := range l.NumLayers {
		for _, p := range []kvcache.Plane{kvcache.Keys, kvcache.Values} {
			for s := range l.Slots() {
				m.Write(p, layer, s, row)
			}
		}
	}
	return m
}

// newChunk makes a chunk of n tokens stored at positions start… with random KV.
func newChunk(t testing.TB, r *rand.Rand, l kvcache.Layout, n, start int) *chunkstore.Chunk {
	t.Helper()
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = r.Int32N(1000)
	}
	c, err := chunkstore.NewChunk(chunkstore.Key{byte(n), byte(start)}, "m", 0, chunkstore.LayoutOf(l, theta), toks, start)
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.KV {
		c.KV[i] = float32(r.NormFloat64())
	}
	return c
}

// seg is a test segment: tokens [off, off+n) of c go to positions
// [cur, cur+n), re-RoPE'd with shift.
type seg struct {
	c           *chunkstore.Chunk
	off, n, cur int
	shift       bool
}

// rawCopy is the Copy of segs into dst through bt, as they are; each
// segment's chunk gets a key of its own.
func rawCopy(dst *kvcache.Memory, bt []int32, rp *rope.RoPE, fromLayer int, segs ...seg) Copy {
	c := Copy{Dst: dst, BlockTable: bt, RoPE: rp, FromLayer: fromLayer, Chunks: map[reuseplan.Key]*chunkstore.Chunk{}}
	for i, s := range segs {
		k := reuseplan.Key{0xff, byte(i)}
		if s.c != nil {
			c.Chunks[k] = s.c
		}
		c.Segments = append(c.Segments, reuseplan.Segment{Key: k, ChunkOff: s.off, Cur: reuseplan.Range{Start: s.cur, End: s.cur + s.n}, Shift: s.shift})
	}
	return c
}

// copyOf is rawCopy windowed for a retrieve pass from position from over
// the blocks of bt, as the blend server windows it (reuseplan.Window); it
// also returns the positions the window left to a later pass.
func copyOf(dst *kvcache.Memory, bt []int32, from int, rp *rope.RoPE, fromLayer int, segs ...seg) (Copy, int) {
	c := rawCopy(dst, bt, rp, fromLayer, segs...)
	var dropped int
	c.Segments, dropped = reuseplan.Window(c.Segments, from, len(bt)*dst.Layout().BlockSize)
	return c, dropped
}

// reference writes the segments of c into dst token by token with
// kvcache.Slot and a per-token rope.Shift: the obviously-correct version of
// Scatter.
func reference(dst *kvcache.Memory, c Copy) {
	l := dst.Layout()
	for _, sg := range c.Segments {
		ch, from := c.Chunks[sg.Key], 0
		if sg.Shift {
			from = c.FromLayer
		}
		for i := range sg.Cur.Len() {
			pos := sg.Cur.Start + i
			slot, err := kvcache.Slot(c.BlockTable, pos, l.BlockSize)
			if err != nil {
				continue
			}
			for layer := from; layer < l.NumLayers; layer++ {
				k := slices.Clone(ch.TokenK(layer, sg.ChunkOff+i))
				if sg.Shift {
					c.RoPE.Shift(k, int(ch.Positions[sg.ChunkOff+i]), pos)
				}
				dst.Write(kvcache.Keys, layer, slot, k)
				dst.Write(kvcache.Values, layer, slot, ch.TokenV(layer, sg.ChunkOff+i))
			}
		}
	}
}

func memEqual(t *testing.T, a, b *kvcache.Memory) {
	t.Helper()
	l := a.Layout()
	for layer := range l.NumLayers {
		for _, p := range []kvcache.Plane{kvcache.Keys, kvcache.Values} {
			pa, pb := a.Plane(layer, p), b.Plane(layer, p)
			for i := range pa {
				if pa[i] != pb[i] {
					t.Fatalf("layer %d plane %d byte %d (slot %d): %d != %d", layer, p, i, i/l.RowBytes(), pa[i], pb[i])
				}
			}
		}
	}
}

// writtenSlots lists the slots of layer 0 whose K is not the sentinel.
func writtenSlots(m *kvcache.Memory) []int {
	l := m.Layout()
	var out []int
	for s := range l.Slots() {
		k := make([]float32, l.TokenFloats())
		m.Read(kvcache.Keys, 0, s, k)
		if !math.IsInf(float64(k[0]), -1) {
			out = append(out, s)
		}
	}
	return out
}

func TestScatterWritesExactSlots(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	rope := rope.New(kvLayout.HeadDim, theta)
	c := newChunk(t, r, kvLayout, 20, 100)
	bt := []int32{9, 3, 12, 0, 7, 5}
	slotsOf := func(from, to int) []int { // slots of positions [from, to)
		var s []int
		for p := from; p < to; p++ {
			x, _ := kvcache.Slot(bt, p, kvLayout.BlockSize)
			s = append(s, x)
		}
		return s
	}
	tests := []scatterTest{
		{"prefix, block aligned",
			[]seg{{c, 0, 8, 0, false}}, 0, 0,
			Stats{ScatteredTokens: 8, NPrefix: 8}, 0, slotsOf(0, 8), 0},
		{"mid-block start and end: two partial blocks, neighbours untouched",
			[]seg{{c, 3, 9, 6, true}}, 0, 0,
			Stats{ScatteredTokens: 9, NShifted: 9, PartialBlocks: 2}, 0, slotsOf(6, 15), 0},
		{"two segments sharing a block fill it",
			[]seg{{c, 0, 2, 4, false}, {c, 10, 2, 6, true}}, 0, 0,
			Stats{ScatteredTokens: 4, NPrefix: 2, NShifted: 2}, 0, slotsOf(4, 8), 0},
		{"beyond the block table is left to a later pass",
			[]seg{{c, 0, 10, 18, true}}, 0, 0,
			Stats{ScatteredTokens: 6, NShifted: 6, PartialBlocks: 1}, 4, slotsOf(18, 24), 0},
		{"below from is not written again",
			[]seg{{c, 0, 10, 2, false}}, 5, 0,
			Stats{ScatteredTokens: 7, NPrefix: 7, PartialBlocks: 1}, 0, slotsOf(5, 12), 0},
		{"empty segment", []seg{{c, 0, 0, 3, false}}, 0, 0, Stats{}, 0, nil, 0},
		{"shifted from layer 1: layer 0 left to the worker",
			[]seg{{c, 0, 8, 4, true}}, 0, 1,
			Stats{ScatteredTokens: 8, NShifted: 8}, 0, nil, 1},
		{"from layer = every layer: nothing written, tokens still counted",
			[]seg{{c, 0, 4, 4, true}}, 0, 2,
			Stats{ScatteredTokens: 4, NShifted: 4}, 0, nil, -1},
	}
	for _, dt := range dtypes {
		l := kvLayout
		l.DType = dt
		for _, tc := range tests {
			t.Run(dt.String()+"/"+tc.name, func(t *testing.T) { tc.run(t, l, bt, rope) })
		}
	}
}

// scatterTest is a case of TestScatterWritesExactSlots.
type scatterTest struct {
	name      string
	segs      []seg
	from      int
	fromLayer int
	want      Stats
	dropped   int   // left by the window to a later pass
	wantSlots []int // slots written in layer 0
	layers    int   // layers written per token when not all
}

// run scatters tc's segments into a memory of layout l through bt and
// compares it with the reference's.
func (tc scatterTest) run(t *testing.T, l kvcache.Layout, bt []int32, rope *rope.RoPE) {
	got, want := newMem(t, l), newMem(t, l)
	cp, dropped := copyOf(got, bt, tc.from, rope, tc.fromLayer, tc.segs...)
	st, err := Scatter(cp)
	if err != nil {
		t.Fatal(err)
	}
	if dropped != tc.dropped {
		t.Fatalf("window dropped %d, want %d", dropped, tc.dropped)
	}
	layers := l.NumLayers
	switch {
	case tc.layers > 0:
		layers = tc.layers
	case tc.layers < 0:
		layers = 0
	}
	tc.want.SlotWrites = tc.want.ScatteredTokens * 2 * layers
	tc.want.Bytes = int64(tc.want.ScatteredTokens) * l.TokenBytes() / int64(l.NumLayers) * int64(layers)
	if st != tc.want {
		t.Fatalf("stats %+v, want %+v", st, tc.want)
	}
	cp.Dst = want
	reference(want, cp)
	memEqual(t, got, want)
	gotSlots := writtenSlots(got)
	slices.Sort(tc.wantSlots)
	if !slices.Equal(gotSlots, tc.wantSlots) {
		t.Fatalf("wrote slots %v, want %v", gotSlots, tc.wantSlots)
	}
}

func TestTwoPassEqualsOnePass(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	rope := rope.New(kvLayout.HeadDim, theta)
	c1 := newChunk(t, r, kvLayout, 20, 0)
	c2 := newChunk(t, r, kvLayout, 30, 500)
	full := []int32{4, 11, 2, 8, 15, 1, 6, 13, 10}
	segs := []seg{
		{c1, 0, 13, 0, false}, // prefix
		{c2, 5, 17, 15, true}, // non-prefix, re-RoPE'd
	}
	one := newMem(t, kvLayout)
	cp, _ := copyOf(one, full, 0, rope, 0, segs...)
	stOne, err := Scatter(cp)
	if err != nil {
		t.Fatal(err)
	}
	two := newMem(t, kvLayout)
	// First pass: only 5 blocks (20 slots) allocated so far.
	cp, dropped := copyOf(two, full[:5], 0, rope, 0, segs...)
	st1, err := Scatter(cp)
	if err != nil {
		t.Fatal(err)
	}
	if st1.ScatteredTokens != 13+5 || dropped != 12 {
		t.Fatalf("first pass %+v, %d dropped", st1, dropped)
	}
	// Second pass: the full table, from the first unallocated position.
	cp, dropped = copyOf(two, full, 20, rope, 0, segs...)
	st2, err := Scatter(cp)
	if err != nil {
		t.Fatal(err)
	}
	if st2.ScatteredTokens != 12 || dropped != 0 {
		t.Fatalf("second pass %+v, %d dropped", st2, dropped)
	}
	if st1.ScatteredTokens+st2.ScatteredTokens != stOne.ScatteredTokens {
		t.Fatalf("passes wrote %d+%d tokens, one pass %d", st1.ScatteredTokens, st2.ScatteredTokens, stOne.ScatteredTokens)
	}
	memEqual(t, one, two)
}

func TestReRoPEMatchesDirectRotation(t *testing.T) {
	l := kvcache.Layout{NumLayers: 3, NumBlocks: 64, BlockSize: 16, KVHeads: 4, HeadDim: 64}
	rope := rope.New(l.HeadDim, theta)
	tests := []struct {
		name       string
		pos0, pos1 int
	}{
		{"forward", 37, 1500},
		{"backward", 900, 3},
		{"same position", 200, 200},
		{"far", 0, 4000},
	}
	for ti, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, uint64(ti)))
			const n = 40
			c := newChunk(t, r, l, n, tc.pos0)
			raw := slices.Clone(c.KV)
			// The stored K was computed at pos0+i: rotate the raw K there.
			for layer := range l.NumLayers {
				for i := range n {
					rope.RotateHeads(c.TokenK(layer, i), tc.pos0+i)
				}
			}
			bt := make([]int32, (tc.pos1+n)/l.BlockSize+1)
			for i := range bt {
				bt[i] = int32((i*7 + 3) % 64)
			}
			m := newMem(t, l)
			st, err := Scatter(rawCopy(m, bt, rope, 0, seg{c, 0, n, tc.pos1, true}))
			if err != nil || st.NShifted != n {
				t.Fatalf("stats %+v err %v", st, err)
			}
			rawChunk := *c
			rawChunk.KV = raw
			var maxErr float64
			for layer := range l.NumLayers {
				for i := range n {
					want := slices.Clone(rawChunk.TokenK(layer, i))
					rope.RotateHeads(want, tc.pos1+i)
					slot, err := kvcache.Slot(bt, tc.pos1+i, l.BlockSize)
					if err != nil {
						t.Fatal(err)
					}
					got := m.TokenK(layer, slot)
					for j := range want {
						maxErr = max(maxErr, math.Abs(float64(got[j]-want[j])))
					}
					if !slices.Equal(m.TokenV(layer, slot), rawChunk.TokenV(layer, i)) {
						t.Fatalf("V of token %d changed", i)
					}
				}
			}
			if maxErr >= 1e-4 {
				t.Fatalf("max abs error %g", maxErr)
			}
			t.Logf("max abs error %g", maxErr)
		})
	}
}

func TestNonConsecutivePositions(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	rope := rope.New(kvLayout.HeadDim, theta)
	c := newChunk(t, r, kvLayout, 10, 50)
	c.Positions[4] = 7 // a stored position out of sequence
	bt := []int32{1, 2, 3, 4}
	got, want := newMem(t, kvLayout), newMem(t, kvLayout)
	cp := rawCopy(got, bt, rope, 0, seg{c, 0, 10, 2, true})
	st, err := Scatter(cp)
	if err != nil || st.NShifted != 10 {
		t.Fatalf("%+v %v", st, err)
	}
	cp.Dst = want
	reference(want, cp)
	memEqual(t, got, want)
}

func TestBadSegments(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	rp := rope.New(kvLayout.HeadDim, theta)
	good := newChunk(t, r, kvLayout, 8, 0)
	other := kvLayout
	other.HeadDim = 4
	wrongLayout := newChunk(t, r, other, 8, 0)
	tests := []struct {
		name      string
		seg       seg
		bt        []int32
		rope      *rope.RoPE
		fromLayer int
	}{
		{"nil chunk", seg{nil, 0, 4, 0, false}, []int32{0, 1}, rp, 0},
		{"past the chunk", seg{good, 6, 4, 0, false}, []int32{0, 1}, rp, 0},
		{"negative offset", seg{good, -1, 4, 0, false}, []int32{0, 1}, rp, 0},
		{"negative position", seg{good, 0, 4, -4, false}, []int32{0, 1}, rp, 0},
		{"layout mismatch", seg{wrongLayout, 0, 4, 0, false}, []int32{0, 1}, rp, 0},
		{"shift without rope", seg{good, 0, 4, 0, true}, []int32{0, 1}, nil, 0},
		{"shift with wrong rope", seg{good, 0, 4, 0, true}, []int32{0, 1}, rope.New(4, theta), 0},
		{"block id outside memory", seg{good, 0, 4, 0, false}, []int32{99, 1}, rp, 0},
		{"negative block id", seg{good, 0, 4, 0, false}, []int32{-1, 1}, rp, 0},
		{"beyond the block table", seg{good, 0, 4, 8, false}, []int32{0, 1}, rp, 0},
		{"from layer past the memory", seg{good, 0, 4, 0, true}, []int32{0, 1}, rp, 3},
		{"negative from layer", seg{good, 0, 4, 0, true}, []int32{0, 1}, rp, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMem(t, kvLayout)
			// A good segment in the same call is still written.
			ok := seg{good, 0, 4, 4, false}
			st, err := Scatter(rawCopy(m, tc.bt, tc.rope, tc.fromLayer, tc.seg, ok))
			if !errors.Is(err, ErrBadSegment) {
				t.Fatalf("err = %v", err)
			}
			if st.Invalid != 4 || st.ScatteredTokens != 4 {
				t.Fatalf("stats %+v", st)
			}
			if got := writtenSlots(m); len(got) != 4 {
				t.Fatalf("wrote slots %v", got)
			}
		})
	}
}

// TestGatherRoundTrip scatters a chunk into a memory and gathers it back:
// the same values from an F32 memory, each rounded to the nearest half
// from an F16 one (and the same again when that is scattered and gathered).
func TestGatherRoundTrip(t *testing.T) {
	for _, dt := range dtypes {
		t.Run(dt.String(), func(t *testing.T) { gatherRoundTrip(t, dt) })
	}
}

func gatherRoundTrip(t *testing.T, dt kvcache.DType) {
	r := rand.New(rand.NewPCG(6, 6))
	l := kvLayout
	l.DType = dt
	src := newChunk(t, r, l, 13, 6)
	bt := []int32{5, 9, 1, 14, 3}
	m := newMem(t, l)
	roundTrip := func(c *chunkstore.Chunk) *chunkstore.Chunk {
		if _, err := Scatter(rawCopy(m, bt, nil, 0, seg{c, 0, 13, 6, false})); err != nil {
			t.Fatal(err)
		}
		back, err := chunkstore.NewChunk(c.Key, "m", 0, c.Layout, c.Tokens, 6)
		if err != nil {
			t.Fatal(err)
		}
		if err := Gather(back, m, bt); err != nil {
			t.Fatal(err)
		}
		return back
	}
	back := roundTrip(src)
	want := src.KV
	if dt == kvcache.F16 {
		want = make([]float32, len(src.KV))
		for i, v := range src.KV {
			want[i] = quant.F16ToF32(quant.F32ToF16(v))
		}
		if slices.Equal(want, src.KV) {
			t.Fatal("no value needed rounding: the test cannot tell F16 from F32")
		}
	}
	if !slices.Equal(back.KV, want) {
		t.Fatal("gathered KV differs")
	}
	if again := roundTrip(back); !slices.Equal(again.KV, want) {
		t.Fatal("a second round trip changed the KV")
	}
	short, _ := chunkstore.NewChunk(src.Key, "m", 0, src.Layout, src.Tokens, 10)
	if err := Gather(short, m, bt); !errors.Is(err, ErrBadGather) {
		t.Fatalf("gather past the table: %v", err)
	}
}

func TestScatterParallelEqualsScatter(t *testing.T) {
	l := kvcache.Layout{NumLayers: 5, NumBlocks: 32, BlockSize: 8, KVHeads: 2, HeadDim: 16}
	r := rand.New(rand.NewPCG(10, 10))
	rope := rope.New(l.HeadDim, theta)
	c1, c2 := newChunk(t, r, l, 40, 0), newChunk(t, r, l, 50, 300)
	bt := make([]int32, 20)
	for i, p := range r.Perm(32)[:20] {
		bt[i] = int32(p)
	}
	segs := []seg{{c1, 0, 37, 0, false}, {c2, 3, 47, 41, true}}
	for _, workers := range []int{0, 2, 3, 5, 9} {
		one, par := newMem(t, l), newMem(t, l)
		cp, _ := copyOf(one, bt, 4, rope, 0, segs...)
		st1, err1 := Scatter(cp)
		cp.Dst = par
		st2, err2 := ScatterParallel(cp, workers)
		if err1 != nil || err2 != nil || st1 != st2 {
			t.Fatalf("workers %d: %+v %v vs %+v %v", workers, st1, err1, st2, err2)
		}
		memEqual(t, one, par)
	}
}
