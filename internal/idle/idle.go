package idle

import (
	"io"
	"sync/atomic"
	"time"
)

// Activity is the time of the last byte received from an upstream
// (response headers included, when the caller touches it for them). The
// zero value has seen no byte. Safe for concurrent use.
type Activity struct {
	last atomic.Int64 // unix nanoseconds; 0: none yet
}

// Touch records a byte received now.
func (a *Activity) Touch() { a.last.Store(time.Now().UnixNano()) }

// Last returns the time of the last byte; ok is false before the first.
func (a *Activity) Last() (t time.Time, ok bool) {
	l := a.last.Load()
	return time.Unix(0, l), l != 0
}

// Stalled reports whether no byte arrived within window before now (none
// at all: stalled).
func (a *Activity) Stalled(now time.Time, window time.Duration) bool {
	t, ok := a.Last()
	return !ok || now.Sub(t) >= window
}

// Body returns rc with every read that returned bytes recorded in a.
func Body(rc io.ReadCloser, a *Activity) io.ReadCloser { return &body{ReadCloser: rc, a: a} }

type body struct {
	io.ReadCloser
	a *Activity
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.a.Touch()
	}
	return n, err
}

// Watch calls cut once when no byte was recorded in a for d, counted from
// the call until the first byte, then from the last one. The returned stop
// ends the watch and waits for its goroutine; call it once.
func Watch(d time.Duration, a *Activity, cut func()) (stop func()) {
	start := time.Now()
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTimer(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				at := start
				if l, ok := a.Last(); ok {
					at = l
				}
				if left := d - now.Sub(at); left > 0 {
					t.Reset(left)
					continue
				}
				cut()
				return
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}
