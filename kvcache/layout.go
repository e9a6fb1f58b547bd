package kvcache

import (
	"errors"
	"fmt"
	"strings"
)

// ErrBadLayout reports a layout with a non-positive dimension or one too large
// to map.
var ErrBadLayout = errors.New("kvcache: bad layout")

// ErrSlotOutOfRange reports a position whose block is not (yet) allocated in
// the block table.
var ErrSlotOutOfRange = errors.New("kvcache: position beyond the allocated blocks")

// maxBytes bounds a mapping (64 GiB) so that a corrupt descriptor cannot ask
// for an absurd mapping.
const maxBytes = 64 << 30

// DType is the element type of a KV memory's K and V values.
type DType uint8

// The element types. F32 is the zero value; F16 halves the memory and the
// bytes every decode step reads from it (llama.cpp's default cache type),
// at a rounding error of 2⁻¹¹ relative per value.
const (
	F32 DType = iota // IEEE 754 binary32, 4 bytes per value
	F16              // IEEE 754 binary16, 2 bytes per value (round to nearest even)
)

// Size is the number of bytes of one value (0 for an unknown type).
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16:
		return 2
	}
	return 0
}

// String names the type as ParseDType and the --kv-type flag spell it.
func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F16:
		return "f16"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ParseDType parses "f32" or "f16" (any case); anything else is an error
// wrapping ErrBadLayout.
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "f32":
		return F32, nil
	case "f16":
		return F16, nil
	}
	return 0, fmt.Errorf("%w: KV type %q (want f32 or f16)", ErrBadLayout, s)
}

// Layout describes the paged KV memory of one worker (one rank). It is a plain
// value, safe to copy and to use concurrently.
type Layout struct {
	NumLayers int   // transformer layers
	NumBlocks int   // blocks in the pool
	BlockSize int   // tokens per block (default 16 in the stack)
	KVHeads   int   // key/value heads (grouped-query attention)
	HeadDim   int   // dimension of one head
	DType     DType // element type of K and V (zero value F32)
}

// Validate reports whether every dimension is positive, the element type
// known and the mapping within bounds.
func (l Layout) Validate() error {
	if l.NumLayers <= 0 || l.NumBlocks <= 0 || l.BlockSize <= 0 || l.KVHeads <= 0 || l.HeadDim <= 0 {
		return fmt.Errorf("%w: %+v", ErrBadLayout, l)
	}
	if l.DType.Size() == 0 {
		return fmt.Errorf("%w: unknown element type %v", ErrBadLayout, l.DType)
	}
	if l.Bytes() > maxBytes || l.Bytes() <= 0 {
		return fmt.Errorf("%w: %d bytes exceeds the %d byte limit", ErrBadLayout, l.Bytes(), int64(maxBytes))
	}
	return nil
}

// TokenFloats is the number of values one token occupies in one plane
// (KVHeads*HeadDim), whatever their element type.
func (l Layout) TokenFloats() int { return l.KVHeads * l.HeadDim }

// Slots is the number of token slots in the pool (NumBlocks*BlockSize).
func (l Layout) Slots() int { return l.NumBlocks * l.BlockSize }

// PlaneFloats is the number of values in one K or V plane of one layer.
func (l Layout) PlaneFloats() int { return l.Slots() * l.TokenFloats() }

// Bytes is the size of the whole mapping: K and V planes of every layer.
func (l Layout) Bytes() int64 {
	return int64(2) * int64(l.NumLayers) * int64(l.NumBlocks) * int64(l.BlockSize) * int64(l.KVHeads) * int64(l.HeadDim) * int64(l.DType.Size())
}

// TokenBytes is the number of bytes one token occupies across all layers, K and
// V (the unit of KV transfer accounting).
func (l Layout) TokenBytes() int64 {
	return int64(2*l.NumLayers*l.TokenFloats()) * int64(l.DType.Size())
}

// RowBytes is the number of bytes one token occupies in one plane of one
// layer (TokenFloats values).
func (l Layout) RowBytes() int { return l.TokenFloats() * l.DType.Size() }

// Slot maps a token position to its slot in the pool:
// blockTable[pos/blockSize]*blockSize + pos%blockSize. It returns
// ErrSlotOutOfRange when pos falls beyond the blocks allocated so far (the
// bound guard of a partial first retrieve) or pos is negative.
func Slot(blockTable []int32, pos, blockSize int) (int, error) {
	if pos < 0 || blockSize <= 0 {
		return 0, fmt.Errorf("%w: pos %d", ErrSlotOutOfRange, pos)
	}
	b := pos / blockSize
	if b >= len(blockTable) {
		return 0, fmt.Errorf("%w: pos %d needs block %d, table has %d", ErrSlotOutOfRange, pos, b, len(blockTable))
	}
	return int(blockTable[b])*blockSize + pos%blockSize, nil
}

// SlotMapping fills dst with the slot of every position in [start, end) and
// returns how many leading positions have a slot (positions beyond the
// allocated blocks are not mapped). dst must have room for end-start values.
func SlotMapping(dst []int, blockTable []int32, start, end, blockSize int) int {
	n := 0
	for pos := start; pos < end; pos++ {
		b := pos / blockSize
		if b >= len(blockTable) {
			break
		}
		dst[n] = int(blockTable[b])*blockSize + pos%blockSize
		n++
	}
	return n
}

// Capacity is the number of token positions covered by a block table.
func Capacity(blockTable []int32, blockSize int) int { return len(blockTable) * blockSize }
