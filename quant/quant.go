package quant

import (
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// ErrUnsupported is wrapped by the errors of functions given a type that
// [Type.Supported] rejects.
var ErrUnsupported = errors.New("quant: tensor type not supported")

// ErrSize is wrapped by the errors of functions given slices whose lengths
// do not fit the type's blocks or each other.
var ErrSize = errors.New("quant: bad size")

// ErrNonFinite is wrapped by the error of [Quantize] when a block type is
// asked to encode an Inf or NaN (the float types encode them).
var ErrNonFinite = errors.New("quant: non-finite value")

// ErrRange is wrapped by the error of [Quantize] when values are too large
// for a block type: its f16 scales would overflow to Inf.
var ErrRange = errors.New("quant: value out of range")

// scaleOffsets are the byte offsets of the f16 scale fields in a block of
// each block type.
var scaleOffsets = map[Type][]int{
	Q8_0: {0}, Q4_0: {0}, Q5_0: {0}, Q4_1: {0, 2}, Q5_1: {0, 2},
	Q4_K: {0, 2}, Q5_K: {0, 2}, Q6_K: {208},
}

// kernels is one computable type's row functions. Each takes whole rows
// whose sizes the exported wrappers have checked.
type kernels struct {
	bs, ts  int // block size in elements and bytes
	dequant func(src []byte, dst []float32)
	dot     func(row []byte, x []float32) float32
	quant   func(src []float32, dst []byte)

	// The pure-Go kernels, kept when useAsm replaces dequant and dot (the
	// tests compare the two).
	dequantGo func(src []byte, dst []float32)
	dotGo     func(row []byte, x []float32) float32
}

// kern is indexed by Type; nil for a type that cannot be computed.
var kern [BF16 + 1]*kernels

func init() {
	set := func(t Type, dq func([]byte, []float32), dot func([]byte, []float32) float32, q func([]float32, []byte)) {
		kern[t] = &kernels{bs: t.BlockSize(), ts: t.TypeSize(), dequant: dq, dot: dot, quant: q, dequantGo: dq, dotGo: dot}
	}
	set(F32, dequantF32, dotF32, quantF32)
	set(F16, dequantF16, dotF16, quantF16)
	set(BF16, dequantBF16, dotBF16, quantBF16)
	set(Q4_0, dequantQ4_0, dotQ4_0, quantQ4_0)
	set(Q4_1, dequantQ4_1, dotQ4_1, quantQ4_1)
	set(Q5_0, dequantQ5_0, dotQ5_0, quantQ5_0)
	set(Q5_1, dequantQ5_1, dotQ5_1, quantQ5_1)
	set(Q8_0, dequantQ8_0, dotQ8_0, quantQ8_0)
	set(Q4_K, dequantQ4_K, dotQ4_K, quantQ4_K)
	set(Q5_K, dequantQ5_K, dotQ5_K, quantQ5_K)
	set(Q6_K, dequantQ6_K, dotQ6_K, quantQ6_K)
	useAsm()
}

func kernelsOf(t Type) *kernels {
	if t < Type(len(kern)) {
		return kern[t]
	}
	return nil
}

// Supported reports whether tensors of type t can be computed by this
// package (dequantized, dotted and quantized): F32, F16, BF16, Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K.
func (t Type) Supported() bool { return kernelsOf(t) != nil }

// layout returns the kernels of t and the byte size of a row of n
// elements, failing for a type that cannot be computed or a length that is
// not a whole number of blocks (cheap: it runs on every Dot).
func layout(t Type, n int) (*kernels, int, error) {
	k := kernelsOf(t)
	if k == nil {
		return nil, 0, fmt.Errorf("%w: %s", ErrUnsupported, t)
	}
	if n < 0 || n%k.bs != 0 {
		return nil, 0, fmt.Errorf("%w: a row of %d elements is not a whole number of %s blocks of %d", ErrSize, n, t, k.bs)
	}
	return k, n / k.bs * k.ts, nil
}

// checkRow is layout that also checks that the row has nbytes bytes.
func checkRow(t Type, nbytes, n int) (*kernels, error) {
	k, rb, err := layout(t, n)
	if err != nil {
		return nil, err
	}
	if nbytes != rb {
		return nil, fmt.Errorf("%w: %d bytes for a row of %d %s elements (want %d)", ErrSize, nbytes, n, t, rb)
	}
	return k, nil
}

// DequantizeRow decodes the len(dst) elements of type t held in src into
// dst. src must be exactly t.RowBytes(len(dst)) bytes (len(dst) a multiple
// of t's block size); it fails, leaving dst unchanged, for an unsupported
// type or mismatched sizes. The values are those of ggml's
// dequantize_row_* bit for bit. Safe for concurrent use.
func DequantizeRow(t Type, src []byte, dst []float32) error {
	k, err := checkRow(t, len(src), len(dst))
	if err != nil {
		return err
	}
	if len(dst) > 0 {
		k.dequant(src, dst)
	}
	return nil
}

// DequantizeRows dequantizes rows [r0, r1) of a matrix of rowLen-element
// rows of type t stored back to back in w (row r at
// w[r·RowBytes(rowLen):]) into dst, row-major: row r lands at
// dst[(r−r0)·rowLen:]. w must hold at least r1 rows and dst at least
// (r1−r0)·rowLen floats. It is the prefill path's tile decoder (a tile of
// weight rows into a small scratch buffer for the F32 GEMM). It fails,
// leaving dst unchanged, for an unsupported type or bad sizes. Safe for
// concurrent use.
func DequantizeRows(t Type, w []byte, rowLen, r0, r1 int, dst []float32) error {
	k, rb, err := layout(t, rowLen)
	if err != nil {
		return err
	}
	if r0 < 0 || r1 < r0 {
		return fmt.Errorf("%w: row range [%d, %d)", ErrSize, r0, r1)
	}
	if rb > 0 && len(w)/rb < r1 {
		return fmt.Errorf("%w: %d bytes hold %d rows of %d %s elements, need %d", ErrSize, len(w), len(w)/rb, rowLen, t, r1)
	}
	if rowLen > 0 && len(dst)/rowLen < r1-r0 {
		return fmt.Errorf("%w: destination of %d floats for %d rows of %d", ErrSize, len(dst), r1-r0, rowLen)
	}
	if rowLen == 0 {
		return nil
	}
	for r := r0; r < r1; r++ {
		k.dequant(w[r*rb:(r+1)*rb], dst[(r-r0)*rowLen:(r-r0+1)*rowLen])
	}
	return nil
}

// Dot returns Σ dequant(row)[i]·x[i] over the len(x) elements of type t
// that row holds, in float32 (x is not quantized, unlike ggml's CPU
// kernels, so the result is the exact dot of the dequantized row up to
// float32 summation error). It is the fused decode kernel: the row is
// decoded block by block in registers, never to a buffer. It panics —
// programmer errors, as for an out-of-range index — when t is not
// supported, len(x) is not a multiple of t's block size, or len(row) is not
// t.RowBytes(len(x)). Safe for concurrent use; does not allocate.
func Dot(t Type, row []byte, x []float32) float32 {
	k, err := checkRow(t, len(row), len(x))
	if err != nil {
		panic("quant.Dot: " + err.Error())
	}
	if len(x) == 0 {
		return 0
	}
	return k.dot(row, x)
}

// DotMany sets out[i] = Dot(t, ws[i], x) for every row of ws (out must
// hold len(ws) values): the decode product of one activation row against
// a task's weight rows, wherever they lie (a stacked, permuted or
// column-sliced weight's rows). F16 and BF16 rows at package simd's
// AVX-512 level, with len(x) a multiple of 16, go through one kernel call
// for all the rows, so no Go code runs between two rows; every other case
// is Dot per row, and the results are the same either way. It panics like
// Dot, and when out is too short. Safe for concurrent use; does not
// allocate.
func DotMany(t Type, ws [][]byte, x []float32, out []float32) {
	if len(out) < len(ws) {
		panic(fmt.Sprintf("quant.DotMany: %d rows into %d", len(ws), len(out)))
	}
	if len(ws) == 0 {
		return
	}
	k, rb, err := layout(t, len(x))
	if err != nil {
		panic("quant.DotMany: " + err.Error())
	}
	for _, w := range ws {
		if len(w) != rb {
			panic(fmt.Sprintf("quant.DotMany: %d bytes for a row of %d %s elements (want %d)", len(w), len(x), t, rb))
		}
	}
	if len(x) == 0 {
		clear(out[:len(ws)])
		return
	}
	if dotHalfManyAsm(t, ws, x, out) {
		return
	}
	for i, w := range ws {
		out[i] = k.dot(w, x)
	}
}

// DotTile sets dst[i·ldd+j] = Dot(t, ws[j], a[i·lda:i·lda+k]) for every
// activation row i < m and weight row j < len(ws), or adds the dot to it
// when acc: the product of a decode batch's rows with a task's weight
// rows, wherever they lie (as for [DotMany]). F16 and BF16 rows at package
// simd's AVX-512 level, with k a multiple of 16, go through tiles of four
// weight rows by up to four activation rows (two by up to eight for rows
// shorter than 2 KiB with m > 4), one kernel call each: every weight
// vector is converted once for the tile's activation rows and nothing is
// dequantized to memory. Every other case is Dot per pair. The
// results equal Dot's up to float32 summation order. It panics like Dot,
// and when a or dst is too short for m rows at its stride. Safe for
// concurrent use; does not allocate.
func DotTile(t Type, ws [][]byte, a []float32, lda, m, k int, dst []float32, ldd int, acc bool) {
	n := len(ws)
	if m <= 0 || n == 0 {
		return
	}
	kn, rb, err := layout(t, k)
	if err != nil {
		panic("quant.DotTile: " + err.Error())
	}
	if m > 1 && (lda < k || ldd < n) || len(a) < (m-1)*lda+k || len(dst) < (m-1)*ldd+n {
		panic(fmt.Sprintf("quant.DotTile: %d×%d activations (%d floats, stride %d) into %d×%d (%d floats, stride %d)", m, k, len(a), lda, m, n, len(dst), ldd))
	}
	for _, w := range ws {
		if len(w) != rb {
			panic(fmt.Sprintf("quant.DotTile: %d bytes for a row of %d %s elements (want %d)", len(w), k, t, rb))
		}
	}
	put := func(row []float32, v []float32) {
		if acc {
			for j := range row {
				row[j] += v[j]
			}
		} else {
			copy(row, v)
		}
	}
	if !halfTileAsm(t, k) {
		var v [1]float32
		for i := range m {
			for j, w := range ws {
				if k > 0 {
					v[0] = kn.dot(w, a[i*lda:i*lda+k])
				}
				put(dst[i*ldd+j:i*ldd+j+1], v[:])
			}
		}
		return
	}
	// Rows shorter than tilePrefetchBytes go through the prefetching
	// kernels (the next tile's rows are fetched while this one computes),
	// in tiles of two rows by up to eight activation rows when m > 4.
	f := tile4
	switch {
	case rb < tilePrefetchBytes && m > 4:
		f = tile2P
	case rb < tilePrefetchBytes:
		f = tile4P
	}
	w, maxR := f.rows(), f.maxRows()
	var out [32]float32
	var hdr [4][]byte
	for j0 := 0; j0 < n; j0 += w {
		nj := min(w, n-j0)
		hp := &ws[j0]
		if nj < w { // the last row stands in for the missing ones
			copy(hdr[:], ws[j0:])
			for x := nj; x < w; x++ {
				hdr[x] = ws[n-1]
			}
			hp = &hdr[0]
		}
		next := &ws[min(j0+w, n-1)][0] // k > 0: rows are not empty
		for i0 := 0; i0 < m; i0 += maxR {
			r := min(maxR, m-i0)
			halfTile(t, f, hp, &a[i0*lda], lda, k, &out[0], next, r)
			for i := range r {
				put(dst[(i0+i)*ldd+j0:(i0+i)*ldd+j0+nj], out[i*4:i*4+nj])
			}
		}
	}
}

// tileForm is one of DotTile's kernel forms.
type tileForm uint8

const (
	tile4  tileForm = iota // four weight rows by up to four activation rows
	tile4P                 // tile4, prefetching the next tile's rows
	tile2P                 // two weight rows by up to eight activation rows, prefetching
)

// rows is how many weight rows a tile of f holds.
func (f tileForm) rows() int {
	if f == tile2P {
		return 2
	}
	return 4
}

// maxRows is how many activation rows one call of f's kernel takes.
func (f tileForm) maxRows() int {
	if f == tile2P {
		return 8
	}
	return 4
}

// tilePrefetchBytes: DotTile's rows shorter than this many bytes take
// the prefetching kernels. Measured on an AMD EPYC (AVX-512), two
// threads streaming 256 MiB of F16 rows against eight activation rows: at
// 576 columns 59–62 → 102–113 GFLOP/s (two-row tiles, prefetched), 896
// 82–88 → 126–132, 960 74–84 → 98–109; at 1,536 columns 78–109 → 71–100
// and at 2,048 118–129 → 96–101 (longer rows stream as well without).
var tilePrefetchBytes = 2048 // a variable so that BenchmarkDotTileStream can compare

// TileKernels reports whether [DotTile] runs rows of type t and k columns
// through its tile kernels (F16 and BF16 at package simd's AVX-512 level,
// k a positive multiple of 16); otherwise it is Dot per pair. Safe for
// concurrent use.
func TileKernels(t Type, k int) bool { return halfTileAsm(t, k) }

// DotRows computes dst[r] = Dot(t, w[r·rowBytes:(r+1)·rowBytes], x) for r
// in [0, len(dst)): the decode kernel of one activation row against
// len(dst) weight rows stored back to back. rowBytes must be
// t.RowBytes(len(x)) and w must hold at least len(dst) rows; like [Dot] it
// panics otherwise. Safe for concurrent use; does not allocate.
func DotRows(t Type, dst []float32, w []byte, rowBytes int, x []float32) {
	k, err := checkRow(t, rowBytes, len(x))
	if err != nil {
		panic("quant.DotRows: " + err.Error())
	}
	if len(w) < len(dst)*rowBytes {
		panic(fmt.Sprintf("quant.DotRows: %d bytes for %d rows of %d bytes", len(w), len(dst), rowBytes))
	}
	if len(x) == 0 {
		clear(dst)
		return
	}
	for r := range dst {
		dst[r] = k.dot(w[r*rowBytes:(r+1)*rowBytes], x)
	}
}

// Quantize encodes the len(src) floats of src as type t into dst, which
// must be exactly t.RowBytes(len(src)) bytes. F32 stores the bits, F16 and
// BF16 round to nearest even as ggml does, and the block types use ports
// of ggml's reference quantizers (quantize_row_*_ref, what llama-quantize
// uses without an importance matrix), so the blocks are ggml's own and
// decode with [DequantizeRow] (and with ggml) to the same values. A block
// type fails with [ErrNonFinite] for an Inf or NaN in src, and with
// [ErrRange] when values are so large that a block's f16 scale overflows
// (beyond about 65504 times the type's largest level, e.g. |x| > 8.3e6
// for Q8_0; ggml would store Inf). Any type fails with [ErrUnsupported] or
// [ErrSize]. dst is unspecified after an error. Safe for concurrent use;
// does not allocate.
func Quantize(t Type, src []float32, dst []byte) error {
	k, err := checkRow(t, len(dst), len(src))
	if err != nil {
		return err
	}
	offs := scaleOffsets[t]
	if offs != nil {
		for i, v := range src {
			if math.IsInf(float64(v), 0) || v != v {
				return fmt.Errorf("%w: %v at index %d cannot be encoded as %s", ErrNonFinite, v, i, t)
			}
		}
	}
	if len(src) == 0 {
		return nil
	}
	k.quant(src, dst)
	for b := 0; b < len(dst); b += k.ts {
		for _, o := range offs {
			if le16(dst[b+o:])&0x7c00 == 0x7c00 {
				return fmt.Errorf("%w: block %d of %s has a scale beyond the f16 range", ErrRange, b/k.ts, t)
			}
		}
	}
	return nil
}

// QuantizeRows encodes a matrix of rowLen-element rows (src row-major,
// len(src) a multiple of rowLen) as type t, returning the rows back to
// back in a new slice of len(src)/rowLen · t.RowBytes(rowLen) bytes. It
// fails as [Quantize] does, and with [ErrSize] when len(src) is not a
// whole number of rows. Safe for concurrent use.
func QuantizeRows(t Type, src []float32, rowLen int) ([]byte, error) {
	_, rb, err := layout(t, rowLen)
	if err != nil {
		return nil, err
	}
	if rowLen == 0 || len(src)%rowLen != 0 {
		return nil, fmt.Errorf("%w: %d floats are not whole rows of %d", ErrSize, len(src), rowLen)
	}
	n := len(src) / rowLen
	out := make([]byte, n*rb)
	for r := range n {
		if err := Quantize(t, src[r*rowLen:(r+1)*rowLen], out[r*rb:(r+1)*rb]); err != nil {
			return nil, fmt.Errorf("row %d: %w", r, err)
		}
	}
	return out, nil
}

// littleEndian is whether the host stores a float32 as its GGUF bytes, so
// F32 (and F16) rows can be viewed in place.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// f32View returns b as the float32s it holds in place, when the host is
// little-endian and b is 4-byte aligned (always for a GGUF tensor, whose
// data is aligned to at least 8 bytes).
func f32View(b []byte) ([]float32, bool) {
	if !littleEndian || len(b) < 4 || uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4), true
}
