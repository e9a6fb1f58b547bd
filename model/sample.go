package model

import (
	"math"
	"math/rand/v2"
	"slices"
)

// SamplingParams selects how Sample picks a token (a plain value). The zero
// value is greedy decoding.
type SamplingParams struct {
	// Temperature divides the logits; 0 (or negative) means greedy argmax.
	Temperature float64
	// TopP keeps the smallest set of most likely tokens whose probability
	// reaches TopP (nucleus sampling); 0 or >= 1 keeps every token.
	TopP float64
	// TopK keeps the K most likely tokens; 0 keeps every token.
	TopK int
}

// Greedy reports whether p selects argmax decoding.
func (p SamplingParams) Greedy() bool { return p.Temperature <= 0 }

// Argmax returns the index of the largest logit (the first on ties; NaN
// logits are never chosen unless every logit is NaN). It returns -1 for an
// empty slice.
func Argmax(logits []float32) int32 {
	best := int32(-1)
	bv := float32(math.Inf(-1))
	for i, v := range logits {
		if v > bv || (best < 0 && !math.IsNaN(float64(v))) {
			best, bv = int32(i), v
		}
	}
	if best < 0 && len(logits) > 0 {
		return 0
	}
	return best
}

// Sample picks a token id from logits: greedy argmax when p.Temperature <= 0
// or rng is nil, otherwise a draw from softmax(logits/Temperature)
// restricted by TopK and TopP, using rng (so a seeded rng reproduces the
// same choices). It returns -1 only for empty logits. Sample does not modify
// logits and is safe for concurrent use with distinct rngs.
func Sample(logits []float32, p SamplingParams, rng *rand.Rand) int32 {
	if len(logits) == 0 {
		return -1
	}
	if p.Greedy() || rng == nil {
		return Argmax(logits)
	}
	type cand struct {
		id int32
		p  float64
	}
	cands := make([]cand, 0, len(logits))
	mx := math.Inf(-1)
	for _, v := range logits {
		if f := float64(v); f > mx {
			mx = f
		}
	}
	if math.IsInf(mx, -1) || math.IsNaN(mx) {
		return Argmax(logits)
	}
	var sum float64
	for i, v := range logits {
		f := float64(v)
		if math.IsNaN(f) {
			continue
		}
		e := math.Exp((f - mx) / p.Temperature)
		cands = append(cands, cand{int32(i), e})
		sum += e
	}
	slices.SortStableFunc(cands, func(a, b cand) int {
		switch {
		case a.p > b.p:
			return -1
		case a.p < b.p:
			return 1
		}
		return 0
	})
	if p.TopK > 0 && p.TopK < len(cands) {
		cands = cands[:p.TopK]
	}
	keep := len(cands)
	if p.TopP > 0 && p.TopP < 1 {
		var c float64
		for i, cd := range cands {
			c += cd.p / sum
			if c >= p.TopP {
				keep = i + 1
				break
			}
		}
	}
	cands = cands[:keep]
	var mass float64
	for _, cd := range cands {
		mass += cd.p
	}
	u := rng.Float64() * mass
	for _, cd := range cands {
		u -= cd.p
		if u < 0 {
			return cd.id
		}
	}
	return cands[len(cands)-1].id
}
