package model

import (
	"math"
	"sync"
	"sync/atomic"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// This file holds the hot loops: the matrix multiply used by every
// projection, the attention building blocks and the element-wise kernels.
//
// Matrix multiply. BenchmarkMatMul compares, on the model's own shapes,
// our pure-Go blocked kernel (matMulGo: 2×4 register tile, eight independent
// accumulators, bounds checks hoisted, our fan-out), gonum's blas32.Gemm on
// the whole product (gonum's own goroutines), and "forward": gonum's serial
// Sgemm on the tiles of our own fan-out. Go has no SIMD intrinsics while
// gonum's inner loops are SSE assembly, so on this 2-core machine ours
// reaches about 2.3–3.7 GFLOP per CPU-second, gonum's Gemm 3.3–9.4 and
// "forward" 5.1–9.7 (on par with gonum's Gemm or faster on every shape,
// 1.4–1.6× on the prefill shapes): the forward uses "forward". Tiles are at most 64 rows × 192 columns, which keeps gonum's
// Sgemm serial (it only starts goroutines from 4 blocks of 64×64).

// tileRows and tileCols bound one gemm task: gonum's Sgemm stays serial
// below 4 blocks of 64×64, so a task covers at most 1×3 blocks.
const (
	tileRows = 64
	tileCols = 192
)

var blasImpl gonum.Implementation

// mat is a row-major matrix view: element (i, j) is data[i*stride+j].
type mat struct {
	data       []float32
	rows, cols int
	stride     int
}

func dense(data []float32, rows, cols int) mat {
	return mat{data: data[:rows*cols], rows: rows, cols: cols, stride: cols}
}

// view returns the sub-matrix of rows [r0, r0+nr) and columns [c0, c0+nc).
func (a mat) view(r0, c0, nr, nc int) mat {
	if nr == 0 || nc == 0 {
		return mat{rows: nr, cols: nc, stride: a.stride}
	}
	off := r0*a.stride + c0
	end := (r0+nr-1)*a.stride + c0 + nc
	return mat{data: a.data[off:end], rows: nr, cols: nc, stride: a.stride}
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
// shape [k×n] or, when transB, [n×k].
func gemmTile(c, a, b mat, transB, acc bool) {
	tb := blas.NoTrans
	if transB {
		tb = blas.Trans
	}
	beta := float32(0)
	if acc {
		beta = 1
	}
	if a.cols == 0 {
		if !acc {
			for i := range c.rows {
				clear(c.row(i))
			}
		}
		return
	}
	blasImpl.Sgemm(blas.NoTrans, tb, c.rows, c.cols, a.cols, 1, a.data, a.stride, b.data, b.stride, beta, c.data, c.stride)
}

// tiles splits an m×n product into rt×ct tasks of tileRows rows and tc
// columns: the columns in ct balanced tiles of at most tileCols (rounded up
// to 16). Narrower tiles would parallelise small products (decode) better
// but make gonum's axpys shorter, which costs more CPU than it saves.
func tiles(m, n int) (rt, ct, tc int) {
	rt = (m + tileRows - 1) / tileRows
	ct = (n + tileCols - 1) / tileCols
	tc = (n + ct - 1) / ct
	tc = (tc + 15) &^ 15
	ct = (n + tc - 1) / tc
	return rt, ct, tc
}

// forTiles runs tile(r0, c0, nr, nc) for every tile of an m×n product (see
// tiles) on up to threads goroutines.
func forTiles(threads, m, n int, tile func(r0, c0, nr, nc int)) {
	rt, ct, tc := tiles(m, n)
	parallel(threads, rt*ct, func(_, t int) {
		r0 := (t / ct) * tileRows
		c0 := (t % ct) * tc
		tile(r0, c0, min(tileRows, m-r0), min(tc, n-c0))
	})
}

// gemm computes c = a·b (or c += a·b when acc) on up to threads goroutines.
// a is [m×k]; b is [k×n], or [n×k] when transB; c is [m×n].
func gemm(threads int, c, a, b mat, transB, acc bool) {
	m, n := c.rows, c.cols
	if m == 0 || n == 0 {
		return
	}
	forTiles(threads, m, n, func(r0, c0, nr, nc int) {
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

// matMulGo is our pure-Go blocked matrix multiply, c = a·bᵀ (+c when acc),
// with a [m×k], bt [n×k] (the transposed weight, so both operands stream
// along k) and c [m×n], spread over threads goroutines by 64-row tiles. The
// micro-kernel keeps a 2×4 tile of c in eight independent accumulators.
// BenchmarkMatMul compares it with gonum (which the forward uses).
func matMulGo(threads int, c, a, bt mat, acc bool) {
	m, n := c.rows, c.cols
	if m == 0 || n == 0 {
		return
	}
	forTiles(threads, m, n, func(r0, c0, nr, nc int) {
		matMulGoTile(c.view(r0, c0, nr, nc), a.view(r0, 0, nr, a.cols), bt.view(c0, 0, nc, bt.cols), acc)
	})
}

// matMulGoTile computes one tile serially: c = a·btᵀ (+c when acc).
func matMulGoTile(c, a, bt mat, acc bool) {
	r0, r1 := 0, c.rows
	n, k := c.cols, a.cols
	i := r0
	for ; i+2 <= r1; i += 2 {
		a0 := a.data[i*a.stride : i*a.stride+k]
		a1 := a.data[(i+1)*a.stride : (i+1)*a.stride+k]
		a1 = a1[:len(a0)]
		c0 := c.data[i*c.stride : i*c.stride+n]
		c1 := c.data[(i+1)*c.stride : (i+1)*c.stride+n]
		j := 0
		for ; j+4 <= n; j += 4 {
			b0 := bt.data[j*bt.stride : j*bt.stride+k][:len(a0)]
			b1 := bt.data[(j+1)*bt.stride : (j+1)*bt.stride+k][:len(a0)]
			b2 := bt.data[(j+2)*bt.stride : (j+2)*bt.stride+k][:len(a0)]
			b3 := bt.data[(j+3)*bt.stride : (j+3)*bt.stride+k][:len(a0)]
			var s00, s01, s02, s03, s10, s11, s12, s13 float32
			for p, x0 := range a0 {
				x1 := a1[p]
				y0 := b0[p]
				s00 += x0 * y0
				s10 += x1 * y0
				y1 := b1[p]
				s01 += x0 * y1
				s11 += x1 * y1
				y2 := b2[p]
				s02 += x0 * y2
				s12 += x1 * y2
				y3 := b3[p]
				s03 += x0 * y3
				s13 += x1 * y3
			}
			cr0 := c0[j : j+4 : j+4]
			cr1 := c1[j : j+4 : j+4]
			if acc {
				s00 += cr0[0]
				s01 += cr0[1]
				s02 += cr0[2]
				s03 += cr0[3]
				s10 += cr1[0]
				s11 += cr1[1]
				s12 += cr1[2]
				s13 += cr1[3]
			}
			cr0[0], cr0[1], cr0[2], cr0[3] = s00, s01, s02, s03
			cr1[0], cr1[1], cr1[2], cr1[3] = s10, s11, s12, s13
		}
		for ; j < n; j++ {
			b0 := bt.data[j*bt.stride : j*bt.stride+k]
			s0, s1 := dotGo(a0, b0), dotGo(a1, b0)
			if acc {
				s0 += c0[j]
				s1 += c1[j]
			}
			c0[j], c1[j] = s0, s1
		}
	}
	for ; i < r1; i++ {
		a0 := a.data[i*a.stride : i*a.stride+k]
		c0 := c.data[i*c.stride : i*c.stride+n]
		for j := range n {
			s := dotGo(a0, bt.data[j*bt.stride:j*bt.stride+k])
			if acc {
				s += c0[j]
			}
			c0[j] = s
		}
	}
}

// dotGo is a dot product with four independent accumulators.
func dotGo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		aa := a[i : i+4 : i+4]
		bb := b[i : i+4 : i+4]
		s0 += aa[0] * bb[0]
		s1 += aa[1] * bb[1]
		s2 += aa[2] * bb[2]
		s3 += aa[3] * bb[3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// rmsNorm writes x/rms(x)*gain into dst (both of len(gain)).
func rmsNorm(dst, x, gain []float32) {
	x = x[:len(gain)]
	dst = dst[:len(gain)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		xx := x[i : i+4 : i+4]
		s0 += xx[0] * xx[0]
		s1 += xx[1] * xx[1]
		s2 += xx[2] * xx[2]
		s3 += xx[3] * xx[3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * x[i]
	}
	ss := (s0 + s1) + (s2 + s3)
	inv := float32(1 / math.Sqrt(float64(ss)/float64(len(x))+rmsEps))
	for i, g := range gain {
		dst[i] = x[i] * inv * g
	}
}

const rmsEps = 1e-5

// Coefficients of 2^f on [-1/2, 1/2] (Taylor series of e^(f·ln2), relative
// error below 6e-6 over the whole range).
const (
	log2e  = 1.44269504088896341
	exp2c5 = 1.3333558e-3
	exp2c4 = 9.6181291e-3
	exp2c3 = 5.5504109e-2
	exp2c2 = 2.4022651e-1
	exp2c1 = 6.9314718e-1
)

// expf is a fast float32 e^x: x·log2(e) = n + f with n an integer and
// |f| <= 1/2, then 2^f by a degree-5 polynomial and 2^n by building the
// float's exponent (relative error below 6e-6). Inputs below -87 give 0,
// above 88 give +Inf.
func expf(x float32) float32 {
	if x < -87 {
		return 0
	}
	if x > 88 {
		return float32(math.Inf(1))
	}
	t := x * log2e
	var n int32
	if t >= 0 {
		n = int32(t + 0.5)
	} else {
		n = int32(t - 0.5)
	}
	f := t - float32(n)
	p := float32(exp2c5)
	p = p*f + exp2c4
	p = p*f + exp2c3
	p = p*f + exp2c2
	p = p*f + exp2c1
	p = p*f + 1
	return p * math.Float32frombits(uint32(n+127)<<23)
}

// silu is x·sigmoid(x).
func silu(x float32) float32 {
	return x / (1 + expf(-x))
}

// softmaxPrefix replaces row[:valid] by exp(scale·(row-max)) and zeroes
// row[valid:]; it returns 1/Σ, the normalisation the caller applies to the
// weighted sum of values (one multiply per output instead of one per
// score). The exponential is expf's, inlined: this is the hottest scalar
// loop of a prefill.
func softmaxPrefix(row []float32, valid int, scale float32) float32 {
	v := row[:valid]
	mx := float32(math.Inf(-1))
	for _, s := range v {
		if s > mx {
			mx = s
		}
	}
	k := scale * log2e
	off := mx * k
	var sum float32
	for i, s := range v {
		t := s*k - off // <= 0
		if t < -125 {
			v[i] = 0
			continue
		}
		n := int32(t - 0.5) // round to nearest (t <= 0)
		f := t - float32(n)
		p := float32(exp2c5)
		p = p*f + exp2c4
		p = p*f + exp2c3
		p = p*f + exp2c2
		p = p*f + exp2c1
		p = p*f + 1
		e := p * math.Float32frombits(uint32(n+127)<<23)
		v[i] = e
		sum += e
	}
	clear(row[valid:])
	return 1 / sum
}
