package chunkstore

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

var testLayout = Layout{NumLayers: 2, KVHeads: 2, HeadDim: 8, RoPETheta: 10000}

// randChunk makes a chunk of n tokens with deterministic random content.
func randChunk(t testing.TB, seed uint64, n int) *Chunk {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	tokens := make([]int32, n)
	for i := range tokens {
		tokens[i] = r.Int32N(32000)
	}
	var key Key
	for i := range key {
		key[i] = byte(r.Uint32())
	}
	c, err := NewChunk(key, "llama-test", 1, testLayout, tokens, int(seed%1000))
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.KV {
		c.KV[i] = float32(r.NormFloat64())
	}
	return c
}

func diffChunks(a, b *Chunk) error {
	switch {
	case a.Key != b.Key:
		return fmt.Errorf("key %s != %s", a.Key, b.Key)
	case a.Model != b.Model || a.Rank != b.Rank || a.Layout != b.Layout:
		return fmt.Errorf("meta %q/%d/%+v != %q/%d/%+v", a.Model, a.Rank, a.Layout, b.Model, b.Rank, b.Layout)
	case !slices.Equal(a.Tokens, b.Tokens):
		return fmt.Errorf("tokens differ")
	case !slices.Equal(a.Positions, b.Positions):
		return fmt.Errorf("positions differ")
	case len(a.KV) != len(b.KV):
		return fmt.Errorf("KV length %d != %d", len(a.KV), len(b.KV))
	}
	for i := range a.KV {
		if math.Float32bits(a.KV[i]) != math.Float32bits(b.KV[i]) {
			return fmt.Errorf("KV[%d] %v != %v", i, a.KV[i], b.KV[i])
		}
	}
	return nil
}
