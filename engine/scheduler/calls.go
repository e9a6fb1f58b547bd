package scheduler

import (
	"context"
	"sync"
	"time"
)

// calls runs one kind of asynchronous call the step loop waits on (a
// request's Lookup, a Prefilled request's KV pull): at most limit in
// flight, each on a goroutine of its own, whose outcome comes back to the
// loop on a channel it drains. A call's context also ends when the loop's
// does (Shutdown); Shutdown then waits for every call (wait). inFlight is
// guarded by Scheduler.mu.
type calls[T any] struct {
	limit, inFlight int
	done            chan outcome[T] // capacity limit: a call never blocks on it
	wg              sync.WaitGroup
	loop            context.Context
	poke            func()
}

// outcome is a finished call made for request sq.
type outcome[T any] struct {
	sq  *seq
	val T
	err error
	at  time.Time // when the call returned
}

func newCalls[T any](limit int, loop context.Context, poke func()) *calls[T] {
	return &calls[T]{limit: limit, done: make(chan outcome[T], limit), loop: loop, poke: poke}
}

// free reports whether another call may start.
func (c *calls[T]) free() bool { return c.inFlight < c.limit }

// start runs call for sq on a goroutine of its own, with a context derived
// from ctx that ends with the loop's or through the returned cancel. The
// caller checks free first: the outcome channel has room for limit calls.
func (c *calls[T]) start(ctx context.Context, sq *seq, call func(context.Context) (T, error)) context.CancelFunc {
	c.inFlight++
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.loop, cancel)
	c.wg.Go(func() {
		v, err := call(ctx)
		stop()
		cancel()
		c.done <- outcome[T]{sq: sq, val: v, err: err, at: time.Now()}
		c.poke()
	})
	return cancel
}

// drain hands every finished call to fold, in the order they finished.
func (c *calls[T]) drain(fold func(outcome[T])) {
	for {
		select {
		case o := <-c.done:
			c.inFlight--
			fold(o)
		default:
			return
		}
	}
}

// wait returns once every call started returned.
func (c *calls[T]) wait() { c.wg.Wait() }
