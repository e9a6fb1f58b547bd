package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/cacheblend/cacheblend/kvcache"
)

// TestAttnSplit decodes one token after contexts of many lengths, in a
// cache whose blocks are not in order (so the slot runs break at every
// block), with attnSplit and with attnDirect, alone and beside a second
// sequence: where the row's positions fit one chunk the logits are the
// same bits; beyond, the chunks' merge agrees within float rounding; and
// a sequence's logits do not depend on the other sequence of the step.
// Both for an F32 and an F16 cache (whose runs are converted a block at a
// time).
func TestAttnSplit(t *testing.T) {
	for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
		t.Run(dt.String(), func(t *testing.T) { testAttnSplit(t, dt) })
	}
}

func testAttnSplit(t *testing.T, dt kvcache.DType) {
	m := newModel(t, Config{})
	vocab := m.Config().Vocab
	for _, ctx := range []int{1, 15, 16, 63, 64, 65, 130, 700} {
		t.Run(fmt.Sprintf("ctx%d", ctx), func(t *testing.T) {
			per := blocksFor(ctx + 1)
			kv := newKVOf(t, m, 2*per, dt)
			// Sequence A on the odd blocks downwards, B on the even ones.
			a, b := make([]int32, per), make([]int32, per)
			for i := range per {
				a[i], b[i] = int32(2*(per-1-i)+1), int32(2*i)
			}
			for _, s := range []struct {
				bt   []int32
				seed uint64
			}{{a, 1}, {b, 2}} {
				if _, err := m.Prefill(kv, PrefillInput{Tokens: randTokens(s.seed, ctx), BlockTable: s.bt}); err != nil {
					t.Fatal(err)
				}
			}
			decode := func(split bool, in ...DecodeInput) []float32 {
				defer func(prev bool) { splitAttention = prev }(splitAttention)
				splitAttention = split
				out := make([]float32, len(in)*vocab)
				if err := m.DecodeInto(kv, in, out); err != nil {
					t.Fatal(err)
				}
				return out
			}
			inA := DecodeInput{Token: 'x', Pos: ctx, BlockTable: a}
			inB := DecodeInput{Token: 'y', Pos: ctx, BlockTable: b}
			for _, in := range [][]DecodeInput{{inA}, {inA, inB}} {
				direct, split := decode(false, in...), decode(true, in...)
				if n, _ := splitChunks(ctx+1, len(in)); n == 1 {
					for i := range direct {
						if math.Float32bits(direct[i]) != math.Float32bits(split[i]) {
							t.Fatalf("%d sequences, one chunk: logit %d = %g, attnDirect %g", len(in), i, split[i], direct[i])
						}
					}
				} else if d := maxAbsDiff(split, direct); d > 1e-4 || d == 0 {
					t.Fatalf("%d sequences, %d chunks: logits differ from attnDirect's by %g", len(in), n, d)
				}
				if len(in) == 2 && maxAbsDiff(split[:vocab], split[vocab:]) == 0 {
					t.Fatal("the two sequences' logits are the same: the test cannot tell them apart")
				}
			}
		})
	}
}

// TestSplitChunks checks the chunking: the fewest chunks of at least
// splitChunk positions, at most splitTasks over the step's rows, sizes a
// multiple of 16, covering the positions.
func TestSplitChunks(t *testing.T) {
	for _, tc := range []struct{ end, rows, n, size int }{
		{1, 1, 1, 16}, {16, 1, 1, 16}, {17, 1, 1, 32}, {64, 1, 1, 64}, {65, 1, 2, 48}, {129, 1, 3, 48},
		{512, 1, 8, 64}, {2049, 1, 8, 272}, {2049, 2, 4, 528}, {2049, 3, 2, 1040}, {2049, 8, 1, 2064}, {2049, 64, 1, 2064},
	} {
		n, size := splitChunks(tc.end, tc.rows)
		if n != tc.n || size != tc.size || size%16 != 0 || n*size < tc.end || (n-1)*size >= tc.end {
			t.Errorf("splitChunks(%d, %d) = %d, %d; want %d, %d", tc.end, tc.rows, n, size, tc.n, tc.size)
		}
	}
}

// TestSlotRunEnd: a run of consecutive slots stops at the first break, at
// n, and for an F16 memory at halfRun positions (kvPlanes.end), which is
// also as far as slotRun looks.
func TestSlotRunEnd(t *testing.T) {
	slots := make([]int, 40)
	for i := range slots {
		slots[i] = 100 + i
		if i >= 30 {
			slots[i] = 500 + i // a break: 30 does not follow 29
		}
	}
	f32 := kvPlanes{k: []float32{0}, v: []float32{0}}
	f16 := kvPlanes{}
	for _, tc := range []struct {
		name    string
		p       kvPlanes
		t, n    int
		wantRun int
	}{
		{"f32 to the break", f32, 0, 40, 30},
		{"f32 to n", f32, 5, 20, 15},
		{"f32 after the break", f32, 30, 40, 10},
		{"f16 capped at halfRun", f16, 0, 40, halfRun},
		{"f16 to the break", f16, 20, 40, 10},
		{"f16 to n", f16, 3, 10, 7},
		{"last position", f16, 39, 40, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := slotRun(slots, tc.t, tc.p.end(tc.t, tc.n)); got != tc.wantRun {
				t.Fatalf("run from %d below %d: %d, want %d", tc.t, tc.n, got, tc.wantRun)
			}
		})
	}
}

// TestPartBounds checks that the parts attnSplit's prefetch requests are
// cut into cover the run once, in order, each starting on a cache line.
func TestPartBounds(t *testing.T) {
	for _, tc := range []struct{ size, n int }{
		{16 * 384, 9}, {16 * 384, 1}, {16 * 640, 15}, {3 * 384, 9}, {100, 9}, {64, 3},
	} {
		t.Run(fmt.Sprintf("%d_in_%d", tc.size, tc.n), func(t *testing.T) {
			end := 0
			for i := range tc.n {
				lo, hi := partBounds(tc.size, i, tc.n)
				if lo != end || hi < lo || lo%64 != 0 {
					t.Fatalf("part %d = [%d, %d), after a part ending at %d", i, lo, hi, end)
				}
				end = hi
			}
			if end != tc.size {
				t.Fatalf("parts end at %d, want %d", end, tc.size)
			}
		})
	}
}
