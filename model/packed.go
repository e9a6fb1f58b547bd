package model

import "github.com/cacheblend/cacheblend/simd"

// packedLayer holds one layer's matrices packed once at load as right
// operands of simd's matrix multiply (32-column panels), so no forward —
// decode above all, where a product is a few rows against a whole weight —
// repacks them.
type packedLayer struct {
	qkv, wo, gu, down *simd.PackedB
}

// packWeights packs every layer's matrices and the tied LM head (used
// transposed: logits = h·Eᵀ). It must run after the weights are final.
func (m *Model) packWeights() {
	d, f := m.cfg.Dim, m.cfg.FFNDim
	m.packed = make([]packedLayer, len(m.layers))
	for l := range m.layers {
		lw, pl := &m.layers[l], &m.packed[l]
		pl.qkv = simd.PackB(d, m.qkvDim, lw.wqkv, m.qkvDim, false)
		pl.wo = simd.PackB(m.qDim, d, lw.wo, d, false)
		pl.gu = simd.PackB(d, 2*f, lw.wgu, 2*f, false)
		pl.down = simd.PackB(f, d, lw.wdown, d, false)
	}
	m.embedPacked = simd.PackB(d, m.cfg.Vocab, m.embed, d, true)
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
