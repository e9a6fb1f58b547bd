package blend

import (
	"context"
	"sync"
	"time"
)

// maxArrivals is how many store request ids arrivals remembers: the last
// this many rank-0 stores (and ids lookups waited for), about 100 KiB.
const maxArrivals = 4096

// arrivals records which rank-0 stores reached this server, by request id,
// so that a lookup can wait for the stores its engine started that have not
// arrived yet (LookupRequest.pending_store_ids): a worker sends a prompt's
// store from a goroutine after the prefill, and the next request of a
// client that got its answer can overtake it. A store arrives once its
// store in flight is begun (inflight.begin), or once its RPC ends without
// one (refused, or a rank-0 store with nothing to store). It remembers the
// last maxArrivals ids; a lookup waiting for an id evicted meanwhile waits
// until its bound. Safe for concurrent use.
type arrivals struct {
	mu   sync.Mutex
	ids  map[string]chan struct{} // closed once the id's store arrived
	ring [maxArrivals]string      // the ids in ids, oldest at next
	next int
}

// entry returns id's channel, creating it (and evicting the oldest id) if
// it is not known. Called with a.mu held.
func (a *arrivals) entry(id string) chan struct{} {
	if ch, ok := a.ids[id]; ok {
		return ch
	}
	if a.ids == nil {
		a.ids = make(map[string]chan struct{})
	}
	if old := a.ring[a.next]; old != "" {
		delete(a.ids, old)
	}
	ch := make(chan struct{})
	a.ids[id], a.ring[a.next] = ch, id
	a.next = (a.next + 1) % maxArrivals
	return ch
}

// arrived records the store of request id as arrived. Idempotent.
func (a *arrivals) arrived(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ch := a.entry(id); !isClosed(ch) {
		close(ch)
	}
}

// wait waits until the stores of ids have all arrived, the timer fires or
// ctx ends, and returns how many had not arrived then.
func (a *arrivals) wait(ctx context.Context, ids []string, timer <-chan time.Time) int {
	if len(ids) == 0 {
		return 0
	}
	chans := make([]chan struct{}, len(ids))
	a.mu.Lock()
	for i, id := range ids {
		chans[i] = a.entry(id)
	}
	a.mu.Unlock()
	waitClosed(ctx, timer, chans)
	n := 0
	for _, ch := range chans {
		if !isClosed(ch) {
			n++
		}
	}
	return n
}

// waitClosed waits until every channel of chans is closed, the timer fires
// or ctx ends.
func waitClosed(ctx context.Context, timer <-chan time.Time, chans []chan struct{}) {
	for _, ch := range chans {
		select {
		case <-ch:
		case <-timer:
			return
		case <-ctx.Done():
			return
		}
	}
}

// isClosed reports whether ch is closed (a channel that is only closed,
// never sent on).
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
