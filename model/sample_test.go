package model

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestArgmax(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		name   string
		logits []float32
		want   int32
	}{
		{"empty", nil, -1},
		{"single", []float32{3}, 0},
		{"max in middle", []float32{1, 5, 2}, 1},
		{"first on ties", []float32{4, 4, 1}, 0},
		{"negative", []float32{-3, -1, -2}, 1},
		{"skips NaN", []float32{nan, 1, 2}, 2},
		{"all NaN", []float32{nan, nan}, 0},
		{"minus infinity", []float32{float32(math.Inf(-1)), float32(math.Inf(-1))}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Argmax(tc.logits); got != tc.want {
				t.Fatalf("Argmax = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestSample(t *testing.T) {
	logits := []float32{1, 3, 2, 0.5, 2.9}
	rng := func() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }
	tests := []struct {
		name string
		p    SamplingParams
		rng  *rand.Rand
		want int32 // -2: any
	}{
		{"greedy zero value", SamplingParams{}, rng(), 1},
		{"nil rng is greedy", SamplingParams{Temperature: 1}, nil, 1},
		{"top-k 1", SamplingParams{Temperature: 5, TopK: 1}, rng(), 1},
		{"tiny top-p", SamplingParams{Temperature: 1, TopP: 1e-6}, rng(), 1},
		{"sampled", SamplingParams{Temperature: 1, TopP: 0.9}, rng(), -2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Sample(logits, tc.p, tc.rng)
			if got < 0 || int(got) >= len(logits) || (tc.want >= 0 && got != tc.want) {
				t.Fatalf("Sample = %d, want %d", got, tc.want)
			}
		})
	}
	if Sample(nil, SamplingParams{Temperature: 1}, rng()) != -1 {
		t.Fatal("empty logits should give -1")
	}
}

func TestSampleSeededAndDistribution(t *testing.T) {
	logits := []float32{0, float32(math.Log(3)), -20}
	p := SamplingParams{Temperature: 1}
	a, b := rand.New(rand.NewPCG(9, 9)), rand.New(rand.NewPCG(9, 9))
	counts := make([]int, 3)
	const n = 4000
	for range n {
		x, y := Sample(logits, p, a), Sample(logits, p, b)
		if x != y {
			t.Fatal("same seed gave different samples")
		}
		counts[x]++
	}
	// Token 1 has probability 3/4, token 0 1/4, token 2 ~0.
	if f := float64(counts[1]) / n; math.Abs(f-0.75) > 0.04 {
		t.Fatalf("token 1 drawn %.3f of the time, want 0.75 (counts %v)", f, counts)
	}
	if counts[2] > 2 {
		t.Fatalf("improbable token drawn %d times", counts[2])
	}
	// Top-p 0.5 keeps only token 1.
	for range 100 {
		if got := Sample(logits, SamplingParams{Temperature: 1, TopP: 0.5}, a); got != 1 {
			t.Fatalf("top-p 0.5 drew %d", got)
		}
	}
}
