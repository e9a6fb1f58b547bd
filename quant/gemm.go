package quant

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"

	"github.com/cacheblend/cacheblend/offheap"
)

// The integer GEMM (prefill with quantized weights): the activations are
// quantized to Q8_K (or Q8_0) and packed in tiles of GemmTileRows rows, a panel of
// up to GemmPanelRows weight rows is unpacked to one byte per weight, and
// a tile times a panel is computed in integers per sub-block (AVX-512
// VNNI: a weight vector of 16 rows × 4 bytes against one activation row's
// 4 bytes broadcast, VPDPBUSD), each sub-block's sums times its scales in
// integers, and one float multiply per 256-element block —
// llama.cpp's ggml_vec_dot_q4_K_q8_K and ggml_vec_dot_q6_K_q8_K for every
// pair of rows, with every unpacked weight reused by six activation rows
// from registers.
//
// Both packings are arrays of 32-bit words; per 256-element block, a
// panel of Q4_K rows holds
//
//	q      [8 sub-blocks][8 steps][32 rows]  4 unsigned 4-bit values
//	sc     [8][32] int32                       the sub-block scales
//	mins   [4][32] 2×int16                     the mins of sub-blocks 2p, 2p+1
//	d, dmin [32] float32
//
// a panel of Q6_K rows
//
//	q      [16 sub-blocks][4 steps][32 rows] 4 unsigned 6-bit values (q+32)
//	sc     [16][32] int32                      the sub-block scales
//	scp    [8][32] 2×int16                     the scales of sub-blocks 2p, 2p+1
//	d      [32] float32
//
// a panel of Q8_0, Q5_0 or Q4_0 rows, per 32-element block,
//
//	q      [8 steps][32 rows]                 4 unsigned values (q+128, q+16, q+8)
//	d      [32] float32
//
// a tile of activations for the 32-element formats (Q8_0), per block,
//
//	q      [8 steps][6 rows]                  4 int8 values
//	d      [6] float32
//	sum    [6] int32                           the sum of q (times the weights' offset in the kernel)
//
// and a tile of activations for the K-quants (Q8_K), per 256 elements,
//
//	q      [64 steps][6 rows]                 4 int8 values
//	d      [6] float32
//	sums   [4][6] 2×int16                      the sums of 32-element sub-blocks 2p, 2p+1
//	sums16 [8][6] 2×int16                      the sums of 16-element sub-blocks 2p, 2p+1
const (
	// GemmTileRows is the number of activation rows of a tile.
	GemmTileRows = 6
	// GemmPanelRows is the number of weight rows of a panel.
	GemmPanelRows = 32

	panelQ      = 64 * GemmPanelRows
	panelSc     = panelQ
	panelMins   = panelSc + 8*GemmPanelRows
	panelD      = panelMins + 4*GemmPanelRows
	panelDmin   = panelD + GemmPanelRows
	panelBlock4 = panelDmin + GemmPanelRows // words per 256 elements, Q4_K

	panelScp6   = panelSc + 16*GemmPanelRows
	panelD6     = panelScp6 + 8*GemmPanelRows
	panelBlock6 = panelD6 + GemmPanelRows // Q6_K

	tileQ      = 64 * GemmTileRows
	tileD      = tileQ
	tileSums   = tileD + GemmTileRows
	tileSums16 = tileSums + 4*GemmTileRows
	tileBlock  = tileSums16 + 8*GemmTileRows

	panelD0     = 8 * GemmPanelRows
	panelBlock0 = panelD0 + GemmPanelRows // Q8_0, Q5_0, Q4_0 (per 32)
	tileD0      = 8 * GemmTileRows
	tileSum0    = tileD0 + GemmTileRows
	tileBlock0  = tileSum0 + GemmTileRows
)

