package quality

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrShape is returned when two logit sets do not describe the same
// positions over the same vocabulary.
var ErrShape = errors.New("quality: logit shapes differ")

// LogSoftmax writes the log-probabilities of logits into dst (grown as
// needed) and returns it, computed in float64 with the maximum subtracted
// (stable for any finite logits).
func LogSoftmax(dst []float64, logits []float32) []float64 {
	dst = append(dst[:0], make([]float64, len(logits))...)
	if len(logits) == 0 {
		return dst
	}
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for i, v := range logits {
		dst[i] = float64(v) - mx
		sum += math.Exp(dst[i])
	}
	lse := math.Log(sum)
	for i := range dst {
		dst[i] -= lse
	}
	return dst
}

// KL is the Kullback–Leibler divergence KL(p ‖ q) in nats of the
// distributions softmax(p) and softmax(q): how much information is lost
// when q (the blended forward) stands for p (the full prefill). It is 0
// for equal distributions and never negative (rounding aside, clamped at
// 0 only below 1e-12). p and q must have the same length.
func KL(p, q []float32) (float64, error) {
	if len(p) != len(q) || len(p) == 0 {
		return 0, fmt.Errorf("%w: %d and %d logits", ErrShape, len(p), len(q))
	}
	lp, lq := LogSoftmax(nil, p), LogSoftmax(nil, q)
	return klLog(lp, lq), nil
}

func klLog(lp, lq []float64) float64 {
	var kl float64
	for i, a := range lp {
		if a == math.Inf(-1) {
			continue
		}
		kl += math.Exp(a) * (a - lq[i])
	}
	if kl < 0 && kl > -1e-12 { // summation rounding of equal distributions
		kl = 0
	}
	return kl
}

// Argmax is the index of the largest logit (the first of equal ones); -1
// for none.
func Argmax(logits []float32) int {
	best := -1
	for i, v := range logits {
		if best < 0 || v > logits[best] {
			best = i
		}
	}
	return best
}

// Report compares the next-token distributions of one or more consecutive
// positions (teacher-forced: both forwards were fed the same tokens). A
// plain value.
type Report struct {
	// Positions is how many positions were compared.
	Positions int `json:"positions"`
	// FirstKL is KL(full ‖ blend) at the first position: the first output
	// token's distribution.
	FirstKL float64 `json:"first_kl"`
	// MeanKL and MaxKL are over every position.
	MeanKL float64 `json:"mean_kl"`
	MaxKL  float64 `json:"max_kl"`
	// Top1 is the fraction of positions whose most likely token agrees.
	Top1 float64 `json:"top1"`
	// GreedyMatch is how many leading positions agree on the most likely
	// token: the length of the common greedy output (Positions when the
	// greedy outputs match throughout).
	GreedyMatch int `json:"greedy_match"`
	// FullTime and BlendTime are the wall times of the prompt's full
	// prefill and of its blended forward (set by Served and Blend; the
	// documents' own prefills, done once per document, are not counted).
	FullTime  time.Duration `json:"-"`
	BlendTime time.Duration `json:"-"`
}

// Compare compares full and blend, each the logits of the same positions
// (row-major, vocab values per position).
func Compare(full, blend []float32, vocab int) (Report, error) {
	if vocab <= 0 || len(full) != len(blend) || len(full) == 0 || len(full)%vocab != 0 {
		return Report{}, fmt.Errorf("%w: %d and %d logits over a vocabulary of %d", ErrShape, len(full), len(blend), vocab)
	}
	var r Report
	r.Positions = len(full) / vocab
	var lp, lq []float64
	agree, matching := 0, true
	for i := range r.Positions {
		p, q := full[i*vocab:(i+1)*vocab], blend[i*vocab:(i+1)*vocab]
		lp, lq = LogSoftmax(lp, p), LogSoftmax(lq, q)
		kl := klLog(lp, lq)
		if i == 0 {
			r.FirstKL = kl
		}
		r.MeanKL += kl / float64(r.Positions)
		r.MaxKL = math.Max(r.MaxKL, kl)
		same := Argmax(p) == Argmax(q)
		if same {
			agree++
		}
		matching = matching && same
		if matching {
			r.GreedyMatch++
		}
	}
	r.Top1 = float64(agree) / float64(r.Positions)
	return r, nil
}
