package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The integer GEMM (prefill with K-quant weights): the activations are
// quantized to Q8_K and packed in tiles of GemmTileRows rows, a panel of
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
// and a tile of activations
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
)

// SupportsGemm reports whether [GemmPanel] packs rows of type t (Q4_K and
// Q6_K).
func SupportsGemm(t Type) bool { return t == Q4_K || t == Q6_K }

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
// k a multiple of 256) into p, reusing p's memory. Missing rows are zero.
func (p *GemmPanel) Pack(t Type, rows [][]byte, k int) error {
	if !SupportsGemm(t) {
		return fmt.Errorf("%w: no integer GEMM for %s", ErrUnsupported, t)
	}
	if k <= 0 || k%QK_K != 0 {
		return fmt.Errorf("%w: %s panel of %d columns, not a positive multiple of %d", ErrSize, t, k, QK_K)
	}
	if len(rows) == 0 || len(rows) > GemmPanelRows {
		return fmt.Errorf("%w: %s panel of %d rows (1 to %d)", ErrSize, t, len(rows), GemmPanelRows)
	}
	nb, bs, pb := k/QK_K, 144, panelBlock4
	if t == Q6_K {
		bs, pb = 210, panelBlock6
	}
	for r, row := range rows {
		if len(row) != nb*bs {
			return fmt.Errorf("%w: %s row %d of %d bytes, want %d", ErrSize, t, r, len(row), nb*bs)
		}
	}
	p.t, p.k, p.rows = t, k, len(rows)
	p.w = grow(p.w, nb*pb)
	for b := range nb {
		w := p.w[b*pb : (b+1)*pb]
		if len(rows) < GemmPanelRows {
			clear(w)
		}
		for r, row := range rows {
			if t == Q6_K {
				packQ6K(w, r, (*[210]byte)(row[b*bs:]))
			} else {
				packQ4K(w, r, (*[144]byte)(row[b*bs:]))
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
		ql, qh := blk[64*n:], blk[128+32*n:]
		for l := 0; l < 32; l += 4 {
			lo := binary.LittleEndian.Uint32(ql[l:])
			hi := binary.LittleEndian.Uint32(ql[l+32:])
			h := binary.LittleEndian.Uint32(qh[l:])
			const m4, m2 = 0x0f0f0f0f, 0x03030303
			for j, v := range [4]uint32{
				lo&m4 | (h&m2)<<4,
				hi&m4 | (h>>2&m2)<<4,
				lo>>4&m4 | (h>>4&m2)<<4,
				hi>>4&m4 | (h>>6&m2)<<4,
			} {
				e := 128*n + 32*j + l
				w[e/4*GemmPanelRows+r] = v
			}
		}
	}
}

// Q8KTiles is rows of activations quantized as Q8_K (as [Q8K]) and packed
// in tiles of GemmTileRows rows for [GemmQ4K]. Reset sizes it; each tile
// is then quantized by QuantizeTile, concurrently for distinct tiles.
// Safe to read concurrently once quantized.
type Q8KTiles struct {
	m, k int
	w    []uint32
}

// Reset sizes x for m rows of k elements (k a multiple of 256), reusing
// its memory.
func (x *Q8KTiles) Reset(m, k int) error {
	if k <= 0 || k%QK_K != 0 || m <= 0 {
		return fmt.Errorf("%w: Q8_K tiles of %d×%d, k not a positive multiple of %d", ErrSize, m, k, QK_K)
	}
	x.m, x.k = m, k
	x.w = grow(x.w, x.Tiles()*k/QK_K*tileBlock)
	return nil
}

// Tiles is the number of tiles: the rows over GemmTileRows, rounded up.
func (x *Q8KTiles) Tiles() int { return (x.m + GemmTileRows - 1) / GemmTileRows }

// QuantizeTile quantizes rows (the tile's rows, at most GemmTileRows, each
// of the k elements given to Reset) into tile t as ggml's quantize_row_q8_K
// does. Missing rows are zero.
func (x *Q8KTiles) QuantizeTile(t int, rows ...[]float32) error {
	if t < 0 || t >= x.Tiles() || len(rows) > GemmTileRows {
		return fmt.Errorf("%w: tile %d of %d rows (tiles %d)", ErrSize, t, len(rows), x.Tiles())
	}
	nb := x.k / QK_K
	tw := x.w[t*nb*tileBlock : (t+1)*nb*tileBlock]
	if len(rows) < GemmTileRows {
		clear(tw)
	}
	var q [QK_K]int8
	for i, v := range rows {
		if len(v) != x.k {
			return fmt.Errorf("%w: row of %d values for tiles of %d", ErrSize, len(v), x.k)
		}
		for b := range nb {
			w := tw[b*tileBlock : (b+1)*tileBlock]
			d := q8kBlock(v[b*QK_K:(b+1)*QK_K], &q)
			w[tileD+i] = math.Float32bits(d)
			var sums [16]int32
			for st := range 64 {
				e := 4 * st
				sums[st/4] += int32(q[e]) + int32(q[e+1]) + int32(q[e+2]) + int32(q[e+3])
				w[st*GemmTileRows+i] = uint32(uint8(q[e])) | uint32(uint8(q[e+1]))<<8 |
					uint32(uint8(q[e+2]))<<16 | uint32(uint8(q[e+3]))<<24
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

// Gemm sets (or, with acc, adds to) c[i·ldc + j] the dot product of row
// i of tile t of x and row j of p, for the tile's rows below rows (at most
// GemmTileRows) and j below p.Rows(): an integer GEMM of K-quant weights
// and Q8_K activations (see the package's integer GEMM). With AVX-512
// VNNI (IntegerDots) it runs in assembly, elsewhere the same arithmetic in
// Go. It panics when p and x differ in k or t is out of range. Safe for
// concurrent use with distinct c.
func Gemm(p *GemmPanel, x *Q8KTiles, t, rows int, c []float32, ldc int, acc bool) {
	if p.k != x.k || t < 0 || t >= x.Tiles() || rows > GemmTileRows {
		panic(fmt.Sprintf("quant: Gemm of a %d-column panel and %d-column tiles (tile %d of %d)", p.k, x.k, t, x.Tiles()))
	}
	nb := p.k / QK_K
	var out [GemmTileRows * GemmPanelRows]float32
	a := x.w[t*nb*tileBlock : (t+1)*nb*tileBlock]
	if !gemmAsm(p.t, p.w, a, &out, nb) {
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
					var dot int32
					for j := s * steps; j < (s+1)*steps; j++ {
						wv, av := pw[j*GemmPanelRows+r], ta[j*GemmTileRows+i]
						for l := 0; l < 32; l += 8 {
							dot += int32(uint8(wv>>l)) * int32(int8(av>>l))
						}
					}
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