// SupportsGemm reports whether [GemmPanel] packs rows of type t: Q4_K,
// Q6_K (with activations quantized as Q8_K), Q8_0, Q5_0 and Q4_0 (as
// Q8_0).
func SupportsGemm(t Type) bool { return SupportsQ8K(t) || SupportsQ80(t) }

// gemmLayout is how a type's rows and activations are laid out: elements
// per block, weight bytes per block, words per block of a panel and of a
// tile.
func gemmLayout(t Type) (bs, wb, pb, tb int) {
	switch t {
	case Q4_K:
		return QK_K, 144, panelBlock4, tileBlock
	case Q6_K:
		return QK_K, 210, panelBlock6, tileBlock
	}
	return QK8_0, q80BlockBytes(t), panelBlock0, tileBlock0
}

// gemmShift is log2 of what the panel adds to the weights of a
// 32-element format to make them unsigned (128, 16, 8).
func gemmShift(t Type) int {
	switch t {
	case Q8_0:
		return 7
	case Q5_0:
		return 4
	}
	return 3
}

// GemmPanel is up to GemmPanelRows weight rows of one type (SupportsGemm)
// unpacked for [Gemm]. The zero value is ready for Pack; a panel is not
// safe for concurrent use while it is being packed, and safe to read
// concurrently afterwards.
type GemmPanel struct {
	t       Type
	k, rows int
	w       []uint32
}

// Rows is the number of weight rows packed.
func (p *GemmPanel) Rows() int { return p.rows }

// Pack unpacks rows (1 to GemmPanelRows rows of type t, k elements each,
// k a multiple of the type's block: 256 for the K-quants, 32 for the
// others) into p, reusing p's memory. Missing rows are zero.
func (p *GemmPanel) Pack(t Type, rows [][]byte, k int) error {
	if !SupportsGemm(t) {
		return fmt.Errorf("%w: no integer GEMM for %s", ErrUnsupported, t)
	}
	be, bs, pb, _ := gemmLayout(t)
	if k <= 0 || k%be != 0 {
		return fmt.Errorf("%w: %s panel of %d columns, not a positive multiple of %d", ErrSize, t, k, be)
	}
	if len(rows) == 0 || len(rows) > GemmPanelRows {
		return fmt.Errorf("%w: %s panel of %d rows (1 to %d)", ErrSize, t, len(rows), GemmPanelRows)
	}
	nb := k / be
	for r, row := range rows {
		if len(row) != nb*bs {
			return fmt.Errorf("%w: %s row %d of %d bytes, want %d", ErrSize, t, r, len(row), nb*bs)
		}
	}
	p.t, p.k, p.rows = t, k, len(rows)
	p.w = grow(p.w, nb*pb)
	if len(rows) < GemmPanelRows {
		clear(p.w)
	}
	for r, row := range rows {
		switch t {
		case Q4_K:
			for b := range nb {
				packQ4K(p.w[b*pb:(b+1)*pb], r, (*[144]byte)(row[b*bs:]))
			}
		case Q6_K:
			for b := range nb {
				packQ6K(p.w[b*pb:(b+1)*pb], r, (*[210]byte)(row[b*bs:]))
			}
		case Q8_0:
			for b := range nb {
				w, blk := (*[panelBlock0]uint32)(p.w[b*pb:]), (*[34]byte)(row[b*bs:])
				w[panelD0+r] = math.Float32bits(half(blk[:]))
				for st := range 8 {
					w[st*GemmPanelRows+r] = binary.LittleEndian.Uint32(blk[2+4*st:]) ^ 0x80808080
				}
			}
		case Q4_0:
			for b := range nb {
				w, blk := (*[panelBlock0]uint32)(p.w[b*pb:]), (*[18]byte)(row[b*bs:])
				w[panelD0+r] = math.Float32bits(half(blk[:]))
				for st := range 4 {
					v := binary.LittleEndian.Uint32(blk[2+4*st:])
					w[st*GemmPanelRows+r] = v & 0x0f0f0f0f
					w[(st+4)*GemmPanelRows+r] = v >> 4 & 0x0f0f0f0f
				}
			}
		case Q5_0:
			for b := range nb {
				w, blk := (*[panelBlock0]uint32)(p.w[b*pb:]), (*[22]byte)(row[b*bs:])
				w[panelD0+r] = math.Float32bits(half(blk[:]))
				qh := binary.LittleEndian.Uint32(blk[2:])
				for st := range 4 {
					v := binary.LittleEndian.Uint32(blk[6+4*st:])
					w[st*GemmPanelRows+r] = v&0x0f0f0f0f | fifthBits[qh>>(4*st)&15]
					w[(st+4)*GemmPanelRows+r] = v>>4&0x0f0f0f0f | fifthBits[qh>>(16+4*st)&15]
				}
			}
		}
	}
	return nil
}

