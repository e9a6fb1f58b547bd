package model

import (
	"testing"

	"github.com/cacheblend/cacheblend/kvcache"
)

// TestKVTypeF16 runs the same requests on an F32 and an F16 cache: a
// prompt prefilled in three chunks (the second of three rows, attnDirect;
// the third long, attnGathered; both attend over the cache), then decode
// steps alone (attnSplit)
// and beside a second sequence of a few rows' prefill. The F16 logits
// differ from the F32 ones (the cache is rounded), by far less than
// another prompt's logits differ, and pick the same tokens.
func TestKVTypeF16(t *testing.T) {
	m := newModel(t, Config{})
	const n0, n1, steps = 70, 45, 4
	run := func(dt kvcache.DType, seed uint64) [][]float32 {
		kv := newKVOf(t, m, 2*blocksFor(n0+n1+steps), dt)
		bt := table(0, blocksFor(n0+n1+steps))
		tok := randTokens(seed, n0+n1)
		if _, err := m.Prefill(kv, PrefillInput{Tokens: tok[:n0], BlockTable: bt}); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Prefill(kv, PrefillInput{Tokens: tok[n0 : n0+3], Start: n0, BlockTable: bt}); err != nil {
			t.Fatal(err)
		}
		last, err := m.Prefill(kv, PrefillInput{Tokens: tok[n0+3:], Start: n0 + 3, BlockTable: bt})
		if err != nil {
			t.Fatal(err)
		}
		out := [][]float32{last}
		other := table(blocksFor(n0+n1+steps), 1)
		for i := range steps {
			in := []DecodeInput{{Token: int32(argmax(last)), Pos: n0 + n1 + i, BlockTable: bt}}
			if i == steps-1 { // a second sequence's first token beside it
				in = append(in, DecodeInput{Token: 'q', Pos: 0, BlockTable: other})
			}
			lg, err := m.Decode(kv, in)
			if err != nil {
				t.Fatal(err)
			}
			last = lg[0]
			out = append(out, last)
		}
		return out
	}
	f32, f16, another := run(kvcache.F32, 5), run(kvcache.F16, 5), run(kvcache.F16, 6)
	for i := range f32 {
		d, far := maxAbsDiff(f16[i], f32[i]), maxAbsDiff(another[i], f32[i])
		t.Logf("step %d: F16 against F32 %.3g, another prompt %.3g", i, d, far)
		if d == 0 || d > 0.05*far {
			t.Fatalf("step %d: F16 logits differ from F32's by %g, another prompt's by %g", i, d, far)
		}
		if a, b := argmax(f16[i]), argmax(f32[i]); a != b {
			t.Fatalf("step %d: F16 picks token %d, F32 %d", i, a, b)
		}
	}
}
