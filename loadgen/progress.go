package loadgen

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// progressEvery is the progress bar's redraw interval.
const progressEvery = 250 * time.Millisecond

// startProgress draws a one-line progress bar on cfg.Progress until the returned function is
// called; that function draws the final state, ends the line and waits for the drawing
// goroutine to exit. Without a Progress writer it does nothing.
func (r *runner) startProgress() (stop func()) {
	w := r.cfg.Progress
	if w == nil {
		return func() {}
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				fmt.Fprintf(w, "\r%s\n", r.progressLine())
				return
			case <-t.C:
				fmt.Fprintf(w, "\r%s", r.progressLine())
			}
		}
	})
	return func() {
		close(quit)
		wg.Wait()
	}
}

// progressLine renders the bar (the larger of the request and time fractions), padded so a
// shorter line overwrites a longer one.
func (r *runner) progressLine() string {
	const width = 30
	el := time.Since(r.start)
	done := r.done.Load()
	frac := max(float64(done)/float64(r.cfg.Requests), min(1, el.Seconds()/r.cfg.Duration.Seconds()))
	fill := min(width, int(frac*width))
	return fmt.Sprintf("%-100s", fmt.Sprintf("[%s%s] %d/%d done  %d failed  %d in flight  %.1fs/%.0fs",
		strings.Repeat("#", fill), strings.Repeat(".", width-fill), done, r.cfg.Requests,
		r.failed.Load(), r.inflight.Load(), el.Seconds(), r.cfg.Duration.Seconds()))
}
