package chunkstore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"

	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/reuseplan"
)

// DefaultChunkSize is the number of tokens per chunk when a Config or a
// ChainKeys call leaves it zero.
const DefaultChunkSize = defaults.ChunkSize // 256

// Limits that bound what a chunk (and so a chunk file) may declare. They keep
// a corrupt or hostile file from asking for an absurd allocation.
const (
	MaxChunkTokens = 1 << 16 // tokens in one chunk
	MaxLayers      = 1 << 12 // transformer layers
	MaxKVHeads     = 1 << 12 // key/value heads
	MaxHeadDim     = 1 << 14 // head dimension
	MaxModelLen    = 1 << 10 // bytes of the model name
)

// ErrBadChunk reports a chunk that is malformed (a caller bug): inconsistent
// lengths, a bad layout, too many tokens.
var ErrBadChunk = errors.New("chunkstore: bad chunk")

// Key identifies a chunk: a SHA-256 of the chunk's prefix chain (see
// ChainKeys). It is the reuse plan's key type.
type Key = reuseplan.Key

// KeyFromBytes converts the raw 32 bytes of a key (as carried in RPCs) to a
// Key; any other length is an error.
func KeyFromBytes(b []byte) (Key, error) { return reuseplan.KeyFromBytes(b) }

// ParseKey parses the hex form produced by Key.String.
func ParseKey(s string) (Key, error) {
	var k Key
	if len(s) != 2*len(k) {
		return k, fmt.Errorf("chunkstore: key %q has %d hex digits, want %d", s, len(s), 2*len(k))
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return k, fmt.Errorf("chunkstore: parse key: %w", err)
	}
	return k, nil
}

// ChainKeys computes the prefix-chain keys of a token sequence split into
// chunks of chunkSize tokens (DefaultChunkSize when <= 0; the last chunk may be
// shorter): key_i = SHA-256(key_{i-1} || model || rank || tokens of chunk i),
// with key_{-1} all zero and every field length-prefixed. Two sequences share
// key_i exactly when they share model, rank and all tokens up to the end of
// chunk i. It is a pure function, safe for concurrent use.
func ChainKeys(model string, rank int, tokens []int32, chunkSize int) []Key {
	if chunkSize <= 0 {
		chunkSize = DefaultChunkSize
	}
	n := (len(tokens) + chunkSize - 1) / chunkSize
	keys := make([]Key, n)
	h := sha256.New()
	buf := make([]byte, 0, 32+4+len(model)+8+4+4*min(chunkSize, len(tokens)))
	var prev Key
	for i := range n {
		lo := i * chunkSize
		hi := min(lo+chunkSize, len(tokens))
		buf = buf[:0]
		buf = append(buf, prev[:]...)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(model)))
		buf = append(buf, model...)
		buf = binary.LittleEndian.AppendUint64(buf, uint64(int64(rank)))
		buf = binary.LittleEndian.AppendUint32(buf, uint32(hi-lo))
		for _, t := range tokens[lo:hi] {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
		h.Reset()
		h.Write(buf)
		h.Sum(keys[i][:0])
		prev = keys[i]
	}
	return keys
}

// CountPrefix is the prefix leg of the unified lookup: the number of leading
// keys (from ChainKeys of the prompt) for which present reports true. It stops
// at the first absent key, since a later chunk's key is only meaningful after
// all earlier ones.
func CountPrefix(keys []Key, present func(Key) bool) int {
	for i, k := range keys {
		if !present(k) {
			return i
		}
	}
	return len(keys)
}

// Layout is the per-rank shape of a chunk's KV: layers, KV heads, head
// dimension and the RoPE base K was rotated with (needed to re-RoPE exactly).
// A plain value, safe to copy.
type Layout struct {
	NumLayers int
	KVHeads   int
	HeadDim   int
	RoPETheta float64
}

// LayoutOf is the chunk layout matching a worker's paged KV layout and the
// model's RoPE base.
func LayoutOf(l kvcache.Layout, ropeTheta float64) Layout {
	return Layout{NumLayers: l.NumLayers, KVHeads: l.KVHeads, HeadDim: l.HeadDim, RoPETheta: ropeTheta}
}

// Validate reports whether every dimension is positive and within the package
// limits and the RoPE base is finite and non-negative.
func (l Layout) Validate() error {
	switch {
	case l.NumLayers <= 0 || l.NumLayers > MaxLayers,
		l.KVHeads <= 0 || l.KVHeads > MaxKVHeads,
		l.HeadDim <= 0 || l.HeadDim > MaxHeadDim,
		math.IsNaN(l.RoPETheta) || math.IsInf(l.RoPETheta, 0) || l.RoPETheta < 0:
		return fmt.Errorf("%w: layout %+v", ErrBadChunk, l)
	}
	return nil
}

// TokenFloats is the number of float32 values of one token in one K or V
// plane of one layer (KVHeads*HeadDim).
func (l Layout) TokenFloats() int { return l.KVHeads * l.HeadDim }

// Compatible reports whether KV of layout l can be written into a paged
// memory of layout m (same layers, heads and head dimension).
func (l Layout) Compatible(m kvcache.Layout) bool {
	return l.NumLayers == m.NumLayers && l.KVHeads == m.KVHeads && l.HeadDim == m.HeadDim
}