// packQ4K unpacks one Q4_K block into row r of a panel's block w.
func packQ4K(w []uint32, r int, blk *[144]byte) {
	sc, mn := scalesK4((*[12]byte)(blk[4:16]))
	for s := range 8 {
		w[panelSc+s*GemmPanelRows+r] = uint32(sc[s])
	}
	for pr := range 4 {
		w[panelMins+pr*GemmPanelRows+r] = uint32(mn[2*pr]) | uint32(mn[2*pr+1])<<16
	}
	w[panelD+r] = math.Float32bits(half(blk[0:]))
	w[panelDmin+r] = math.Float32bits(half(blk[2:]))
	for g := range 4 {
		qs := blk[16+32*g:]
		for t := range 8 {
			v := binary.LittleEndian.Uint32(qs[4*t:])
			w[((2*g)*8+t)*GemmPanelRows+r] = v & 0x0f0f0f0f
			w[((2*g+1)*8+t)*GemmPanelRows+r] = v >> 4 & 0x0f0f0f0f
		}
	}
}

// packQ6K unpacks one Q6_K block into row r of a panel's block w: per
// 128 elements, 64 bytes of low nibbles and 32 of high bit pairs (see
// dequantQ6_K).
func packQ6K(w []uint32, r int, blk *[210]byte) {
	for s := range 16 {
		w[panelSc+s*GemmPanelRows+r] = uint32(int32(int8(blk[192+s])))
	}
	for pr := range 8 {
		w[panelScp6+pr*GemmPanelRows+r] = uint32(uint16(int16(int8(blk[192+2*pr])))) | uint32(uint16(int16(int8(blk[193+2*pr]))))<<16
	}
	w[panelD6+r] = math.Float32bits(half(blk[208:]))
	for n := range 2 {
		ql, qh := blk[64*n:64*n+64], blk[128+32*n:128+32*n+32]
		q := w[32*n*GemmPanelRows : (32*n+32)*GemmPanelRows]
		for l := 0; l < 32; l += 4 {
			lo := binary.LittleEndian.Uint32(ql[l:])
			hi := binary.LittleEndian.Uint32(ql[l+32:])
			h := binary.LittleEndian.Uint32(qh[l:])
			const m4, m2 = 0x0f0f0f0f, 0x03030303
			// Elements l, 32+l, 64+l, 96+l of the half: words l/4 + 8j.
			q[(l/4)*GemmPanelRows+r] = lo&m4 | (h&m2)<<4
			q[(l/4+8)*GemmPanelRows+r] = hi&m4 | (h>>2&m2)<<4
			q[(l/4+16)*GemmPanelRows+r] = lo>>4&m4 | (h>>4&m2)<<4
			q[(l/4+24)*GemmPanelRows+r] = hi>>4&m4 | (h>>6&m2)<<4
		}
	}
}

// fifthBits[v] has bit 4 of byte l set for each bit l of v: four of
// Q5_0's fifth bits moved onto their unpacked bytes.
var fifthBits = func() (t [16]uint32) {
	for v := range t {
		for l := range 4 {
			t[v] |= uint32(v>>l&1) << (8*l + 4)
		}
	}
	return t
}()

