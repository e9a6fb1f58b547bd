package engine

import (
	"sync"
	"time"
)

// Retry-After bounds and the drain-rate windows (docs/design.md §2).
const (
	// MaxRetryAfter caps the Retry-After of a 429, in seconds: openai-node follows a
	// Retry-After below 60 s (openai-go up to 2 min) and falls back to its own short backoff
	// beyond.
	MaxRetryAfter = 59
	// DrainWindow is how far back the queue's drain rate is measured.
	DrainWindow = 10 * time.Second
	// DrainShortWindow is the recent window measured too: the rate is the higher of the two,
	// so finishes long before a burst (a quiet stretch inside DrainWindow) do not dilute the
	// rate the burst drains at.
	DrainShortWindow = 2 * time.Second
	// ColdRetryAfter is the Retry-After of a 429 before anything finished within DrainWindow
	// (nothing to measure): by then the rate is measured and the next answer says it.
	ColdRetryAfter = time.Second
	// WorkerRetryAfter is the Retry-After of a 503 while the worker is
	// unavailable: the engine re-probes it several times a second and
	// serves again within a second of its return.
	WorkerRetryAfter = 1
)

// drainMeter measures how fast the scheduler drains its queue: requests
// that finished after being admitted, per second, over the last
// DrainWindow and DrainShortWindow. A finished request frees the running slot
// a waiting one takes, so the queue's wait is its length over this rate. It
// also hands out the refused requests' retry times one after the other
// (retryAfter), so that they come back spread at the rate the queue drains.
// Safe for concurrent use; the zero value is ready.
type drainMeter struct {
	mu    sync.Mutex
	first time.Time   // the first finish ever observed
	ends  []time.Time // finishes within the window, oldest first
	next  time.Time   // the latest retry time handed out
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

// rate returns the finishes per second before now: the higher of the rate
// over DrainWindow and over DrainShortWindow (each over the time since the
// first finish when that is shorter, at least 1 s); 0 when nothing
// finished within DrainWindow.
func (d *drainMeter) rate(now time.Time) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rateLocked(now)
}

func (d *drainMeter) rateLocked(now time.Time) float64 {
	d.trim(now)
	if len(d.ends) == 0 {
		return 0
	}
	since := now.Sub(d.first)
	long := float64(len(d.ends)) / max(min(DrainWindow, since), time.Second).Seconds()
	recent := 0
	for i := len(d.ends) - 1; i >= 0 && now.Sub(d.ends[i]) <= DrainShortWindow; i-- {
		recent++
	}
	short := float64(recent) / max(min(DrainShortWindow, since), time.Second).Seconds()
	return max(long, short)
}

// retryAfter is the wait to tell a request refused at now because waiting
// requests fill the queue: the time the queue in front of it takes to drain
// at the measured rate, the requests refused before it (whose times it
// handed out) coming back first, one per 1/rate; at most MaxRetryAfter s,
// ColdRetryAfter when nothing finished within DrainWindow.
func (d *drainMeter) retryAfter(waiting int, now time.Time) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.rateLocked(now)
	if r <= 0 {
		return ColdRetryAfter
	}
	step := time.Duration(float64(time.Second) / r)
	at := now.Add(time.Duration(float64(waiting) / r * float64(time.Second)))
	if d.next.After(at) {
		at = d.next
	}
	at = at.Add(step)
	if limit := now.Add(MaxRetryAfter * time.Second); at.After(limit) {
		at = limit
	}
	d.next = at
	return at.Sub(now)
}