// chunkOverhead is the fixed number of bytes charged per chunk on top of its
// arrays (struct, map and list entries), so that the L1 budget bounds real
// memory rather than just payload.
const chunkOverhead = 256

// Chunk is up to ChunkSize consecutive tokens of a stored sequence with their
// K and V for every layer of one rank. KV is one backing slice laid out as,
// for every layer, the K plane then the V plane, each [len(Tokens)][TokenFloats]
// float32. Positions[i] is the position token i's K was rotated at.
//
// A Chunk handed to Store.Put or returned by the Store is shared and must be
// treated as immutable; concurrent reads are safe.
type Chunk struct {
	Key       Key
	Model     string
	Rank      int
	Layout    Layout
	Tokens    []int32
	Positions []int32
	KV        []float32
}

// NewChunk returns a chunk with copies of tokens, positions startPos,
// startPos+1, … and a zeroed KV slice of the right size, ready to be filled.
func NewChunk(key Key, model string, rank int, layout Layout, tokens []int32, startPos int) (*Chunk, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	n := len(tokens)
	if n == 0 || n > MaxChunkTokens {
		return nil, fmt.Errorf("%w: %d tokens (want 1..%d)", ErrBadChunk, n, MaxChunkTokens)
	}
	if startPos < 0 || startPos > math.MaxInt32-n {
		return nil, fmt.Errorf("%w: start position %d", ErrBadChunk, startPos)
	}
	if len(model) > MaxModelLen {
		return nil, fmt.Errorf("%w: model name of %d bytes", ErrBadChunk, len(model))
	}
	if rank < 0 || rank > math.MaxInt32 {
		return nil, fmt.Errorf("%w: rank %d", ErrBadChunk, rank)
	}
	c := &Chunk{
		Key:       key,
		Model:     model,
		Rank:      rank,
		Layout:    layout,
		Tokens:    append([]int32(nil), tokens...),
		Positions: make([]int32, n),
		KV:        make([]float32, 2*layout.NumLayers*n*layout.TokenFloats()),
	}
	for i := range c.Positions {
		c.Positions[i] = int32(startPos + i)
	}
	return c, nil
}

// Len is the number of tokens in the chunk.
func (c *Chunk) Len() int { return len(c.Tokens) }

// K is the key plane of layer: len(Tokens) rows of TokenFloats values.
func (c *Chunk) K(layer int) []float32 {
	n := len(c.Tokens) * c.Layout.TokenFloats()
	off := 2 * layer * n
	return c.KV[off : off+n : off+n]
}

// V is the value plane of layer: len(Tokens) rows of TokenFloats values.
func (c *Chunk) V(layer int) []float32 {
	n := len(c.Tokens) * c.Layout.TokenFloats()
	off := (2*layer + 1) * n
	return c.KV[off : off+n : off+n]
}

// TokenK is the K row of token i of layer.
func (c *Chunk) TokenK(layer, i int) []float32 {
	t := c.Layout.TokenFloats()
	return c.K(layer)[i*t : (i+1)*t : (i+1)*t]
}

// TokenV is the V row of token i of layer.
func (c *Chunk) TokenV(layer, i int) []float32 {
	t := c.Layout.TokenFloats()
	return c.V(layer)[i*t : (i+1)*t : (i+1)*t]
}

// Size is the number of bytes the chunk is charged in the L1 budget: its
// arrays plus a fixed per-chunk overhead.
func (c *Chunk) Size() int64 {
	return 4*int64(len(c.KV)+len(c.Tokens)+len(c.Positions)) + int64(len(c.Model)) + chunkOverhead
}

// Validate reports whether the chunk is internally consistent: a valid layout,
// 1..MaxChunkTokens tokens, one non-negative position per token and a KV
// slice of exactly 2*NumLayers*len(Tokens)*TokenFloats values.
func (c *Chunk) Validate() error {
	if c == nil {
		return fmt.Errorf("%w: nil chunk", ErrBadChunk)
	}
	if err := c.Layout.Validate(); err != nil {
		return err
	}
	n := len(c.Tokens)
	if n == 0 || n > MaxChunkTokens {
		return fmt.Errorf("%w: %d tokens (want 1..%d)", ErrBadChunk, n, MaxChunkTokens)
	}
	if len(c.Positions) != n {
		return fmt.Errorf("%w: %d positions for %d tokens", ErrBadChunk, len(c.Positions), n)
	}
	for _, p := range c.Positions {
		if p < 0 {
			return fmt.Errorf("%w: negative position %d", ErrBadChunk, p)
		}
	}
	if want := 2 * c.Layout.NumLayers * n * c.Layout.TokenFloats(); len(c.KV) != want {
		return fmt.Errorf("%w: %d KV values, layout needs %d", ErrBadChunk, len(c.KV), want)
	}
	if len(c.Model) > MaxModelLen {
		return fmt.Errorf("%w: model name of %d bytes", ErrBadChunk, len(c.Model))
	}
	if c.Rank < 0 || c.Rank > math.MaxInt32 {
		return fmt.Errorf("%w: rank %d", ErrBadChunk, c.Rank)
	}
	return nil
}
