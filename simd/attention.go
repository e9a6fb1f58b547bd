package simd

import "sync"

// attnBlock is the number of keys one step of Attention scores: the score
// block (rows × attnBlock) is the only score storage, whatever the context.
const attnBlock = 128

type attnBuf struct{ s, m, l []float32 }

var attnPool = sync.Pool{New: func() any { return new(attnBuf) }}

// Attention computes, for nr query rows of one head, the causal attention
// out[i] = softmax(scale·q_i·Kᵀ)·V over keys [0, lim[i]) (lim[i] >= 1, scale > 0), fused
// flash-style: keys are taken attnBlock at a time; each block's scores
// (a matrix multiply), their exponentials with a running max and sum per
// row (online softmax) and the weighted sum of the block's values (a matrix
// multiply into out, rescaled when the max grows) are done before the next
// block, so no score row longer than attnBlock is stored.
//
// Layouts: q row i at q[i*ldq:][:hd]; keys transposed, key t's element d
// at kt[d*ldk+t]; values row-major, value t at v[t*ldv:][:hd]; out row i
// at out[i*ldo:][:hd] (overwritten).
func Attention(nr, hd int, q []float32, ldq int, kt []float32, ldk int, v []float32, ldv int, lim []int, scale float32, out []float32, ldo int) {
	if nr <= 0 {
		return
	}
	lim = lim[:nr]
	ctx := 0
	for _, l := range lim {
		ctx = max(ctx, l)
	}
	buf := attnPool.Get().(*attnBuf)
	defer attnPool.Put(buf)
	buf.s = grow(buf.s, nr*attnBlock)
	buf.m = grow(buf.m, nr)
	buf.l = grow(buf.l, nr)
	s, mx, sum := buf.s, buf.m, buf.l
	for i := range nr {
		mx[i] = negInf
		sum[i] = 0
		clear(out[i*ldo : i*ldo+hd])
	}
	k := scale * log2e
	for t0 := 0; t0 < ctx; t0 += attnBlock {
		bk := min(attnBlock, ctx-t0)
		// Rows whose keys end before t0 are done; rows are usually sorted
		// by limit, so skip the finished ones at the top.
		r0 := 0
		for r0 < nr && lim[r0] <= t0 {
			r0++
		}
		if r0 == nr {
			continue
		}
		rows := nr - r0
		gemm(rows, bk, hd, q[r0*ldq:], ldq, bOperand{data: kt[t0:], ld: ldk}, s, attnBlock, false)
		for i := range rows {
			row := s[i*attnBlock : i*attnBlock+bk]
			valid := min(bk, lim[r0+i]-t0)
			if valid <= 0 {
				clear(row)
				continue
			}
			m := Max(row[:valid]) * scale
			old := mx[r0+i]
			if m > old {
				if old != negInf {
					corr := exp2Go((old - m) * log2e)
					sum[r0+i] *= corr
					Scale(out[(r0+i)*ldo:(r0+i)*ldo+hd], corr)
				}
				mx[r0+i] = m
			}
			sum[r0+i] += ExpSum(row[:valid], k, mx[r0+i]*log2e)
			clear(row[valid:])
		}
		gemm(rows, hd, bk, s, attnBlock, bOperand{data: v[t0*ldv:], ld: ldv}, out[r0*ldo:], ldo, true)
	}
	for i := range nr {
		if sum[i] > 0 {
			Scale(out[i*ldo:i*ldo+hd], 1/sum[i])
		}
	}
}

// AttentionFLOPs is the useful work of Attention (QKᵀ and PV, two FLOPs
// per multiply-add) for head size hd and the given key counts.
func AttentionFLOPs(hd int, lim []int) float64 {
	var keys float64
	for _, l := range lim {
		keys += float64(l)
	}
	return 4 * float64(hd) * keys
}
