package gguf

import (
	"testing"

	"github.com/cacheblend/cacheblend/quant"
)

// FuzzParse checks that Parse never panics and that a file it accepts has
// every tensor's Data inside the input, of the right length, and no two
// tensors overlapping; accepted files re-encode and parse back equal.
func FuzzParse(f *testing.F) {
	f.Add(mustEncode(f, allKV(), testTensors()))
	f.Add(mustEncode(f, []KV{{KeyAlignment, uint32(8)}, {"a", []any{[]uint8{1}}}}, testTensors()[:1]))
	f.Add(mustEncode(f, nil, nil))
	f.Add(mustEncode(f, []KV{{"tokenizer.ggml.tokens", []string{"a", "b"}}}, nil))
	f.Add(header(2, 0).tensor("a", quant.F32, 32, 8).tensor("b", quant.Q8_0, 0, 32).data(32, 64).b)
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := Parse(data)
		if err != nil {
			return
		}
		type span struct{ lo, hi int64 }
		var spans []span
		for i := range g.Tensors {
			ti := &g.Tensors[i]
			d := g.Data(ti)
			if int64(len(d)) != ti.Size {
				t.Fatalf("tensor %q: Data has %d bytes, Size %d", ti.Name, len(d), ti.Size)
			}
			lo := g.DataOffset + int64(ti.Offset)
			hi := lo + ti.Size
			if lo < g.DataOffset || hi > int64(len(data)) || ti.Size <= 0 {
				t.Fatalf("tensor %q: [%d, %d) outside [%d, %d)", ti.Name, lo, hi, g.DataOffset, len(data))
			}
			if len(d) > 0 && &d[0] != &data[lo] {
				t.Fatalf("tensor %q: Data does not alias the input", ti.Name)
			}
			for _, s := range spans {
				if lo < s.hi && s.lo < hi {
					t.Fatalf("tensor %q overlaps another", ti.Name)
				}
			}
			spans = append(spans, span{lo, hi})
		}
		_ = g.Identity()
		// A re-encoded file parses back to the same metadata.
		ws := make([]WriteTensor, len(g.Tensors))
		for i := range g.Tensors {
			ti := &g.Tensors[i]
			ws[i] = WriteTensor{Name: ti.Name, Dims: ti.Dims, Type: ti.Type, Data: g.Data(ti)}
		}
		enc, err := Encode(g.KV, ws)
		if err != nil {
			t.Fatalf("re-encode of an accepted file: %v", err)
		}
		h, err := Parse(enc)
		if err != nil {
			t.Fatalf("parse of the re-encoded file: %v", err)
		}
		if len(h.KV) != len(g.KV) || len(h.Tensors) != len(g.Tensors) {
			t.Fatalf("re-encoded file differs")
		}
	})
}
