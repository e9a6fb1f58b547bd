package engine

import (
	"math"
	"sync"
	"time"
)

// Retry-After bounds and the drain-rate window (docs/design.md §2).
const (
	// MaxRetryAfter caps the Retry-After of a 429, in seconds.
	MaxRetryAfter = 60
	// DrainWindow is how far back the queue's drain rate is measured.
	DrainWindow = 10 * time.Second
	// WorkerRetryAfter is the Retry-After of a 503 while the worker is
	// unavailable: the engine re-probes it several times a second and
	// serves again within a second of its return.
	WorkerRetryAfter = 1
)

// drainMeter measures how fast the scheduler drains its queue: requests
// that finished after being admitted, per second, over the last
// DrainWindow. A finished request frees the running slot a waiting one
// takes, so the queue's wait is its length over this rate. Safe for
// concurrent use; the zero value is ready.
type drainMeter struct {
	mu    sync.Mutex
	first time.Time   // the first finish ever observed
	ends  []time.Time // finishes within the window, oldest first
}

// finished records a request that left the scheduler at t.
func (d *drainMeter) finished(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.first.IsZero() {
		d.first = t
	}
	d.ends = append(d.ends, t)
	d.trim(t)
}

// trim drops the finishes older than the window before now (callers hold mu).
func (d *drainMeter) trim(now time.Time) {
	i := 0
	for i < len(d.ends) && now.Sub(d.ends[i]) > DrainWindow {
		i++
	}
	if i > 0 {
		d.ends = append(d.ends[:0], d.ends[i:]...)
	}
}

// rate returns the finishes per second over the window before now (over
// the time since the first finish when that is shorter than the window); 0
// when nothing finished within it.
func (d *drainMeter) rate(now time.Time) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.trim(now)
	if len(d.ends) == 0 {
		return 0
	}
	span := min(DrainWindow, now.Sub(d.first))
	span = max(span, time.Second) // a single burst does not make an infinite rate
	return float64(len(d.ends)) / span.Seconds()
}

// queueRetryAfter is the Retry-After, in seconds, of a request refused
// because waiting requests fill the queue that drains at rate requests per
// second: the time the queue in front of it takes to drain, at least 1 and
// at most MaxRetryAfter; DrainWindow when nothing drained within it.
func queueRetryAfter(waiting int, rate float64) int {
	if rate <= 0 {
		return int(DrainWindow / time.Second)
	}
	secs := math.Ceil(float64(waiting) / rate)
	return int(min(max(secs, 1), MaxRetryAfter))
}
