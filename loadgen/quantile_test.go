package loadgen

import (
	"encoding/json"
	"math"
	"slices"
	"testing"
)

var inf = math.Inf(1)

func bk(pairs ...float64) []Bucket {
	out := make([]Bucket, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, Bucket{UpperBound: pairs[i], Count: pairs[i+1]})
	}
	return out
}

func TestHistogramQuantileHandExamples(t *testing.T) {
	// The hand example: bounds 0.1, 0.5, 1; observations 0.05, 0.1, 0.3, 2.0 → C = 2, 3, 3, 4.
	design := bk(0.1, 2, 0.5, 3, 1, 3, inf, 4)
	// Prometheus' testhistogram: 0.1:50, 0.2:70, 1:110, +Inf:120.
	prom := bk(0.1, 50, 0.2, 70, 1, 110, inf, 120)
	for _, tc := range []struct {
		name    string
		q       float64
		buckets []Bucket
		want    float64
	}{
		// rank 1 in the first bucket, interpolated from 0: 0.1·(1/2).
		{"design q=0.25", 0.25, design, 0.05},
		// rank 2 = the whole first bucket: its upper bound.
		{"design q=0.5", 0.5, design, 0.1},
		// rank 3 in (0.1, 0.5] holding 1: 0.1 + 0.4·(1/1).
		{"design q=0.75", 0.75, design, 0.5},
		// rank 3.8 lies in the +Inf bucket: the highest finite bound.
		{"design q=0.95 in +Inf", 0.95, design, 1},
		{"design q=1 in +Inf", 1, design, 1},
		// rank 0 is found in the first bucket: 0.
		{"design q=0", 0, design, 0},
		// rank 60 in (0.1, 0.2] holding 20, 10 in: 0.1 + 0.1·10/20.
		{"prom q=0.5", 0.5, prom, 0.15},
		// rank 108 in (0.2, 1] holding 40, 38 in: 0.2 + 0.8·38/40.
		{"prom q=0.9", 0.9, prom, 0.96},
		// rank 25 in the first bucket: 0.1·25/50.
		{"prom q=0.2083", 25.0 / 120, prom, 0.05},
		// Unsorted input is sorted first.
		{"unsorted", 0.5, bk(inf, 120, 1, 110, 0.1, 50, 0.2, 70), 0.15},
		// Equal bounds are merged (their counts added), as after sum without le.
		{"duplicate bounds", 0.5, bk(0.1, 25, 0.1, 25, 0.2, 35, 0.2, 35, 1, 110, inf, 120), 0.15},
		// A bucket lower than its predecessor is raised to it (forced monotonic): C = 50,
		// 50, 110, 120, so rank 60 lies in (0.2, 1] holding 60, 10 in.
		{"non-monotonic", 0.5, bk(0.1, 50, 0.2, 40, 1, 110, inf, 120), 0.2 + 0.8*10.0/60},
		// A lowest bound ≤ 0 is returned as is when the rank falls in it.
		{"non-positive lowest bound", 0.1, bk(-0.2, 10, 0.3, 20, inf, 30), -0.2},
		// Only +Inf: fewer than two buckets.
		{"only +Inf", 0.5, bk(inf, 10), math.NaN()},
		// Every observation above the top bound.
		{"all in +Inf", 0.5, bk(0.1, 0, 1, 0, inf, 5), 1},
		// No +Inf bucket: not a complete histogram.
		{"no +Inf", 0.5, bk(0.1, 1, 1, 2), math.NaN()},
		{"empty histogram", 0.5, bk(0.1, 0, 1, 0, inf, 0), math.NaN()},
		{"no buckets", 0.5, nil, math.NaN()},
		{"NaN bound", 0.5, bk(math.NaN(), 1, inf, 2), math.NaN()},
		{"q NaN", math.NaN(), design, math.NaN()},
		{"q < 0", -0.1, design, math.Inf(-1)},
		{"q > 1", 1.1, design, inf},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.buckets)
			got := HistogramQuantile(tc.q, tc.buckets)
			if !sameFloat(got, tc.want) {
				t.Errorf("HistogramQuantile(%v) = %v, want %v", tc.q, got, tc.want)
			}
			if !slices.EqualFunc(in, tc.buckets, func(a, b Bucket) bool {
				return sameFloat(a.UpperBound, b.UpperBound) && sameFloat(a.Count, b.Count)
			}) {
				t.Errorf("input modified: %v", tc.buckets)
			}
		})
	}
}

func sameFloat(a, b float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	if math.IsInf(a, 0) || math.IsInf(b, 0) {
		return a == b
	}
	return math.Abs(a-b) <= 1e-12
}

func TestBucketWindow(t *testing.T) {
	bounds := []float64{0.01, 0.02, 0.04, 0.08, inf}
	for _, tc := range []struct {
		v    float64
		want int
	}{{0.005, 0}, {0.01, 0}, {0.011, 1}, {0.04, 2}, {0.05, 3}, {0.08, 3}, {0.5, 4}, {math.NaN(), -1}} {
		if got := bucketIndex(tc.v, bounds); got != tc.want {
			t.Errorf("bucketIndex(%v) = %d, want %d", tc.v, got, tc.want)
		}
	}
	for _, tc := range []struct {
		lo, hi int
		want   string
	}{{0, 0, "(0, 0.01]"}, {-1, 1, "(0, 0.02]"}, {1, 3, "(0.01, 0.08]"}, {3, 5, "(0.04, +Inf]"}} {
		if got := bucketRange(bounds, tc.lo, tc.hi); got != tc.want {
			t.Errorf("bucketRange(%d, %d) = %s, want %s", tc.lo, tc.hi, got, tc.want)
		}
	}
}

func TestBucketJSON(t *testing.T) {
	in := bk(0.25, 3, inf, 4)
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `[{"le":"0.25","count":3},{"le":"+Inf","count":4}]` {
		t.Errorf("JSON %s", b)
	}
	var back []Bucket
	if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back, in) {
		t.Errorf("round trip %v, %v", back, err)
	}
}

func FuzzHistogramQuantile(f *testing.F) {
	f.Add(0.95, 0.1, 2.0, 0.5, 3.0, 1.0, 3.0, 4.0)
	f.Add(0.5, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
	f.Fuzz(func(t *testing.T, q, b1, c1, b2, c2, b3, c3, cinf float64) {
		bs := []Bucket{{b1, c1}, {b2, c2}, {b3, c3}, {inf, cinf}}
		got := HistogramQuantile(q, bs)
		if math.IsNaN(got) || math.IsInf(got, 0) || q < 0 || q > 1 || math.IsNaN(q) {
			return
		}
		// A defined estimate lies within the finite bounds (or [0, lowest]) when every
		// input is finite and counts are non-negative.
		lo, hi := math.Min(0, math.Min(b1, math.Min(b2, b3))), math.Max(b1, math.Max(b2, b3))
		for _, v := range []float64{b1, b2, b3, c1, c2, c3, cinf} {
			if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1e12 {
				return
			}
		}
		if c1 < 0 || c2 < 0 || c3 < 0 {
			return
		}
		if got < lo-1e-9 || got > hi+1e-9 {
			t.Fatalf("HistogramQuantile(%v, %v) = %v outside [%v, %v]", q, bs, got, lo, hi)
		}
	})
}

func BenchmarkHistogramQuantile(b *testing.B) {
	bounds := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, inf}
	bs := make([]Bucket, len(bounds))
	for i, ub := range bounds {
		bs[i] = Bucket{UpperBound: ub, Count: float64(10 * (i + 1))}
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = HistogramQuantile(0.95, bs)
	}
}
