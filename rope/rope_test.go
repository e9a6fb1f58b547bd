package rope

import (
	"math"
	"math/rand/v2"
	"testing"
)

func randMat(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 2))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func maxAbsDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// A Table rotates exactly like RoPE.RotateHeads, and a Shift composes with
// the rotation (re-RoPE).
func TestTableMatchesRotateHeads(t *testing.T) {
	r := New(32, 0)
	tab := NewTable(r, 300)
	for _, pos := range []int{0, 1, 17, 299, 300, -3} {
		a := randMat(uint64(pos+10), 64)
		b := append([]float32(nil), a...)
		r.RotateHeads(a, pos)
		tab.Rotate(b, pos)
		if d := maxAbsDiff(a, b); d != 0 {
			t.Fatalf("pos %d: table differs by %g", pos, d)
		}
	}
	x := randMat(3, 32)
	direct := append([]float32(nil), x...)
	r.RotateHeads(direct, 250)
	shifted := append([]float32(nil), x...)
	r.RotateHeads(shifted, 10)
	r.Shift(shifted, 10, 250)
	if d := maxAbsDiff(direct, shifted); d > 1e-5 {
		t.Fatalf("Shift does not compose: %g", d)
	}
}
