package engine

import (
	"testing"
	"time"
)

func TestDrainMeter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name     string
		finishes []int // ms after t0
		now      int
		want     float64
	}{
		{"nothing", nil, 0, 0},
		{"one burst counts over a second", []int{0, 1, 2, 3}, 10, 4},
		{"steady 10/s (the last 2 s: 21 finishes)", seq(0, 20000, 100), 20000, 10.5},
		{"old finishes age out", []int{0, 100, 200}, 20000, 0},
		{"young history: rate over its age", seq(0, 2000, 100), 2000, 10.5},
		// Issue 27: a few finishes, a quiet stretch, then a flood draining at 120/s:
		// the 10 s window says 25/s, the recent one the flood's rate.
		{"flood after a quiet stretch", append([]int{0, 500, 1000}, seq(8000, 10000, 8)...), 10000, 125.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d drainMeter
			for _, f := range tc.finishes {
				d.finished(at(f))
			}
			if got := d.rate(at(tc.now)); got != tc.want {
				t.Fatalf("rate %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDrainMeterRetryAfter: the refused requests' waits: the queue ahead
// drained at the measured rate, each refused request one slot after the one
// before; 1 s on a cold start; capped.
func TestDrainMeterRetryAfter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	steady := func(d *drainMeter, perSec int) { // finishes at perSec over the 12 s before t0
		gap := time.Second / time.Duration(perSec)
		for i := 12*perSec - 1; i >= 0; i-- {
			d.finished(t0.Add(-gap/2 - time.Duration(i)*gap))
		}
	}
	for _, tc := range []struct {
		name    string
		perSec  int   // steady drain rate before t0; 0: nothing finished (cold)
		waiting []int // the queue at each refusal, all at t0
		want    []time.Duration
	}{
		{"cold start: 1 s each", 0, []int{256, 256}, []time.Duration{time.Second, time.Second}},
		{"steady drain: the queue, then one slot per refusal", 100, []int{256, 256, 256},
			[]time.Duration{2570 * time.Millisecond, 2580 * time.Millisecond, 2590 * time.Millisecond}},
		{"empty queue: one slot", 100, []int{0}, []time.Duration{10 * time.Millisecond}},
		{"slow drain: capped", 1, []int{256}, []time.Duration{MaxRetryAfter * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d drainMeter
			if tc.perSec > 0 {
				steady(&d, tc.perSec)
			}
			for i, w := range tc.waiting {
				got := d.retryAfter(w, t0)
				if diff := got - tc.want[i]; diff < -time.Millisecond || diff > time.Millisecond {
					t.Fatalf("refusal %d: wait %v, want %v", i, got, tc.want[i])
				}
			}
		})
	}
}

// seq lists from, from+step, ... up to to (inclusive).
func seq(from, to, step int) []int {
	var out []int
	for v := from; v <= to; v += step {
		out = append(out, v)
	}
	return out
}
