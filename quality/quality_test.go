package quality

import (
	"errors"
	"math"
	"testing"
)

func TestKL(t *testing.T) {
	// softmax([0, ln 3]) = [1/4, 3/4]; softmax([0, 0]) = [1/2, 1/2].
	ln3 := float32(math.Log(3))
	want := 0.25*math.Log(0.25/0.5) + 0.75*math.Log(0.75/0.5)
	tests := []struct {
		name string
		p, q []float32
		want float64
	}{
		{"equal", []float32{1, 2, 3}, []float32{1, 2, 3}, 0},
		{"shifted logits are the same distribution", []float32{1, 2, 3}, []float32{11, 12, 13}, 0},
		{"known value", []float32{0, ln3}, []float32{0, 0}, want},
		{"large logits stay finite", []float32{1000, 0}, []float32{0, 1000}, 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := KL(tc.p, tc.q)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-tc.want) > 1e-7*math.Max(1, tc.want) { // ln 3 is a float32
				t.Fatalf("KL = %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := KL([]float32{1}, []float32{1, 2}); !errors.Is(err, ErrShape) {
		t.Fatalf("err %v", err)
	}
}

func TestCompare(t *testing.T) {
	const v = 3
	full := []float32{0, 5, 0 /**/, 4, 0, 0 /**/, 0, 0, 9}
	tests := []struct {
		name  string
		blend []float32
		top1  float64
		match int
	}{
		{"identical", full, 1, 3},
		{"second position flips", []float32{0, 5, 0, 0, 4, 0, 0, 0, 9}, 2.0 / 3, 1},
		{"first position flips", []float32{5, 0, 0, 4, 0, 0, 0, 0, 9}, 2.0 / 3, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Compare(full, tc.blend, v)
			if err != nil {
				t.Fatal(err)
			}
			if r.Positions != 3 || math.Abs(r.Top1-tc.top1) > 1e-12 || r.GreedyMatch != tc.match {
				t.Fatalf("report %+v", r)
			}
			if tc.match == 3 && (r.MeanKL != 0 || r.MaxKL != 0 || r.FirstKL != 0) {
				t.Fatalf("identical logits: %+v", r)
			}
			if tc.match < 3 && !(r.MaxKL > 0 && r.MeanKL > 0 && r.MaxKL >= r.MeanKL) {
				t.Fatalf("differing logits: %+v", r)
			}
			if (tc.match == 0) != (r.FirstKL > 0) {
				t.Fatalf("first KL %v with the first position %v", r.FirstKL, tc.match > 0)
			}
		})
	}
	for _, bad := range [][2][]float32{{full, full[:6]}, {full[:4], full[:4]}, {nil, nil}} {
		if _, err := Compare(bad[0], bad[1], v); !errors.Is(err, ErrShape) {
			t.Fatalf("Compare(%d, %d logits): err %v", len(bad[0]), len(bad[1]), err)
		}
	}
}

func BenchmarkCompare(b *testing.B) {
	const v, k = 32000, 8
	full, blend := make([]float32, v*k), make([]float32, v*k)
	for i := range full {
		full[i], blend[i] = float32(i%97)/10, float32(i%89)/10
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compare(full, blend, v); err != nil {
			b.Fatal(err)
		}
	}
}
