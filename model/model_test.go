package model

import (
	"errors"
	"github.com/cacheblend/cacheblend/reuseplan"
	"math"
	"slices"
	"testing"

	"github.com/cacheblend/cacheblend/kvcache"
)

func TestConfigDefaults(t *testing.T) {
	c := DefaultConfig()
	if c.Layers != DefaultLayers || c.Dim != DefaultDim || c.Heads != DefaultHeads || c.KVHeads != DefaultKVHeads ||
		c.FFNDim != DefaultFFNDim || c.Vocab != DefaultVocab || c.MaxPositions != 8192 || c.RoPETheta != DefaultRoPETheta ||
		c.CheckLayer != 1 || c.RecompRatio != 0.15 || c.Threads < 1 || c.Seed != DefaultSeed {
		t.Fatalf("DefaultConfig = %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
	if got := (Config{}).withDefaults(); got != c {
		t.Fatalf("zero Config defaults to %+v, want %+v", got, c)
	}
	if ceil := c.SpeedupCeiling(); ceil < 3 {
		t.Fatalf("default speed-up ceiling %.2f, want comfortably above 2.5", ceil)
	}
	l := c.KVLayout(10, 16, kvcache.F32)
	want := kvcache.Layout{NumLayers: c.Layers, NumBlocks: 10, BlockSize: 16, KVHeads: c.KVHeads, HeadDim: c.Dim / c.Heads}
	if l != want {
		t.Fatalf("KVLayout = %+v, want %+v", l, want)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero", Config{}, true},
		{"small", smallConfig(), true},
		{"heads not dividing dim", Config{Dim: 64, Heads: 5}, false},
		{"kv heads not dividing heads", Config{Heads: 4, KVHeads: 3}, false},
		{"odd head dim", Config{Dim: 12, Heads: 4, KVHeads: 2}, false},
		{"negative layers", Config{Layers: -1}, false},
		{"check layer beyond layers", Config{Layers: 4, CheckLayer: 4}, false},
		{"ratio above one", Config{RecompRatio: 1.5}, false},
		{"ratio NaN", Config{RecompRatio: math.NaN()}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.ok != (err == nil) {
				t.Fatalf("Validate = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrBadConfig) {
				t.Fatalf("error %v does not wrap ErrBadConfig", err)
			}
			if _, nerr := New(tc.cfg); (nerr == nil) != tc.ok {
				t.Fatalf("New error = %v, want ok=%v", nerr, tc.ok)
			}
		})
	}
}

func TestWeightsDeterministic(t *testing.T) {
	a, b := newModel(t, smallConfig()), newModel(t, smallConfig())
	cfg := smallConfig()
	cfg.Seed = 8
	c := newModel(t, cfg)
	if maxAbsDiff(a.embed.data, b.embed.data) != 0 || maxAbsDiff(a.layers[3].down.data, b.layers[3].down.data) != 0 {
		t.Fatal("same seed gave different weights")
	}
	if maxAbsDiff(a.embed.data, c.embed.data) == 0 {
		t.Fatal("different seeds gave the same weights")
	}
	if a.Params() <= 0 {
		t.Fatal("no parameters")
	}
}

func TestPrefillDeterministicAndFinite(t *testing.T) {
	m := newModel(t, smallConfig())
	toks := randTokens(1, 50)
	kv := newKV(t, m, 2*blocksFor(50))
	l1, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: table(0, blocksFor(50))})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: table(blocksFor(50), blocksFor(50))})
	if err != nil {
		t.Fatal(err)
	}
	if len(l1) != m.Config().Vocab || !allFinite(l1) {
		t.Fatalf("logits len %d finite %v", len(l1), allFinite(l1))
	}
	if d := maxAbsDiff(l1, l2); d != 0 {
		t.Fatalf("same prompt in other blocks differs by %g", d)
	}
	// Into: the same logits in the caller's buffer; one too short for them
	// is left alone and a new slice returned.
	vocab := m.Config().Vocab
	for _, tc := range []struct {
		name   string
		into   int
		shared bool
	}{
		{"exact", vocab, true},
		{"larger", 2*vocab + 3, true},
		{"too short", vocab - 1, false},
	} {
		into := make([]float32, tc.into)
		into[len(into)-1] = -7
		got, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: table(blocksFor(50), blocksFor(50)), Into: into})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != vocab || maxAbsDiff(got, l1) != 0 {
			t.Errorf("Into %s: %d logits, differ by %g", tc.name, len(got), maxAbsDiff(got, l1))
		}
		if shared := &got[0] == &into[0]; shared != tc.shared {
			t.Errorf("Into %s: logits in the caller's buffer %v, want %v", tc.name, shared, tc.shared)
		}
		if tc.into != vocab && into[len(into)-1] != -7 {
			t.Errorf("Into %s: wrote past the logits", tc.name)
		}
	}
	// The logits must depend on context, not only on the last token.
	toks2 := append(randTokens(2, 49), toks[49])
	l3, err := m.Prefill(kv, PrefillInput{Tokens: toks2, BlockTable: table(0, blocksFor(50))})
	if err != nil {
		t.Fatal(err)
	}
	// Another context (same last token) moves the logits by far more than
	// the 1e-4 the equality tests allow, and changes the greedy
	// continuation (its first token may be the same: the last token weighs
	// most).
	d := maxAbsDiff(l1, l3)
	g1, _ := sampleN(t, m, toks, 8, SamplingParams{}, nil)
	g3, _ := sampleN(t, m, toks2, 8, SamplingParams{}, nil)
	t.Logf("another context: logits differ by %.3g; greedy %v vs %v", d, g1, g3)
	if d < 0.1 || slices.Equal(g1, g3) {
		t.Fatalf("output depends too little on the context: logits differ by %.3g, greedy %v vs %v", d, g1, g3)
	}
}

