package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/internal/llamaref"
	"github.com/cacheblend/cacheblend/internal/testmodel"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/quant"
)

func TestMain(m *testing.M) {
	if os.Getenv(benchRankEnv) != "" {
		os.Exit(benchRank())
	}
	goleak.VerifyTestMain(m)
}

// smallConfig is the configuration unit tests use: small enough for -race.
func smallConfig() Config {
	return Config{Layers: 4, Dim: 64, Heads: 4, KVHeads: 2, FFNDim: 128, Seed: 7}
}

func newModel(tb testing.TB, cfg Config) *Model {
	tb.Helper()
	m, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return m
}

const testBlock = 16

// newKV maps an F32 KV memory of numBlocks blocks for m (removed at
// cleanup).
func newKV(tb testing.TB, m *Model, numBlocks int) *kvcache.Memory {
	tb.Helper()
	return newKVOf(tb, m, numBlocks, kvcache.F32)
}

// newKVOf is newKV of element type dt.
func newKVOf(tb testing.TB, m *Model, numBlocks int, dt kvcache.DType) *kvcache.Memory {
	tb.Helper()
	kv, err := kvcache.Create("", m.Config().KVLayout(numBlocks, testBlock, dt)) // /dev/shm, like the worker
	if err != nil {
		tb.Fatalf("kvcache.Create: %v", err)
	}
	tb.Cleanup(func() { kv.Close() })
	return kv
}

// table returns a block table of blocks [first, first+n).
func table(first, n int) []int32 {
	bt := make([]int32, n)
	for i := range bt {
		bt[i] = int32(first + i)
	}
	return bt
}

// blocksFor is the number of blocks covering n positions.
func blocksFor(n int) int { return (n + testBlock - 1) / testBlock }

// randTokens returns n byte tokens drawn from a seeded RNG.
func randTokens(seed uint64, n int) []int32 {
	r := rand.New(rand.NewPCG(seed, 1))
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(r.IntN(256))
	}
	return t
}

func maxAbsDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

func rmsDiff(a, b []float32) float64 {
	var s float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		s += d * d
	}
	return math.Sqrt(s / float64(len(a)))
}

func allFinite(x []float32) bool {
	for _, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return false
		}
	}
	return true
}

// copyKV copies the K/V of positions [from, from+n) under table src to
// positions [to, to+n) under table dst for every layer, re-RoPE-ing K from
// its old to its new position (the blend server's scatter).
func copyKV(m *Model, kv *kvcache.Memory, src []int32, from int, dst []int32, to, n int) {
	copyKVFrom(m, kv, 0, src, from, dst, to, n)
}

// copyKVFrom is copyKV of layers fromLayer.. only.
func copyKVFrom(m *Model, kv *kvcache.Memory, fromLayer int, src []int32, from int, dst []int32, to, n int) {
	bs := kv.Layout().BlockSize
	for l := fromLayer; l < m.Config().Layers; l++ {
		for i := range n {
			s, _ := kvcache.Slot(src, from+i, bs)
			d, _ := kvcache.Slot(dst, to+i, bs)
			k := kv.TokenK(l, d)
			copy(k, kv.TokenK(l, s))
			m.RoPE().Shift(k, from+i, to+i)
			copy(kv.TokenV(l, d), kv.TokenV(l, s))
		}
	}
}

// refVocab is the path of one of llama.cpp's vocabulary files.
func refVocab(t testing.TB, name string) string {
	t.Helper()
	src, err := llamaref.LlamaCppSource()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(src, "models", "ggml-vocab-"+name+".gguf")
}

// loadFile writes the test model of s and loads it with Load.
func loadFile(t testing.TB, s testmodel.Spec) (string, *Model) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.gguf")
	if err := testmodel.Write(path, s); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	m, err := Load(f, Config{Threads: 2, MaxPositions: 512})
	if err != nil {
		t.Fatal(err)
	}
	return path, m
}

// q4KMMixture gives attn_v and ffn_down of layers 2 and up Q6_K (what
// llama-quantize's use_more_bits picks in a 4-layer Q4_K_M file).
func q4KMMixture(name string, _, _ int) quant.Type {
	var layer int
	var rest string
	if _, err := fmt.Sscanf(name, "blk.%d.%s", &layer, &rest); err == nil && layer >= 2 && (strings.HasPrefix(rest, "attn_v.") || strings.HasPrefix(rest, "ffn_down.")) {
		return quant.Q6_K
	}
	return 0
}
