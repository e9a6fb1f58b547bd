package loadgen

import (
	"math"
	"slices"
	"strconv"
)

// Seconds is a duration in seconds as reported in JSON: NaN and ±Inf (an undefined value,
// such as a percentile of nothing) are written as null.
type Seconds float64

// MarshalJSON writes s as a JSON number, or null when it is NaN or infinite.
func (s Seconds) MarshalJSON() ([]byte, error) {
	f := float64(s)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

// UnmarshalJSON reads a number, or null as NaN.
func (s *Seconds) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*s = Seconds(math.NaN())
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return err
	}
	*s = Seconds(f)
	return nil
}

// Percentile returns the q-quantile (0 ≤ q ≤ 1) of values sorted ascending, interpolating
// linearly between the two closest ranks (rank q·(n−1), as PromQL's quantile() and numpy's
// default): q = 0 is the minimum, q = 1 the maximum. It returns NaN for no values or a NaN q,
// −Inf for q < 0 and +Inf for q > 1 (as PromQL). values must be sorted; it is not modified.
// Safe for concurrent use.
func Percentile(q float64, sorted []float64) float64 {
	switch {
	case len(sorted) == 0 || math.IsNaN(q):
		return math.NaN()
	case q < 0:
		return math.Inf(-1)
	case q > 1:
		return math.Inf(1)
	}
	n := float64(len(sorted))
	rank := q * (n - 1)
	lo := math.Floor(rank)
	hi := math.Min(n-1, lo+1)
	w := rank - lo
	return sorted[int(lo)]*(1-w) + sorted[int(hi)]*w
}

// Quantiles are the p50, p90, p95 and p99 of a sample, in seconds; NaN (null) when undefined.
type Quantiles struct {
	P50 Seconds `json:"p50_s"`
	P90 Seconds `json:"p90_s"`
	P95 Seconds `json:"p95_s"`
	P99 Seconds `json:"p99_s"`
}

// quantilesOf evaluates the quantile function at of at 0.5, 0.9, 0.95 and 0.99.
func quantilesOf(at func(q float64) float64) Quantiles {
	return Quantiles{P50: Seconds(at(0.50)), P90: Seconds(at(0.90)), P95: Seconds(at(0.95)), P99: Seconds(at(0.99))}
}

// Summary describes a sample of latencies in seconds. With N = 0 every other field is NaN
// (null in JSON).
type Summary struct {
	N    int     `json:"n"`
	Mean Seconds `json:"mean_s"`
	Quantiles
	Max Seconds `json:"max_s"`
}

// Summarize returns the Summary of values (seconds, any order; not modified) with
// percentiles from Percentile. Safe for concurrent use.
func Summarize(values []float64) Summary {
	s := slices.Sorted(slices.Values(values))
	nan := Seconds(math.NaN())
	out := Summary{N: len(s), Mean: nan, Max: nan, Quantiles: quantilesOf(func(q float64) float64 { return Percentile(q, s) })}
	if len(s) == 0 {
		return out
	}
	var sum float64
	for _, v := range s {
		sum += v
	}
	out.Mean = Seconds(sum / float64(len(s)))
	out.Max = Seconds(s[len(s)-1])
	return out
}

// Latencies are the three latencies of a run: time to first token, time per output token
// and end to end; T is Summary for the client's measurements, ServerQuantiles for the
// server's.
type Latencies[T any] struct {
	TTFT T `json:"ttft"`
	TPOT T `json:"tpot"`
	E2E  T `json:"e2e"`
}

// all returns TTFT, TPOT and E2E in that order.
func (l Latencies[T]) all() [3]T { return [3]T{l.TTFT, l.TPOT, l.E2E} }