// TestPagedScatteredBlocks checks that attention reads K/V through the block
// table: a prompt in non-contiguous, shuffled blocks gives the same logits.
func TestPagedScatteredBlocks(t *testing.T) {
	m := newModel(t, smallConfig())
	const n = 70
	toks := randTokens(3, n)
	kv := newKV(t, m, 16)
	ref, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: table(0, blocksFor(n))})
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: []int32{13, 6, 15, 9, 11}})
	if err != nil {
		t.Fatal(err)
	}
	if d := maxAbsDiff(ref, got); d > 1e-5 {
		t.Fatalf("scattered blocks differ by %g", d)
	}
}

func TestChunkedPrefillMatchesFull(t *testing.T) {
	m := newModel(t, smallConfig())
	const n = 90
	toks := randTokens(4, n)
	kv := newKV(t, m, 2*blocksFor(n))
	full, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: table(0, blocksFor(n))})
	if err != nil {
		t.Fatal(err)
	}
	bt := table(blocksFor(n), blocksFor(n))
	var got []float32
	for _, c := range [][2]int{{0, 17}, {17, 64}, {64, 90}} {
		got, err = m.Prefill(kv, PrefillInput{Tokens: toks[c[0]:c[1]], Start: c[0], BlockTable: bt})
		if err != nil {
			t.Fatal(err)
		}
	}
	if d := maxAbsDiff(full, got); d > 1e-4 {
		t.Fatalf("chunked prefill differs from full by %g", d)
	}
}

func TestDecodeMatchesPrefill(t *testing.T) {
	m := newModel(t, smallConfig())
	lens := []int{20, 33, 48}
	kv := newKV(t, m, 3*2*4)
	var in []DecodeInput
	var want [][]float32
	for i, n := range lens {
		toks := randTokens(uint64(10+i), n+1)
		// Reference: prefill of all n+1 tokens in a separate region.
		ref, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: table(12+4*i, 4)})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, ref)
		bt := table(4*i, 4)
		if _, err := m.Prefill(kv, PrefillInput{Tokens: toks[:n], BlockTable: bt}); err != nil {
			t.Fatal(err)
		}
		in = append(in, DecodeInput{Token: toks[n], Pos: n, BlockTable: bt})
	}
	got, err := m.Decode(kv, in)
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if d := maxAbsDiff(want[i], got[i]); d > 1e-4 {
			t.Errorf("sequence %d: batched decode differs from prefill by %g", i, d)
		}
	}
	// A batch of one gives the same as inside the batch.
	one, err := m.Decode(kv, in[1:2])
	if err != nil {
		t.Fatal(err)
	}
	if d := maxAbsDiff(one[0], got[1]); d > 1e-5 {
		t.Errorf("decode alone differs from decode in a batch by %g", d)
	}
	if got, err := m.Decode(kv, nil); err != nil || got != nil {
		t.Errorf("empty decode = %v, %v", got, err)
	}
	// DecodeInto writes the same logits into the caller's buffer (the
	// same step again: its KV writes are the same values) and leaves what
	// lies past them alone; a short buffer is an input error.
	vocab := m.Config().Vocab
	buf := make([]float32, len(in)*vocab+1)
	buf[len(in)*vocab] = 42
	if err := m.DecodeInto(kv, in, buf); err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if d := maxAbsDiff(buf[i*vocab:(i+1)*vocab], got[i]); d != 0 {
			t.Errorf("DecodeInto: sequence %d differs from Decode by %g", i, d)
		}
	}
	if buf[len(in)*vocab] != 42 {
		t.Errorf("DecodeInto wrote past the logits")
	}
	if err := m.DecodeInto(kv, in, buf[:len(in)*vocab-1]); !errors.Is(err, ErrInput) {
		t.Errorf("DecodeInto with a short buffer: %v, want ErrInput", err)
	}
}

