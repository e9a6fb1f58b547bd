package simd

import "sync"

// Cache blocking of Gemm. A B panel is panelW columns wide (one AVX-512
// micro-tile, two AVX2 or pure-Go ones); an MC×KC block of A is packed into
// row panels of the micro-tile height (L2-resident), and one KC×panelW
// panel of B stays in L1 while every row panel of the A block runs against
// it. KC is balanced: k is split into ceil(k/kcMax) equal blocks.
const (
	panelW = 32
	mcMax  = 144 // 12 AVX-512 panels, 24 AVX2, 36 pure Go
	kcMax  = 256 // a B panel is at most 32 KB
	ncMax  = 512 // a packed B block is at most 512 KB
	// packBRows: with at least this many rows of A, B blocks are packed
	// into contiguous panels (each is reused by many row panels); with
	// fewer (decode), B's rows are read in place unless B is transposed or
	// a panel is partial.
	packBRows = 48
	// packBMinK: B blocks of at most this many rows are read in place even
	// for many rows of A (the attention's scores, k = head size: a panel
	// is then a few cache lines per row, and packing it cost 18% of the
	// attention's time).
	packBMinK = 64
	// packAPanels: an A block is packed when more than this many B panels
	// use it; otherwise (the model's tiles of at most 192 columns, the
	// attention's products) the micro-kernel reads A's rows in place. On
	// the model's shapes (k <= 320, A rows in L1/L2) reading in place
	// measured 0–20% faster than packing up to 8 panels (BenchmarkGemm).
	packAPanels = 8
)

// gemmBuf is the packing scratch of one Gemm call.
type gemmBuf struct {
	a, b, edge []float32
	tmp        [12 * panelW]float32
}

var bufPool = sync.Pool{New: func() any { return new(gemmBuf) }}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// bOperand is the right operand of a product: a row-major matrix (element
// (p, j) at data[p*ld+j], or data[j*ld+p] when trans), or pre-packed panels
// starting at column j0.
type bOperand struct {
	data  []float32
	ld    int
	trans bool
	pk    *PackedB
	j0    int
}

// at is element (p, j) of an unpacked operand.
func (b *bOperand) at(p, j int) float32 {
	if b.trans {
		return b.data[j*b.ld+p]
	}
	return b.data[p*b.ld+j]
}

// packPanel writes rows [pc, pc+kc) of columns [j, j+nr) of b into dst as
// kc rows of panelW floats, zero padded.
func packPanel(dst []float32, b *bOperand, pc, kc, j, nr int) {
	dst = dst[:kc*panelW]
	if b.trans {
		for jj := range nr {
			src := b.data[(j+jj)*b.ld+pc : (j+jj)*b.ld+pc+kc]
			for p, v := range src {
				dst[p*panelW+jj] = v
			}
		}
		if nr < panelW {
			for p := range kc {
				clear(dst[p*panelW+nr : (p+1)*panelW])
			}
		}
		return
	}
	for p := range kc {
		row := dst[p*panelW : (p+1)*panelW]
		n := copy(row[:nr], b.data[(pc+p)*b.ld+j:(pc+p)*b.ld+j+nr])
		clear(row[n:])
	}
}

// packA writes rows [i0, i0+mc) × columns [pc, pc+kc) of a into dst as
// row panels of mr rows (the last may be shorter): panel r starts at r*kc
// and holds kc groups of its rows' values.
func packA(dst, a []float32, lda, i0, mc, pc, kc, mr int) {
	for ir := 0; ir < mc; ir += mr {
		h := min(mr, mc-ir)
		pan := dst[ir*kc : ir*kc+h*kc]
		for i := range h {
			row := a[(i0+ir+i)*lda+pc : (i0+ir+i)*lda+pc+kc]
			for p, v := range row {
				pan[p*h+i] = v
			}
		}
	}
}

