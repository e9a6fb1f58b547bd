package loadgen

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPercentile(t *testing.T) {
	four := []float64{1, 2, 3, 4}
	for _, tc := range []struct {
		name   string
		q      float64
		sorted []float64
		want   float64
	}{
		{"median of four interpolates", 0.5, four, 2.5},
		// rank 0.9·3 = 2.7: 3·0.3 + 4·0.7.
		{"p90 of four", 0.9, four, 3.7},
		{"min", 0, four, 1},
		{"max", 1, four, 4},
		// rank 0.95·9 = 8.55 over 10..100: 90 + 0.55·10.
		{"p95 of ten", 0.95, []float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, 95.5},
		{"single value", 0.99, []float64{7}, 7},
		{"empty", 0.5, nil, math.NaN()},
		{"q NaN", math.NaN(), four, math.NaN()},
		{"q < 0", -1, four, math.Inf(-1)},
		{"q > 1", 2, four, math.Inf(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.q, tc.sorted); !sameFloat(got, tc.want) {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tc.q, tc.sorted, got, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	in := []float64{0.4, 0.1, 0.3, 0.2}
	s := Summarize(in)
	if s.N != 4 || !sameFloat(float64(s.P50), 0.25) || !sameFloat(float64(s.Max), 0.4) || !sameFloat(float64(s.Mean), 0.25) ||
		!sameFloat(float64(s.P90), 0.37) {
		t.Errorf("Summarize = %+v", s)
	}
	if !slices.Equal(in, []float64{0.4, 0.1, 0.3, 0.2}) {
		t.Errorf("input modified: %v", in)
	}
	e := Summarize(nil)
	if e.N != 0 || !math.IsNaN(float64(e.P95)) || !math.IsNaN(float64(e.Max)) {
		t.Errorf("Summarize(nil) = %+v", e)
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"n":0,"mean_s":null,"p50_s":null,"p90_s":null,"p95_s":null,"p99_s":null,"max_s":null}` {
		t.Errorf("empty summary JSON %s", b)
	}
	var back Summary
	if err := json.Unmarshal(b, &back); err != nil || !math.IsNaN(float64(back.P50)) {
		t.Errorf("round trip %+v, %v", back, err)
	}
}

func BenchmarkSummarize(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	v := make([]float64, 1000)
	for i := range v {
		v[i] = rng.ExpFloat64()
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = Summarize(v)
	}
}
