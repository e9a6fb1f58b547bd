package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The integer GEMM (prefill with Q4_K weights): the activations are
// quantized to Q8_K and packed in tiles of GemmTileRows rows, a panel of
// up to GemmPanelRows weight rows is unpacked to one byte per weight, and
// a tile times a panel is computed in integers per 32-element sub-block
// (AVX-512 VNNI: a weight vector of 16 rows × 4 bytes against one
// activation row's 4 bytes broadcast, VPDPBUSD), each sub-block's sums
// times its 6-bit scales in integers, and one float multiply per
// 256-element block — llama.cpp's ggml_vec_dot_q4_K_q8_K for every pair
// of rows, with every unpacked weight reused by six activation rows from
// registers.
//
// Both packings are arrays of 32-bit words, per 256-element block:
//
//	panel: q      [8 sub-blocks][8 steps][32 rows]  4 unsigned 4-bit values
//	       sc     [8][32] int32                       the sub-block scales
//	       mins   [4][32] 2×int16                     the mins of sub-blocks 2p, 2p+1
//	       d, dmin [32] float32
//	tile:  q      [8][8][6 rows]                     4 int8 values
//	       d      [6] float32
//	       sums   [4][6] 2×int16                      the sums of sub-blocks 2p, 2p+1
const (
	// GemmTileRows is the number of activation rows of a tile.
	GemmTileRows = 6
	// GemmPanelRows is the number of weight rows of a panel.
	GemmPanelRows = 32

	panelQ     = 8 * 8 * GemmPanelRows
	panelSc    = panelQ
	panelMins  = panelSc + 8*GemmPanelRows
	panelD     = panelMins + 4*GemmPanelRows
	panelDmin  = panelD + GemmPanelRows
	panelBlock = panelDmin + GemmPanelRows // words per 256 elements

	tileQ     = 8 * 8 * GemmTileRows
	tileD     = tileQ
	tileSums  = tileD + GemmTileRows
	tileBlock = tileSums + 4*GemmTileRows
)

// Q4KPanel is up to GemmPanelRows rows of Q4_K weights unpacked for
// [GemmQ4K]. The zero value is ready for Pack; a panel is not safe for
// concurrent use while it is being packed, and safe to read concurrently
// afterwards.
type Q4KPanel struct {
	k, rows int
	w       []uint32
}

// Rows is the number of weight rows packed.
func (p *Q4KPanel) Rows() int { return p.rows }

// Pack unpacks rows (1 to GemmPanelRows Q4_K rows of k elements each, k a
// multiple of 256) into p, reusing p's memory. Missing rows are zero.
func (p *Q4KPanel) Pack(rows [][]byte, k int) error {
	if k <= 0 || k%QK_K != 0 {
		return fmt.Errorf("%w: Q4_K panel of %d columns, not a positive multiple of %d", ErrSize, k, QK_K)
	}
	if len(rows) == 0 || len(rows) > GemmPanelRows {
		return fmt.Errorf("%w: Q4_K panel of %d rows (1 to %d)", ErrSize, len(rows), GemmPanelRows)
	}
	nb := k / QK_K
	for r, row := range rows {
		if len(row) != nb*144 {
			return fmt.Errorf("%w: Q4_K row %d of %d bytes, want %d", ErrSize, r, len(row), nb*144)
		}
	}
	p.k, p.rows = k, len(rows)
	p.w = grow(p.w, nb*panelBlock)
	for b := range nb {
		w := p.w[b*panelBlock : (b+1)*panelBlock]
		if len(rows) < GemmPanelRows {
			clear(w)
		}
		for r, row := range rows {
			blk := (*[144]byte)(row[b*144:])
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
	}
	return nil
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
			var sums [8]int32
			for s := range 8 {
				for j := range 8 {
					e := s*32 + 4*j
					sums[s] += int32(q[e]) + int32(q[e+1]) + int32(q[e+2]) + int32(q[e+3])
					w[(s*8+j)*GemmTileRows+i] = uint32(uint8(q[e])) | uint32(uint8(q[e+1]))<<8 |
						uint32(uint8(q[e+2]))<<16 | uint32(uint8(q[e+3]))<<24
				}
			}
			for pr := range 4 {
				w[tileSums+pr*GemmTileRows+i] = uint32(uint16(int16(sums[2*pr]))) | uint32(uint16(int16(sums[2*pr+1])))<<16
			}
		}
	}
	return nil
}

// GemmQ4K sets (or, with acc, adds to) c[i·ldc + j] the dot product of
// row i of tile t of x and row j of p, for the tile's rows below rows
// (at most GemmTileRows) and j below p.Rows(): an integer GEMM of Q4_K
// weights and Q8_K activations (see the package's integer GEMM). With
// AVX-512 VNNI (IntegerDots) it runs in assembly, elsewhere the same
// arithmetic in Go. It panics when p and x differ in k or t is out of
// range. Safe for concurrent use with distinct c.
func GemmQ4K(p *Q4KPanel, x *Q8KTiles, t, rows int, c []float32, ldc int, acc bool) {
	if p.k != x.k || t < 0 || t >= x.Tiles() || rows > GemmTileRows {
		panic(fmt.Sprintf("quant: GemmQ4K of a %d-column panel and %d-column tiles (tile %d of %d)", p.k, x.k, t, x.Tiles()))
	}
	nb := p.k / QK_K
	var out [GemmTileRows * GemmPanelRows]float32
	a := x.w[t*nb*tileBlock : (t+1)*nb*tileBlock]
	if !gemmQ4KAsm(p.w, a, &out, nb) {
		gemmQ4KGo(p.w, a, &out, nb)
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

// gemmQ4KGo is the integer GEMM's tile kernel in Go: c (row-major
// GemmTileRows × GemmPanelRows) += a tile of nb blocks times a panel.
func gemmQ4KGo(w, a []uint32, c *[GemmTileRows * GemmPanelRows]float32, nb int) {
	for b := range nb {
		pw := w[b*panelBlock : (b+1)*panelBlock]
		ta := a[b*tileBlock : (b+1)*tileBlock]
		for i := range GemmTileRows {
			da := math.Float32frombits(ta[tileD+i])
			for r := range GemmPanelRows {
				var sum, mins int32
				for s := range 8 {
					var dot int32
					for j := range 8 {
						wv, av := pw[(s*8+j)*GemmPanelRows+r], ta[(s*8+j)*GemmTileRows+i]
						for l := 0; l < 32; l += 8 {
							dot += int32(uint8(wv>>l)) * int32(int8(av>>l))
						}
					}
					sum += dot * int32(pw[panelSc+s*GemmPanelRows+r])
				}
				for pr := range 4 {
					mw, sw := pw[panelMins+pr*GemmPanelRows+r], ta[tileSums+pr*GemmTileRows+i]
					mins += int32(int16(mw))*int32(int16(sw)) + int32(int16(mw>>16))*int32(int16(sw>>16))
				}
				d := math.Float32frombits(pw[panelD+r])
				dmin := math.Float32frombits(pw[panelDmin+r])
				c[i*GemmPanelRows+r] += da * (d*float32(sum) - dmin*float32(mins))
			}
		}
	}
}
