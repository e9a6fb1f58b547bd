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

// Angles + RotateBy rotate exactly like RoPE.RotateHeads, and a Shift
// composes with the rotation (re-RoPE).
func TestRotateByMatchesRotateHeads(t *testing.T) {
	r := New(32, 0)
	cos, sin := make([]float64, 16), make([]float64, 16)
	for _, pos := range []int{0, 1, 17, 299, 300, -3, 1 << 20} {
		a := randMat(uint64(pos+10), 64)
		b := append([]float32(nil), a...)
		want := append([]float32(nil), a...)
		r.RotateHeads(a, pos)
		r.Angles(pos, cos, sin)
		r.RotateBy(b, cos, sin)
		if d := maxAbsDiff(a, b); d != 0 {
			t.Fatalf("pos %d: RotateBy differs by %g", pos, d)
		}
		if pos != 0 && maxAbsDiff(a, want) == 0 {
			t.Fatalf("pos %d: nothing rotated", pos)
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
