package loadgen

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
)

// Bucket is one cumulative histogram bucket as served by Prometheus: Count observations were
// at most UpperBound (the le label). The last bucket of a complete histogram has UpperBound
// +Inf and Count equal to the histogram's _count.
type Bucket struct {
	UpperBound float64
	Count      float64
}

// bucketJSON is a Bucket in JSON: the bound formatted as Prometheus writes its le label.
type bucketJSON struct {
	LE    string  `json:"le"`
	Count float64 `json:"count"`
}

// MarshalJSON writes {"le": "<bound>", "count": n} ("+Inf" for the last bucket).
func (b Bucket) MarshalJSON() ([]byte, error) {
	return json.Marshal(bucketJSON{formatBound(b.UpperBound), b.Count})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (b *Bucket) UnmarshalJSON(data []byte) error {
	var v bucketJSON
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	ub, err := strconv.ParseFloat(v.LE, 64)
	if err != nil {
		return fmt.Errorf("bucket le %q: %w", v.LE, err)
	}
	b.UpperBound, b.Count = ub, v.Count
	return nil
}

// formatBound writes a bucket bound as Prometheus' le label does.
func formatBound(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// HistogramQuantile estimates the q-quantile of a classic histogram from its cumulative
// buckets exactly as PromQL's histogram_quantile does: the buckets are sorted by bound,
// buckets with equal bounds merged, counts forced monotonic (after ignoring relative
// float-precision decreases up to 1e-12); the rank q·total is located in the first bucket
// whose cumulative count reaches it and the value is interpolated linearly inside that
// bucket, whose lower bound is the previous bucket's bound, or 0 for the lowest bucket when
// its bound is positive (a lowest bound ≤ 0 is returned as is). A rank in the +Inf bucket
// returns the highest finite bound.
//
// Special cases, as PromQL: NaN for a NaN q, fewer than two buckets (after merging), a last
// bucket that is not +Inf, or no observations; −Inf for q < 0; +Inf for q > 1. Also NaN
// when a bound is NaN or the input is empty. buckets is not modified. Safe for concurrent use.
func HistogramQuantile(q float64, buckets []Bucket) float64 {
	switch {
	case math.IsNaN(q):
		return math.NaN()
	case q < 0:
		return math.Inf(-1)
	case q > 1:
		return math.Inf(1)
	case len(buckets) == 0:
		return math.NaN()
	}
	for _, b := range buckets {
		if math.IsNaN(b.UpperBound) {
			return math.NaN()
		}
	}
	bs := slices.Clone(buckets)
	slices.SortStableFunc(bs, func(a, b Bucket) int { return cmp.Compare(a.UpperBound, b.UpperBound) })
	if !math.IsInf(bs[len(bs)-1].UpperBound, 1) {
		return math.NaN()
	}
	bs = coalesceBuckets(bs)
	ignoreSmallDecreases(bs, 1e-12)
	forceMonotonic(bs)
	if len(bs) < 2 {
		return math.NaN()
	}
	total := bs[len(bs)-1].Count
	if !(total > 0) { // zero, negative or NaN
		return math.NaN()
	}
	rank := q * total
	b := sort.Search(len(bs)-1, func(i int) bool { return bs[i].Count >= rank })
	if b == len(bs)-1 {
		return bs[len(bs)-2].UpperBound
	}
	if b == 0 && bs[0].UpperBound <= 0 {
		return bs[0].UpperBound
	}
	start, end, count := 0.0, bs[b].UpperBound, bs[b].Count
	if b > 0 {
		start = bs[b-1].UpperBound
		count -= bs[b-1].Count
		rank -= bs[b-1].Count
	}
	return start + (end-start)*(rank/count)
}

// coalesceBuckets merges sorted buckets with the same bound, adding their counts.
func coalesceBuckets(bs []Bucket) []Bucket {
	out := bs[:1]
	for _, b := range bs[1:] {
		if last := &out[len(out)-1]; b.UpperBound == last.UpperBound {
			last.Count += b.Count
		} else {
			out = append(out, b)
		}
	}
	return out
}

// ignoreSmallDecreases sets a count back to the previous one when they differ by a relative
// amount of at most tol (float precision noise from rate() or sums).
func ignoreSmallDecreases(bs []Bucket, tol float64) {
	prev := bs[0].Count
	for i := 1; i < len(bs); i++ {
		cur := bs[i].Count
		d := math.Abs(cur - prev)
		if d == 0 {
			continue
		}
		if d/cur <= tol {
			bs[i].Count = prev
		} else {
			prev = cur
		}
	}
}

// forceMonotonic replaces every count below its predecessor by the running maximum.
func forceMonotonic(bs []Bucket) {
	hi := bs[0].Count
	for i := 1; i < len(bs); i++ {
		if bs[i].Count > hi {
			hi = bs[i].Count
		} else {
			bs[i].Count = hi
		}
	}
}

// bucketIndex returns the index of the bucket of sorted bounds (the last one +Inf) that
// holds v: the first bound ≥ v (le semantics). It returns -1 for NaN.
func bucketIndex(v float64, bounds []float64) int {
	if math.IsNaN(v) {
		return -1
	}
	i, _ := slices.BinarySearch(bounds, v)
	return min(i, len(bounds)-1)
}

// bucketRange writes the interval of buckets lo..hi of sorted bounds as "(a, b]", with 0 as
// the lower edge of the lowest bucket.
func bucketRange(bounds []float64, lo, hi int) string {
	lo, hi = max(lo, 0), min(hi, len(bounds)-1)
	a := 0.0
	if lo > 0 {
		a = bounds[lo-1]
	}
	return "(" + formatBound(a) + ", " + formatBound(bounds[hi]) + "]"
}