// TestFiniteAtLastPosition: the scaled initialisation keeps logits finite at
// the far end of the position range (context of 8k positions).
func TestFiniteAtLastPosition(t *testing.T) {
	m := newModel(t, smallConfig())
	maxPos := m.Config().MaxPositions
	kv := newKV(t, m, blocksFor(maxPos))
	bt := table(0, blocksFor(maxPos))
	// A real 256-token context at the start, then a chunk at the far end
	// (positions in between hold whatever the cache holds: zeros).
	if _, err := m.Prefill(kv, PrefillInput{Tokens: randTokens(5, 256), BlockTable: bt}); err != nil {
		t.Fatal(err)
	}
	logits, err := m.Prefill(kv, PrefillInput{Tokens: randTokens(6, 31), Start: maxPos - 32, BlockTable: bt})
	if err != nil {
		t.Fatal(err)
	}
	if !allFinite(logits) {
		t.Fatal("non-finite logits near the last position")
	}
	out, err := m.Decode(kv, []DecodeInput{{Token: 1, Pos: maxPos - 1, BlockTable: bt}})
	if err != nil {
		t.Fatal(err)
	}
	if !allFinite(out[0]) {
		t.Fatal("non-finite logits at position 8191")
	}
	if _, err := m.Decode(kv, []DecodeInput{{Token: 1, Pos: maxPos, BlockTable: bt}}); !errors.Is(err, ErrPosition) {
		t.Fatalf("decode at MaxPositions: %v, want ErrPosition", err)
	}
}