// micro runs one mr×panelW tile as panelW/nr micro-kernel calls; lda is 0
// for a packed A panel, else A's row stride.
func micro(im *impl, mr, kc int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	if lda == 0 {
		k := im.kern[mr]
		for h := 0; h < panelW; h += im.nr {
			k(kc, a, b[h:], ldb, c[h:], ldc, acc)
		}
		return
	}
	k := im.kernU[mr]
	for h := 0; h < panelW; h += im.nr {
		k(kc, a, lda, b[h:], ldb, c[h:], ldc, acc)
	}
}

// gemm computes c[m×n] = a[m×k]·B (+c when acc), serially.
func gemm(m, n, k int, a []float32, lda int, b bOperand, c []float32, ldc int, acc bool) {
	if m <= 0 || n <= 0 {
		return
	}
	if k <= 0 {
		if !acc {
			for i := range m {
				clear(c[i*ldc : i*ldc+n])
			}
		}
		return
	}
	im := cur.Load()
	buf := bufPool.Get().(*gemmBuf)
	defer bufPool.Put(buf)
	nkb := (k + kcMax - 1) / kcMax
	kc0 := (k + nkb - 1) / nkb
	// A B whose rows are panelW apart is already one contiguous panel.
	packAll := b.pk == nil && (b.trans || (m >= packBRows && k > packBMinK && b.ld != panelW))
	for jc := 0; jc < n; jc += ncMax {
		nc := min(ncMax, n-jc)
		for pc := 0; pc < k; pc += kc0 {
			kc := min(kc0, k-pc)
			accum := acc || pc > 0
			var bp []float32
			if packAll {
				np := (nc + panelW - 1) / panelW
				buf.b = grow(buf.b, np*kc*panelW)
				bp = buf.b
				for jr := 0; jr < nc; jr += panelW {
					packPanel(bp[(jr/panelW)*kc*panelW:], &b, pc, kc, jc+jr, min(panelW, nc-jr))
				}
			}
			inPlace := (nc+panelW-1)/panelW <= packAPanels
			for ic := 0; ic < m; ic += mcMax {
				mc := min(mcMax, m-ic)
				var ap []float32
				if !inPlace {
					buf.a = grow(buf.a, mc*kc)
					ap = buf.a
					packA(ap, a, lda, ic, mc, pc, kc, im.mrMax)
				}
				for jr := 0; jr < nc; jr += panelW {
					nr := min(panelW, nc-jr)
					var bpan []float32
					ldb := panelW
					switch {
					case b.pk != nil:
						off := ((b.j0+jc+jr)/panelW)*b.pk.k*panelW + pc*panelW
						bpan = b.pk.data[off : off+kc*panelW]
					case packAll:
						bpan = bp[(jr/panelW)*kc*panelW : (jr/panelW+1)*kc*panelW]
					case nr < panelW:
						buf.edge = grow(buf.edge, kc*panelW)
						bpan = buf.edge
						packPanel(bpan, &b, pc, kc, jc+jr, nr)
					default:
						off := pc*b.ld + jc + jr
						bpan = b.data[off : off+(kc-1)*b.ld+panelW]
						ldb = b.ld
					}
					for ir := 0; ir < mc; ir += im.mrMax {
						mr := min(im.mrMax, mc-ir)
						var apan []float32
						alda := 0
						if inPlace {
							apan = a[(ic+ir)*lda+pc : (ic+ir+mr-1)*lda+pc+kc]
							alda = lda
						} else {
							apan = ap[ir*kc : ir*kc+mr*kc]
						}
						crow := (ic+ir)*ldc + jc + jr
						if nr == panelW {
							micro(im, mr, kc, apan, alda, bpan, ldb, c[crow:], ldc, accum)
							continue
						}
						t := buf.tmp[:mr*panelW]
						micro(im, mr, kc, apan, alda, bpan, ldb, t, panelW, false)
						for i := range mr {
							dst := c[crow+i*ldc : crow+i*ldc+nr]
							src := t[i*panelW : i*panelW+nr]
							if accum {
								for j, v := range src {
									dst[j] += v
								}
							} else {
								copy(dst, src)
							}
						}
					}
				}
			}
		}
	}
}

