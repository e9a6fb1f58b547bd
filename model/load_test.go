package model

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/quant"
)

// editFile returns the built-in small model's file with edit applied to its
// metadata and tensors.
func editFile(t *testing.T, edit func(kv []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor)) *gguf.File {
	t.Helper()
	data, err := BuiltinGGUF(smallConfig())
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	kv := slices.Clone(f.KV)
	var ts []gguf.WriteTensor
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		ts = append(ts, gguf.WriteTensor{Name: ti.Name, Dims: ti.Dims, Type: ti.Type, Data: f.Data(ti)})
	}
	kv, ts = edit(kv, ts)
	out, err := gguf.Encode(kv, ts)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func setKV(kv []gguf.KV, key string, v any) []gguf.KV {
	for i := range kv {
		if kv[i].Key == key {
			kv[i].Value = v
			return kv
		}
	}
	return append(kv, gguf.KV{Key: key, Value: v})
}

func TestLoadBadFiles(t *testing.T) {
	type edit = func(kv []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor)
	tensor := func(name string, fn func(*gguf.WriteTensor)) edit {
		return func(kv []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			for i := range ts {
				if ts[i].Name == name {
					fn(&ts[i])
				}
			}
			return kv, ts
		}
	}
	meta := func(key string, v any) edit {
		return func(kv []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return setKV(kv, key, v), ts
		}
	}
	for _, tc := range []struct {
		name string
		edit edit
		want string
	}{
		{"unsupported architecture", meta("general.architecture", "gemma3"), `architecture "gemma3"`},
		{"missing layer count", func(kv []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return slices.DeleteFunc(kv, func(e gguf.KV) bool { return e.Key == "llama.block_count" }), ts
		}, "llama.block_count"},
		{"absurd layer count", meta("llama.block_count", uint32(1<<30)), "llama.block_count"},
		{"experts", meta("llama.expert_count", uint32(8)), "mixture of experts"},
		{"yarn", meta("llama.rope.scaling.type", "yarn"), "RoPE scaling yarn"},
		{"partial rotary", meta("llama.rope.dimension_count", uint32(8)), "rope.dimension_count"},
		{"missing tensor", func(kv []gguf.KV, ts []gguf.WriteTensor) ([]gguf.KV, []gguf.WriteTensor) {
			return kv, slices.DeleteFunc(ts, func(w gguf.WriteTensor) bool { return w.Name == "blk.2.ffn_up.weight" })
		}, "missing tensor blk.2.ffn_up.weight"},
		{"mismatched shape", tensor("blk.1.attn_k.weight", func(w *gguf.WriteTensor) {
			w.Dims = []uint64{w.Dims[1], w.Dims[0]}
		}), "tensor blk.1.attn_k.weight has shape"},
		{"non-finite norm", tensor("output_norm.weight", func(w *gguf.WriteTensor) {
			w.Data = slices.Clone(w.Data)
			copy(w.Data, []byte{0, 0, 0xc0, 0x7f}) // NaN
		}), "output_norm.weight[0]"},
		{"integer tensor", tensor("blk.0.attn_norm.weight", func(w *gguf.WriteTensor) {
			w.Type = quant.I32
		}), "tensor blk.0.attn_norm.weight has type I32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := editFile(t, tc.edit)
			_, err := Load(f, Config{Threads: 1})
			if err == nil {
				t.Fatal("Load accepted the file")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not name %q", err, tc.want)
			}
			if !errors.Is(err, ErrUnsupported) && !strings.Contains(err.Error(), "missing metadata key") {
				t.Fatalf("error %v wraps neither ErrUnsupported nor gguf.ErrMissingKey", err)
			}
		})
	}
}

// TestBuiltinThroughLoad checks that New is Load of BuiltinGGUF: the same
// logits.
func TestBuiltinThroughLoad(t *testing.T) {
	cfg := smallConfig()
	a := newModel(t, cfg)
	data, err := BuiltinGGUF(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Load(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	toks := randTokens(3, 40)
	la, lb := prefillLogits(t, a, toks), prefillLogits(t, b, toks)
	if d := maxAbsDiff(la, lb); d != 0 {
		t.Fatalf("New and Load(BuiltinGGUF) differ by %g", d)
	}
	if got := b.Config().Name; got != BuiltinName {
		t.Fatalf("name %q", got)
	}
}

func prefillLogits(t *testing.T, m *Model, toks []int32) []float32 {
	t.Helper()
	kv := newKV(t, m, blocksFor(len(toks)))
	l, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: table(0, blocksFor(len(toks)))})
	if err != nil {
		t.Fatal(err)
	}
	return l
}
