package model

import (
	"sync"
	"sync/atomic"

	"github.com/cacheblend/cacheblend/simd"
)

// This file holds the model's side of the hot loops: the fan-out of the
// matrix multiplies over the model's threads, and thin wrappers over the
// SIMD kernels of package simd (AVX-512, AVX2+FMA or pure Go, chosen at
// run time; CB_SIMD=off forces pure Go) for RMSNorm, SwiGLU and softmax.
//
// Matrix multiply. gemm splits a product into tiles of at most tileRows ×
// tileCols and runs each with simd's serial packed, cache-blocked kernel on
// one of the model's goroutines. Weights are packed once at load
// (packT, at load), so no tile packs B. BenchmarkMatMul reports, on the
// model's shapes, GFLOP per CPU-second and the fraction of the per-core
// FP32 peak measured in the same run.

// tileRows and tileCols bound one gemm task: tileRows is a multiple of
// every micro-tile height (12 AVX-512, 6 AVX2, 4 pure Go) and column tiles
// are rounded to the 32-column panels of packed weights.
const (
	tileRows = 96
	tileCols = 192
)

// mat is a row-major matrix view: element (i, j) is data[i*stride+j]. A
// weight also carries its packed form pk (see packT): pk holds the
// matrix as the right operand of a product (transposed when pkT), and
// pkOff is this view's first column in it; views that cut rows of pk's
// inner dimension drop it.
type mat struct {
	data       []float32
	rows, cols int
	stride     int
	pk         *simd.PackedB
	pkT        bool
	pkOff      int
	q          *qmat // a weight computed from its file bytes (rows = outputs); see linear.go
}

func dense(data []float32, rows, cols int) mat {
	return mat{data: data[:rows*cols], rows: rows, cols: cols, stride: cols}
}

// view returns the sub-matrix of rows [r0, r0+nr) and columns [c0, c0+nc).
func (a mat) view(r0, c0, nr, nc int) mat {
	if a.q != nil { // a weight used transposed: rows are outputs
		if c0 != 0 || nc != a.cols {
			panic("model: column view of a quantized weight")
		}
		if r0 == 0 && nr == a.rows {
			return a
		}
		return mat{rows: nr, cols: nc, stride: nc, q: a.q.sliceRows(r0, r0+nr)}
	}
	if nr == 0 || nc == 0 {
		return mat{rows: nr, cols: nc, stride: a.stride}
	}
	off := r0*a.stride + c0
	end := (r0+nr-1)*a.stride + c0 + nc
	v := mat{data: a.data[off:end], rows: nr, cols: nc, stride: a.stride}
	switch {
	case a.pk == nil:
	case !a.pkT && r0 == 0 && nr == a.rows:
		v.pk, v.pkOff = a.pk, a.pkOff+c0
	case a.pkT && c0 == 0 && nc == a.cols:
		v.pk, v.pkT, v.pkOff = a.pk, true, a.pkOff+r0
	}
	return v
}

// row returns row i (cols values).
func (a mat) row(i int) []float32 {
	return a.data[i*a.stride : i*a.stride+a.cols]
}

