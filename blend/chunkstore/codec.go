package chunkstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"syscall"
	"unsafe"
)

// ErrCorrupt reports chunk data that cannot be trusted: bad magic, an
// unsupported version, a size or checksum mismatch, a truncated file or
// inconsistent header fields. The store treats it as a miss and counts it.
var ErrCorrupt = errors.New("chunkstore: corrupt chunk data")

// FileVersion is the version of the chunk file format written by this
// package; other versions are rejected as corrupt.
const FileVersion = 1

// MaxFileBytes bounds the size of one encoded chunk (1 GiB).
const MaxFileBytes = 1 << 30

// File format, version 1, all integers little endian:
//
//	0   magic "CBKVCHNK"
//	8   version u32
//	12  header length H u32 (= align64(84 + model length))
//	16  key [32]byte
//	48  rank u32
//	52  layers u32, 56 kv heads u32, 60 head dim u32
//	64  RoPE theta float64 bits
//	72  n tokens u32
//	76  positions start u32 (= positions[0])
//	80  model length u16, 82 reserved u16 (0)
//	84  model bytes, zero padding up to H
//	H   token ids [n]u32, positions [n]u32, zero padding up to a multiple of 64
//	    KV float32: per layer the K plane then the V plane, each [n][heads*dim]
//	end-4  CRC-32C (Castagnoli) of every preceding byte
const (
	fileMagic = "CBKVCHNK"
	fixedHdr  = 84
	align     = 64
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// littleEndian is true on little-endian machines, where float32 and int32
// slices are written and read without conversion.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func alignUp(n int) int { return (n + align - 1) &^ (align - 1) }

// fileLayout is the byte layout of one encoded chunk.
type fileLayout struct {
	hdr, tokOff, posOff, kvOff, crcOff, size int
}

func layoutFor(modelLen, n, kvFloats int) fileLayout {
	var f fileLayout
	f.hdr = alignUp(fixedHdr + modelLen)
	f.tokOff = f.hdr
	f.posOff = f.tokOff + 4*n
	f.kvOff = alignUp(f.posOff + 4*n)
	f.crcOff = f.kvOff + 4*kvFloats
	f.size = f.crcOff + 4
	return f
}

// EncodedSize is the number of bytes EncodeChunk produces for c.
func EncodedSize(c *Chunk) int64 {
	return int64(layoutFor(len(c.Model), len(c.Tokens), len(c.KV)).size)
}

// EncodeChunk returns the chunk-file encoding of c (format FileVersion). It
// fails on a chunk that does not Validate or that would exceed MaxFileBytes.
func EncodeChunk(c *Chunk) ([]byte, error) {
	var b bytes.Buffer
	if err := c.Validate(); err != nil {
		return nil, err
	}
	b.Grow(int(EncodedSize(c)))
	if _, err := writeChunk(&b, c); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// writeChunk writes the encoding of a validated chunk to w and returns the
// number of bytes written.
func writeChunk(w io.Writer, c *Chunk) (int64, error) {
	n := len(c.Tokens)
	fl := layoutFor(len(c.Model), n, len(c.KV))
	if fl.size > MaxFileBytes {
		return 0, fmt.Errorf("%w: encoded chunk of %d bytes exceeds %d", ErrBadChunk, fl.size, MaxFileBytes)
	}
	crc := crc32.New(castagnoli)
	mw := io.MultiWriter(w, crc)

	head := make([]byte, fl.kvOff)
	copy(head, fileMagic)
	le := binary.LittleEndian
	le.PutUint32(head[8:], FileVersion)
	le.PutUint32(head[12:], uint32(fl.hdr))
	copy(head[16:48], c.Key[:])
	le.PutUint32(head[48:], uint32(c.Rank))
	le.PutUint32(head[52:], uint32(c.Layout.NumLayers))
	le.PutUint32(head[56:], uint32(c.Layout.KVHeads))
	le.PutUint32(head[60:], uint32(c.Layout.HeadDim))
	le.PutUint64(head[64:], math.Float64bits(c.Layout.RoPETheta))
	le.PutUint32(head[72:], uint32(n))
	le.PutUint32(head[76:], uint32(c.Positions[0]))
	le.PutUint16(head[80:], uint16(len(c.Model)))
	copy(head[fixedHdr:], c.Model)
	for i, t := range c.Tokens {
		le.PutUint32(head[fl.tokOff+4*i:], uint32(t))
	}
	for i, p := range c.Positions {
		le.PutUint32(head[fl.posOff+4*i:], uint32(p))
	}
	total := int64(0)
	m, err := mw.Write(head)
	total += int64(m)
	if err != nil {
		return total, fmt.Errorf("chunkstore: write chunk header: %w", err)
	}
	if littleEndian {
		m, err = mw.Write(floatBytes(c.KV))
		total += int64(m)
	} else {
		buf := make([]byte, 0, 64<<10)
		for i := 0; i < len(c.KV) && err == nil; {
			buf = buf[:0]
			for ; i < len(c.KV) && len(buf) < cap(buf); i++ {
				buf = le.AppendUint32(buf, math.Float32bits(c.KV[i]))
			}
			m, err = mw.Write(buf)
			total += int64(m)
		}
	}
	if err != nil {
		return total, fmt.Errorf("chunkstore: write chunk KV: %w", err)
	}
	m, err = w.Write(le.AppendUint32(nil, crc.Sum32()))
	total += int64(m)
	if err != nil {
		return total, fmt.Errorf("chunkstore: write chunk checksum: %w", err)
	}
	return total, nil
}

// floatBytes views a float32 slice as its bytes (native byte order).
func floatBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// DecodeChunk parses a chunk file's bytes. It never panics: bad magic, an
// unsupported version, a checksum mismatch, truncation, trailing bytes or any
// inconsistent header field yield an error wrapping ErrCorrupt. The returned
// chunk does not alias data. Safe for concurrent use.
func DecodeChunk(data []byte) (*Chunk, error) { return decode(data, false) }

// DecodeOwnedChunk is DecodeChunk for data the caller hands over (it must
// not be used or changed afterwards): the chunk's slices may alias it,
// which saves a copy of the KV.
func DecodeOwnedChunk(data []byte) (*Chunk, error) { return decode(data, true) }

// decode parses data; with alias (and a little-endian machine and aligned
// data) the chunk's slices point into data, which the caller must own.
func decode(data []byte, alias bool) (*Chunk, error) {
	le := binary.LittleEndian
	if len(data) < fixedHdr+4 {
		return nil, fmt.Errorf("%w: %d bytes is shorter than a header", ErrCorrupt, len(data))
	}
	if string(data[:8]) != fileMagic {
		return nil, fmt.Errorf("%w: bad magic %q", ErrCorrupt, data[:8])
	}
	if v := le.Uint32(data[8:]); v != FileVersion {
		return nil, fmt.Errorf("%w: unsupported version %d (want %d)", ErrCorrupt, v, FileVersion)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrCorrupt, len(data), MaxFileBytes)
	}
	body := data[:len(data)-4]
	if got, want := crc32.Checksum(body, castagnoli), le.Uint32(data[len(data)-4:]); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, header says %08x", ErrCorrupt, got, want)
	}
	var c Chunk
	copy(c.Key[:], data[16:48])
	rank := le.Uint32(data[48:])
	layers := le.Uint32(data[52:])
	heads := le.Uint32(data[56:])
	dim := le.Uint32(data[60:])
	c.Layout.RoPETheta = math.Float64frombits(le.Uint64(data[64:]))
	n := le.Uint32(data[72:])
	posStart := le.Uint32(data[76:])
	modelLen := int(le.Uint16(data[80:]))
	if le.Uint16(data[82:]) != 0 {
		return nil, fmt.Errorf("%w: reserved field set", ErrCorrupt)
	}
	if rank > math.MaxInt32 || layers == 0 || layers > MaxLayers || heads == 0 || heads > MaxKVHeads ||
		dim == 0 || dim > MaxHeadDim || n == 0 || n > MaxChunkTokens || modelLen > MaxModelLen ||
		posStart > math.MaxInt32 {
		return nil, fmt.Errorf("%w: header fields out of range (rank %d, layers %d, heads %d, dim %d, tokens %d, model %d bytes)",
			ErrCorrupt, rank, layers, heads, dim, n, modelLen)
	}
	c.Rank = int(rank)
	c.Layout.NumLayers, c.Layout.KVHeads, c.Layout.HeadDim = int(layers), int(heads), int(dim)
	if err := c.Layout.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	// Sizes are bounded above (layers*heads*dim*n*8 < 2^59), so no overflow.
	kvFloats := uint64(2) * uint64(layers) * uint64(n) * uint64(heads) * uint64(dim)
	if kvFloats*4 > MaxFileBytes {
		return nil, fmt.Errorf("%w: declared KV of %d floats exceeds the file limit", ErrCorrupt, kvFloats)
	}
	fl := layoutFor(modelLen, int(n), int(kvFloats))
	if int(le.Uint32(data[12:])) != fl.hdr {
		return nil, fmt.Errorf("%w: header length %d, want %d", ErrCorrupt, le.Uint32(data[12:]), fl.hdr)
	}
	if len(data) != fl.size {
		return nil, fmt.Errorf("%w: %d bytes, header declares %d (truncated or padded)", ErrCorrupt, len(data), fl.size)
	}
	if !allZero(data[fixedHdr+modelLen:fl.hdr]) || !allZero(data[fl.posOff+4*int(n):fl.kvOff]) {
		return nil, fmt.Errorf("%w: non-zero padding", ErrCorrupt)
	}
	c.Model = string(data[fixedHdr : fixedHdr+modelLen])
	c.Tokens = int32s(data[fl.tokOff:fl.posOff], alias)
	c.Positions = int32s(data[fl.posOff:fl.posOff+4*int(n)], alias)
	if uint32(c.Positions[0]) != posStart {
		return nil, fmt.Errorf("%w: positions start %d, header says %d", ErrCorrupt, c.Positions[0], posStart)
	}
	for _, p := range c.Positions {
		if p < 0 {
			return nil, fmt.Errorf("%w: negative position %d", ErrCorrupt, p)
		}
	}
	c.KV = float32s(data[fl.kvOff:fl.crcOff], alias)
	return &c, nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

func aligned4(b []byte) bool { return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 == 0 }

// int32s converts little-endian bytes (len a multiple of 4, non-empty) to
// int32s, aliasing b when allowed and possible.
func int32s(b []byte, alias bool) []int32 {
	if alias && littleEndian && aligned4(b) {
		return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
	}
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// float32s converts little-endian bytes to float32s, aliasing b when allowed
// and possible.
func float32s(b []byte, alias bool) []float32 {
	if alias && littleEndian && aligned4(b) {
		return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
	}
	out := make([]float32, len(b)/4)
	if littleEndian {
		copy(floatBytes(out), b)
		return out
	}
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// readChunkFile reads and decodes one chunk file into a buffer the returned
// chunk aliases (one allocation per chunk). It returns the file size read.
// A missing file yields an error wrapping os.ErrNotExist; bad content, a
// symlink, anything but a regular file (a FIFO, a device: opened without
// blocking, never read) or a file of another user an error wrapping
// ErrCorrupt.
func readChunkFile(path string) (*Chunk, int64, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, 0, fmt.Errorf("%w: %s is a symbolic link", ErrCorrupt, path)
	}
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !st.Mode().IsRegular() {
		return nil, 0, fmt.Errorf("%w: %s is not a regular file (%v)", ErrCorrupt, path, st.Mode().Type())
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		return nil, 0, fmt.Errorf("%w: %s is owned by uid %d, not this process's %d", ErrCorrupt, path, sys.Uid, os.Getuid())
	}
	size := st.Size()
	if size > MaxFileBytes || size < fixedHdr+4 {
		return nil, size, fmt.Errorf("%w: file of %d bytes", ErrCorrupt, size)
	}
	// Allocate as float32 so the KV view is aligned for any allocator.
	backing := make([]float32, (size+3)/4)
	buf := floatBytes(backing)[:size]
	if _, err := io.ReadFull(f, buf); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, size, fmt.Errorf("%w: short read: %w", ErrCorrupt, err)
		}
		return nil, size, err
	}
	c, err := decode(buf, true)
	return c, size, err
}