func TestInputErrors(t *testing.T) {
	m := newModel(t, smallConfig())
	kv := newKV(t, m, 8)
	other, err := kvcache.Create(t.TempDir(), kvcache.Layout{NumLayers: 2, NumBlocks: 2, BlockSize: 16, KVHeads: 2, HeadDim: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ok := PrefillInput{Tokens: randTokens(1, 20), BlockTable: table(0, 2)}
	tests := []struct {
		name string
		run  func() error
		want error
	}{
		{"prefill ok", func() error { _, err := m.Prefill(kv, ok); return err }, nil},
		{"token out of vocab", func() error {
			_, err := m.Prefill(kv, PrefillInput{Tokens: []int32{1, 300}, BlockTable: table(0, 1)})
			return err
		}, ErrToken},
		{"negative token", func() error {
			_, err := m.Prefill(kv, PrefillInput{Tokens: []int32{-1}, BlockTable: table(0, 1)})
			return err
		}, ErrToken},
		{"position beyond max", func() error {
			_, err := m.Prefill(kv, PrefillInput{Tokens: []int32{1}, Start: 8192, BlockTable: table(0, 1)})
			return err
		}, ErrPosition},
		{"negative start", func() error {
			_, err := m.Prefill(kv, PrefillInput{Tokens: []int32{1}, Start: -1, BlockTable: table(0, 1)})
			return err
		}, ErrPosition},
		{"block table too short", func() error {
			_, err := m.Prefill(kv, PrefillInput{Tokens: randTokens(1, 20), BlockTable: table(0, 1)})
			return err
		}, ErrBlockTable},
		{"block outside pool", func() error {
			_, err := m.Prefill(kv, PrefillInput{Tokens: randTokens(1, 20), BlockTable: []int32{0, 8}})
			return err
		}, ErrBlockTable},
		{"empty prefill", func() error { _, err := m.Prefill(kv, PrefillInput{BlockTable: table(0, 1)}); return err }, ErrInput},
		{"layout mismatch", func() error { _, err := m.Prefill(other, ok); return err }, ErrLayout},
		{"nil memory", func() error { _, err := m.Prefill(nil, ok); return err }, ErrLayout},
		{"decode short table", func() error {
			_, err := m.Decode(kv, []DecodeInput{{Token: 1, Pos: 16, BlockTable: table(0, 1)}})
			return err
		}, ErrBlockTable},
		{"decode bad token", func() error {
			_, err := m.Decode(kv, []DecodeInput{{Token: 999, Pos: 1, BlockTable: table(0, 1)}})
			return err
		}, ErrToken},
		{"decode duplicate slot", func() error {
			_, err := m.Decode(kv, []DecodeInput{{Token: 1, Pos: 3, BlockTable: table(0, 1)}, {Token: 2, Pos: 3, BlockTable: table(0, 1)}})
			return err
		}, ErrInput},
		{"blend empty", func() error {
			_, _, err := m.BlendForward(kv, BlendInput{BlockTable: table(0, 1), CheckLayer: UseConfig, RecompRatio: UseConfig})
			return err
		}, ErrInput},
		{"blend overlapping ranges", func() error {
			_, _, err := m.BlendForward(kv, BlendInput{Tokens: randTokens(1, 20), BlockTable: table(0, 2),
				Reused: []reuseplan.Range{{Start: 2, End: 8}, {Start: 6, End: 10}}, CheckLayer: UseConfig, RecompRatio: UseConfig})
			return err
		}, ErrInput},
		{"blend range inside prefix", func() error {
			_, _, err := m.BlendForward(kv, BlendInput{Tokens: randTokens(1, 20), BlockTable: table(0, 2),
				PrefixReused: 5, Reused: []reuseplan.Range{{Start: 2, End: 8}}, CheckLayer: UseConfig, RecompRatio: UseConfig})
			return err
		}, ErrInput},
		{"blend range beyond prompt", func() error {
			_, _, err := m.BlendForward(kv, BlendInput{Tokens: randTokens(1, 20), BlockTable: table(0, 2),
				Reused: []reuseplan.Range{{Start: 12, End: 21}}, CheckLayer: UseConfig, RecompRatio: UseConfig})
			return err
		}, ErrInput},
		{"blend ratio above one", func() error {
			_, _, err := m.BlendForward(kv, BlendInput{Tokens: randTokens(1, 20), BlockTable: table(0, 2),
				Reused: []reuseplan.Range{{Start: 2, End: 8}}, CheckLayer: UseConfig, RecompRatio: 1.5})
			return err
		}, ErrInput},
		{"blend check layer beyond layers", func() error {
			_, _, err := m.BlendForward(kv, BlendInput{Tokens: randTokens(1, 20), BlockTable: table(0, 2),
				Reused: []reuseplan.Range{{Start: 2, End: 8}}, CheckLayer: 4, RecompRatio: UseConfig})
			return err
		}, ErrInput},
		{"blend too long", func() error {
			_, _, err := m.BlendForward(kv, BlendInput{Tokens: make([]int32, 8193), BlockTable: table(0, 2),
				CheckLayer: UseConfig, RecompRatio: UseConfig})
			return err
		}, ErrPosition},
		{"blend short table", func() error {
			_, _, err := m.BlendForward(kv, BlendInput{Tokens: randTokens(1, 20), BlockTable: table(0, 1),
				CheckLayer: UseConfig, RecompRatio: UseConfig})
			return err
		}, ErrBlockTable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}
}

// A one-thread view computes what the model computes, without starting a
// goroutine, and leaves the model's own threads alone.
func TestWithThreads(t *testing.T) {
	cfg := smallConfig()
	cfg.Threads = 2
	m := newModel(t, cfg)
	serial := m.WithThreads(1)
	if serial.Config().Threads != 1 || m.Config().Threads != 2 {
		t.Fatalf("threads: view %d, model %d", serial.Config().Threads, m.Config().Threads)
	}
	toks := randTokens(3, 150)
	n := blocksFor(len(toks))
	kv := newKV(t, m, 2*n)
	want, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: table(0, n)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := serial.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: table(n, n)})
	if err != nil {
		t.Fatal(err)
	}
	if d := maxAbsDiff(want, got); d > 1e-5 {
		t.Fatalf("one-thread view differs by %g", d)
	}
	other, err := serial.Prefill(kv, PrefillInput{Tokens: randTokens(4, 150), BlockTable: table(n, n)})
	if err != nil {
		t.Fatal(err)
	}
	if maxAbsDiff(other, got) == 0 {
		t.Fatal("another prompt gave the same logits")
	}
}