// GemmTiles is rows of activations quantized for [Gemm] — as Q8_K for
// the K-quants (as [Q8K]), as Q8_0 for the 32-element formats (as [Q80])
// — and packed in tiles of GemmTileRows rows: one quantization serves
// panels of every type that Fits (a Q4_K|Q6_K or Q5_0|Q8_0 stack of
// weights is multiplied with one). Reset sizes it; each tile is then
// quantized by QuantizeTile, concurrently for distinct tiles. Safe to
// read concurrently once quantized. Its tiles of 64 KiB or more live
// outside the Go heap (package offheap), unmapped when it is collected: a
// prefill chunk's are a megabyte, kept between calls, which the collector
// would otherwise count as live and double. A GemmTiles must not be copied
// after its first Reset.
type GemmTiles struct {
	t    Type
	m, k int
	w    []uint32
	mem  *offheap.Buf[uint32] // behind w; released by a cleanup on x
}

// Reset sizes x for m rows of k elements (k a multiple of the type's
// block) to be multiplied with weights of type t (SupportsGemm) and every
// type that Fits it, reusing its memory.
func (x *GemmTiles) Reset(t Type, m, k int) error {
	if !SupportsGemm(t) {
		return fmt.Errorf("%w: no integer GEMM for %s", ErrUnsupported, t)
	}
	be, _, _, tb := gemmLayout(t)
	if k <= 0 || k%be != 0 || m <= 0 {
		return fmt.Errorf("%w: tiles of %d×%d for %s, k not a positive multiple of %d", ErrSize, m, k, t, be)
	}
	x.t, x.m, x.k = t, m, k
	if x.mem == nil {
		x.mem = new(offheap.Buf[uint32])
		runtime.AddCleanup(x, (*offheap.Buf[uint32]).Free, x.mem)
	}
	x.w = x.mem.Grow(x.Tiles() * k / be * tb)
	return nil
}

// Fits reports whether x, reset for some type, serves panels of type t:
// both K-quants, or both of the 32-element formats.
func (x *GemmTiles) Fits(t Type) bool {
	return SupportsQ8K(x.t) && SupportsQ8K(t) || SupportsQ80(x.t) && SupportsQ80(t)
}

// Tiles is the number of tiles: the rows over GemmTileRows, rounded up.
func (x *GemmTiles) Tiles() int { return (x.m + GemmTileRows - 1) / GemmTileRows }