// parallel runs fn(worker, task) for every task in [0, n) on at most
// threads goroutines (the caller's included) and returns when all are done.
// Workers pull tasks from a shared counter, so uneven tasks balance.
func parallel(threads, n int, fn func(worker, task int)) {
	if n <= 0 {
		return
	}
	if threads > n {
		threads = n
	}
	if threads <= 1 {
		for i := range n {
			fn(0, i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	work := func(w int) {
		for {
			i := int(next.Add(1)) - 1
			if i >= n {
				return
			}
			fn(w, i)
		}
	}
	wg.Add(threads - 1)
	for w := 1; w < threads; w++ {
		go func() {
			defer wg.Done()
			work(w)
		}()
	}
	work(0)
	wg.Wait()
}

// gemmTile computes one tile serially: c = a·b (+c when acc), with b of
// shape [k×n] or, when transB, [n×k]; a packed weight is used as packed
// when the tile starts on one of its panels.
func gemmTile(c, a, b mat, transB, acc bool) {
	if b.pk != nil && b.pkT == transB && b.pkOff%32 == 0 && b.pk.K() == a.cols && b.pkOff+c.cols <= b.pk.N() {
		b.pk.Gemm(c.rows, a.data, a.stride, b.pkOff, b.pkOff+c.cols, c.data, c.stride, acc)
		return
	}
	simd.Gemm(c.rows, c.cols, a.cols, a.data, a.stride, b.data, b.stride, transB, c.data, c.stride, acc)
}

// tiles splits an m×n product into rt×ct tasks of tileRows rows and tc
// columns: the columns in ct balanced tiles of at most tileCols (rounded up
// to 32, a packed panel).
func tiles(m, n int) (rt, ct, tc int) {
	rt = (m + tileRows - 1) / tileRows
	ct = (n + tileCols - 1) / tileCols
	tc = (n + ct - 1) / ct
	tc = (tc + 31) &^ 31
	ct = (n + tc - 1) / tc
	return rt, ct, tc
}

// forTiles runs tile(r0, c0, nr, nc) for every tile of an m×n product (see
// tiles) on the team's threads.
func forTiles(tm *team, m, n int, tile func(r0, c0, nr, nc int)) {
	rt, ct, tc := tiles(m, n)
	tm.run(rt*ct, func(_, t int) {
		r0 := (t / ct) * tileRows
		c0 := (t % ct) * tc
		tile(r0, c0, min(tileRows, m-r0), min(tc, n-c0))
	})
}

// gemm computes c = a·b (or c += a·b when acc) on the team's threads.
// a is [m×k]; b is [k×n], or [n×k] when transB; c is [m×n].
func gemm(tm *team, c, a, b mat, transB, acc bool) {
	m, n := c.rows, c.cols
	if m == 0 || n == 0 {
		return
	}
	if b.q != nil {
		qgemm(tm, c, a, b.q, 0, acc)
		return
	}
	forTiles(tm, m, n, func(r0, c0, nr, nc int) {
		av := a.view(r0, 0, nr, a.cols)
		var bv mat
		if transB {
			bv = b.view(c0, 0, nc, b.cols)
		} else {
			bv = b.view(0, c0, b.rows, nc)
		}
		gemmTile(c.view(r0, c0, nr, nc), av, bv, transB, acc)
	})
}

// rmsNorm writes x/rms(x)*gain into dst (both of len(gain)), with the
// model's epsilon.
func (m *Model) rmsNorm(dst, x, gain []float32) {
	simd.RMSNorm(dst, x, gain, m.cfg.NormEps)
}

// packT packs w, n rows of k (a weight used transposed), as the right
// operand of products x·wᵀ.
func packT(w []float32, n, k int) *simd.PackedB {
	return simd.PackB(k, n, w, k, true)
}

// swiglu writes silu(g)·up into dst (all of len(g)).
func swiglu(dst, g, up []float32) {
	simd.SwiGLU(dst, g, up)
}

// log2e is log2(e): softmax exponentials are computed as powers of two.
const log2e = 1.44269504088896341

// softmaxPrefix replaces row[:valid] by exp(scale·(row-max)) and zeroes
// row[valid:]; it returns 1/Σ, the normalisation the caller applies to the
// weighted sum of values (one multiply per output instead of one per
// score). valid must be at least 1.
func softmaxPrefix(row []float32, valid int, scale float32) float32 {
	v := row[:valid]
	k := scale * log2e
	sum := simd.ExpSum(v, k, simd.Max(v)*k)
	clear(row[valid:])
	return 1 / sum
}

// weight is the rows×cols row-major weight w with its packed form pk.
func weight(w []float32, pk *simd.PackedB, rows, cols int) mat {
	a := dense(w, rows, cols)
	a.pk = pk
	return a
}

// weightT is the rows×cols row-major weight w used transposed, with the
// packed form pk of its transpose.
func weightT(w []float32, pk *simd.PackedB, rows, cols int) mat {
	a := dense(w, rows, cols)
	a.pk, a.pkT = pk, true
	return a
}