// Gemm computes c = a·b, or c += a·b when acc, serially on the calling
// goroutine: a is m×k (element (i, p) at a[i*lda+p]), b is k×n (element
// (p, j) at b[p*ldb+j]) or, when transB, n×k (element (p, j) at
// b[j*ldb+p]), c is m×n (element (i, j) at c[i*ldc+j]). Any sizes and
// strides; the slices only need to reach their last element.
func Gemm(m, n, k int, a []float32, lda int, b []float32, ldb int, transB bool, c []float32, ldc int, acc bool) {
	gemm(m, n, k, a, lda, bOperand{data: b, ld: ldb, trans: transB}, c, ldc, acc)
}

// PackedB is a k×n matrix packed once (a model weight) to be the right
// operand of many products: column panels of 32, each k contiguous rows of
// 32 floats, the last zero padded. It is immutable and safe for concurrent
// use.
type PackedB struct {
	k, n int
	data []float32
}

// PackB packs b, k×n (element (p, j) at b[p*ldb+j], or b[j*ldb+p] when
// transB).
func PackB(k, n int, b []float32, ldb int, transB bool) *PackedB {
	np := (n + panelW - 1) / panelW
	pb := &PackedB{k: k, n: n, data: make([]float32, np*k*panelW)}
	src := bOperand{data: b, ld: ldb, trans: transB}
	for j := 0; j < n; j += panelW {
		packPanel(pb.data[(j/panelW)*k*panelW:], &src, 0, k, j, min(panelW, n-j))
	}
	return pb
}

// NewPackedB returns an empty k×n PackedB whose panels PackPanel fills,
// backed by buf when it is large enough (k·32·ceil(n/32) floats; a scratch
// the caller recycles) and by a new slice otherwise. It is safe to fill
// different panels concurrently; use it only after all are filled.
func NewPackedB(buf []float32, k, n int) *PackedB {
	return &PackedB{k: k, n: n, data: grow(buf, PackedBLen(k, n))}
}

// PackedBLen is how many floats [NewPackedB] packs a k×n matrix into: a
// buf of at least this capacity is used without allocating.
func PackedBLen(k, n int) int { return (n + panelW - 1) / panelW * k * panelW }

// Panels is the number of 32-column panels of the matrix.
func (pb *PackedB) Panels() int { return (pb.n + panelW - 1) / panelW }

// PackPanel packs columns [32p, 32p+32) of b (k×n, element (q, j) at
// b[q*ldb+j], or b[j*ldb+q] when transB) into panel p.
func (pb *PackedB) PackPanel(p int, b []float32, ldb int, transB bool) {
	j := p * panelW
	src := bOperand{data: b, ld: ldb, trans: transB}
	packPanel(pb.data[p*pb.k*panelW:], &src, 0, pb.k, j, min(panelW, pb.n-j))
}

// Data is the backing slice (for the caller to recycle once done).
func (pb *PackedB) Data() []float32 { return pb.data }

// K is the packed matrix's row count (the products' inner dimension).
func (pb *PackedB) K() int { return pb.k }

// N is the packed matrix's column count.
func (pb *PackedB) N() int { return pb.n }

// Gemm computes c = a·B[:, j0:j1] (c += … when acc) serially: a is m×K
// (stride lda), c is m×(j1−j0) (stride ldc). j0 must be a multiple of 32
// (a panel boundary) and j1 at most N.
func (pb *PackedB) Gemm(m int, a []float32, lda, j0, j1 int, c []float32, ldc int, acc bool) {
	if j0%panelW != 0 || j0 < 0 || j1 > pb.n || j0 > j1 {
		panic("simd: PackedB.Gemm columns out of range or unaligned")
	}
	gemm(m, j1-j0, pb.k, a, lda, bOperand{pk: pb, j0: j0}, c, ldc, acc)
}