// QuantizeTile quantizes rows (the tile's rows, at most GemmTileRows, each
// of the k elements given to Reset) into tile t as ggml's
// quantize_row_q8_K (or, for the 32-element formats, ggml-cpu's x86
// quantize_row_q8_0) does. Missing rows are zero.
func (x *GemmTiles) QuantizeTile(t int, rows ...[]float32) error {
	if t < 0 || t >= x.Tiles() || len(rows) > GemmTileRows {
		return fmt.Errorf("%w: tile %d of %d rows (tiles %d)", ErrSize, t, len(rows), x.Tiles())
	}
	be, _, _, tb := gemmLayout(x.t)
	nb := x.k / be
	tw := x.w[t*nb*tb : (t+1)*nb*tb]
	if len(rows) < GemmTileRows {
		clear(tw)
	}
	for _, v := range rows {
		if len(v) != x.k {
			return fmt.Errorf("%w: row of %d values for tiles of %d", ErrSize, len(v), x.k)
		}
	}
	if be == QK8_0 {
		// A row's blocks are quantized group by group (one assembly call
		// each, see q80Blocks), then laid out.
		const group = 64
		var qs [group * QK8_0]int8
		var ds [group]float32
		for i, v := range rows {
			for b0 := 0; b0 < nb; b0 += group {
				g := min(group, nb-b0)
				q80Blocks(v[b0*QK8_0:(b0+g)*QK8_0], qs[:g*QK8_0], ds[:g])
				for b := b0; b < b0+g; b++ {
					q := qs[(b-b0)*QK8_0 : (b-b0+1)*QK8_0]
					w := tw[b*tb : (b+1)*tb]
					w[tileD0+i] = math.Float32bits(ds[b-b0])
					var sum int32
					for st := range 8 {
						sum += int32(q[4*st]) + int32(q[4*st+1]) + int32(q[4*st+2]) + int32(q[4*st+3])
						w[st*GemmTileRows+i] = qWord(q[4*st:])
					}
					w[tileSum0+i] = uint32(sum)
				}
			}
		}
		return nil
	}
	var q [QK_K]int8
	for i, v := range rows {
		for b := range nb {
			w := tw[b*tileBlock : (b+1)*tileBlock]
			d := q8kBlock(v[b*QK_K:(b+1)*QK_K], &q)
			w[tileD+i] = math.Float32bits(d)
			var sums [16]int32
			for st := range 64 {
				e := 4 * st
				sums[st/4] += int32(q[e]) + int32(q[e+1]) + int32(q[e+2]) + int32(q[e+3])
				w[st*GemmTileRows+i] = qWord(q[e:])
			}
			pair := func(a, b int32) uint32 { return uint32(uint16(int16(a))) | uint32(uint16(int16(b)))<<16 }
			for pr := range 4 {
				w[tileSums+pr*GemmTileRows+i] = pair(sums[4*pr]+sums[4*pr+1], sums[4*pr+2]+sums[4*pr+3])
			}
			for pr := range 8 {
				w[tileSums16+pr*GemmTileRows+i] = pair(sums[2*pr], sums[2*pr+1])
			}
		}
	}
	return nil
}

// qWord packs q[0:4] into a little-endian word.
func qWord(q []int8) uint32 {
	return uint32(uint8(q[0])) | uint32(uint8(q[1]))<<8 | uint32(uint8(q[2]))<<16 | uint32(uint8(q[3]))<<24
}

// Gemm sets (or, with acc, adds to) c[i·ldc + j] the dot product of row
// i of tile t of x and row j of p, for the tile's rows below rows (at most
// GemmTileRows) and j below p.Rows(): an integer GEMM of quantized
// weights and quantized activations (see the package's integer GEMM).
// With AVX-512 VNNI or at the AVX2 level (IntegerGEMM) it runs in
// assembly, elsewhere the same arithmetic in Go; a whole tile
// (GemmTileRows rows of a full panel) is added to c's rows in place, block
// by block for the K-quants and at the AVX2 level (so a product split over
// k in two calls gives the same bits as one call). It
// panics when p and x differ in k, x does not fit p's type, t is out of
// range, or c is too short. Safe for concurrent use with distinct c.
func Gemm(p *GemmPanel, x *GemmTiles, t, rows int, c []float32, ldc int, acc bool) {
	if p.k != x.k || !x.Fits(p.t) || t < 0 || t >= x.Tiles() || rows > GemmTileRows {
		panic(fmt.Sprintf("quant: Gemm of a %d-column %s panel and %d-column tiles for %s (tile %d of %d)", p.k, p.t, x.k, x.t, t, x.Tiles()))
	}
	be, _, _, tb := gemmLayout(p.t)
	nb := p.k / be
	a := x.w[t*nb*tb : (t+1)*nb*tb]
	if rows == GemmTileRows && p.rows == GemmPanelRows && ldc >= GemmPanelRows && integerGEMM() {
		// A whole tile: the kernel adds to c's rows in place (ldc apart),
		// so no tile buffer is zeroed, filled and added back in Go (that
		// was an eighth of a quantized prefill's time).
		_ = c[(rows-1)*ldc+GemmPanelRows-1]
		if !acc {
			for i := range rows {
				clear(c[i*ldc : i*ldc+GemmPanelRows])
			}
		}
		gemmAsm(p.t, p.w, a, &c[0], ldc, nb)
		return
	}
	var out [GemmTileRows * GemmPanelRows]float32
	if !gemmAsm(p.t, p.w, a, &out[0], GemmPanelRows, nb) {
		gemmGo(p.t, p.w, a, &out, nb)
	}
	for i := range rows {
		dst := c[i*ldc : i*ldc+p.rows]
		src := out[i*GemmPanelRows : i*GemmPanelRows+p.rows]
		if acc {
			for j, v := range src {
				dst[j] += v
			}
		} else {
			copy(dst, src)
		}
	}
}

// gemmGo is the integer GEMM's tile kernel in Go: c (row-major
// GemmTileRows × GemmPanelRows) += a tile of nb blocks times a panel of
// type t.
func gemmGo(t Type, w, a []uint32, c *[GemmTileRows * GemmPanelRows]float32, nb int) {
	if SupportsQ80(t) {
		gemmGo80(w, a, c, nb, int32(1)<<gemmShift(t))
		return
	}
	pb, subs := panelBlock4, 8
	if t == Q6_K {
		pb, subs = panelBlock6, 16
	}
	steps := 64 / subs
	for b := range nb {
		pw := w[b*pb : (b+1)*pb]
		ta := a[b*tileBlock : (b+1)*tileBlock]
		for i := range GemmTileRows {
			da := math.Float32frombits(ta[tileD+i])
			for r := range GemmPanelRows {
				var sum, off int32
				for s := range subs {
					dot := stepsDot(pw, ta, s*steps, (s+1)*steps, r, i)
					sum += dot * int32(pw[panelSc+s*GemmPanelRows+r])
				}
				pairs := func(w0, a0, n int) (s int32) {
					for pr := range n {
						mw, sw := pw[w0+pr*GemmPanelRows+r], ta[a0+pr*GemmTileRows+i]
						s += int32(int16(mw))*int32(int16(sw)) + int32(int16(mw>>16))*int32(int16(sw>>16))
					}
					return s
				}
				if t == Q6_K {
					off = pairs(panelScp6, tileSums16, 8)
					d := math.Float32frombits(pw[panelD6+r])
					c[i*GemmPanelRows+r] += da * (d * float32(sum-32*off))
					continue
				}
				off = pairs(panelMins, tileSums, 4)
				d := math.Float32frombits(pw[panelD+r])
				dmin := math.Float32frombits(pw[panelDmin+r])
				c[i*GemmPanelRows+r] += da * (d*float32(sum) - dmin*float32(off))
			}
		}
	}
}

// gemmGo80 is gemmGo for the 32-element formats, whose weights the panel
// holds plus off.
func gemmGo80(w, a []uint32, c *[GemmTileRows * GemmPanelRows]float32, nb int, off int32) {
	for b := range nb {
		pw := w[b*panelBlock0 : (b+1)*panelBlock0]
		ta := a[b*tileBlock0 : (b+1)*tileBlock0]
		for i := range GemmTileRows {
			da := math.Float32frombits(ta[tileD0+i])
			for r := range GemmPanelRows {
				dot := stepsDot(pw, ta, 0, 8, r, i)
				d := math.Float32frombits(pw[panelD0+r])
				c[i*GemmPanelRows+r] += da * (d * float32(dot-off*int32(ta[tileSum0+i])))
			}
		}
	}
}

// stepsDot is the integer dot of weight row r of a panel block pw and
// activation row i of a tile block ta over the steps [j0, j1) (4 elements
// each): unsigned weights times signed activations.
func stepsDot(pw, ta []uint32, j0, j1, r, i int) (dot int32) {
	for j := j0; j < j1; j++ {
		wv, av := pw[j*GemmPanelRows+r], ta[j*GemmTileRows+i]
		for l := 0; l < 32; l += 8 {
			dot += int32(uint8(wv>>l)) * int32(int8(av>>l))
		}
	}
	return dot
}
