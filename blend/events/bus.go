package events

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Default bus settings.
const (
	DefaultQueueSize    = 4096
	DefaultTickInterval = time.Second
)

// Config holds the optional settings of a [Bus]. The zero value is valid.
type Config struct {
	// QueueSize bounds the number of events waiting for the drain
	// goroutine; a Publish to a full queue drops the event. Default (zero or
	// negative) 4096.
	QueueSize int
	// TickInterval is how often the drain goroutine delivers a [Tick] event
	// to the subscribers registered for it. Default (zero or negative) 1 s.
	TickInterval time.Duration
}

// Subscriber receives events from a [Bus]. HandleEvent is called only from
// the bus's drain goroutine, one event at a time, so an implementation needs
// no locks for state it keeps to itself. It must not block for long: while it
// runs the queue fills and further events are dropped. It must not call
// [Bus.Shutdown] of the bus that delivers to it.
type Subscriber interface {
	HandleEvent(ev Event)
}

// SubscriberFunc adapts a function to [Subscriber].
type SubscriberFunc func(ev Event)

// HandleEvent calls f(ev).
func (f SubscriberFunc) HandleEvent(ev Event) { f(ev) }

// Bus is a bounded event queue with one drain goroutine that delivers each
// event to the subscribers registered for its type, in publication order per
// publisher. Publish never blocks. All methods are safe for concurrent use.
//
// Lifecycle: NewBus, Subscribe, Start, Publish…, Shutdown. Events published
// before Start wait in the queue. Subscribe may also be called after Start.
type Bus struct {
	queue    chan Event
	interval time.Duration

	subs  atomic.Pointer[subTable]
	subMu sync.Mutex // serializes Subscribe's copy-on-write

	mu      sync.RWMutex // Publish holds it shared; Shutdown takes it to stop sends
	stopped bool

	published atomic.Uint64
	dropped   atomic.Uint64

	startOnce sync.Once
	stopOnce  sync.Once
	quit      chan struct{} // closed by Shutdown: drain what is queued, then exit
	abort     chan struct{} // closed when Shutdown's ctx expires: drop the rest
	done      chan struct{} // closed when the drain goroutine exits
	abortOnce sync.Once
}

type subTable [numEventTypes][]Subscriber

// NewBus returns a bus with the settings of cfg (zero values take the
// defaults). Call Start to begin delivery and Shutdown to stop it.
func NewBus(cfg Config) *Bus {
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = DefaultTickInterval
	}
	b := &Bus{
		queue:    make(chan Event, cfg.QueueSize),
		interval: cfg.TickInterval,
		quit:     make(chan struct{}),
		abort:    make(chan struct{}),
		done:     make(chan struct{}),
	}
	b.subs.Store(new(subTable))
	return b
}

// Subscribe registers s for the given event types, or for every type
// ([Tick] included) when none is given. A subscriber registered twice for a
// type receives its events twice. An undefined type is an error wrapping
// [ErrUnknownEventType], and nothing is registered.
func (b *Bus) Subscribe(s Subscriber, types ...EventType) error {
	if s == nil {
		return fmt.Errorf("subscribe: nil subscriber")
	}
	for _, t := range types {
		if !t.Valid() {
			return fmt.Errorf("subscribe to %v: %w", t, ErrUnknownEventType)
		}
	}
	if len(types) == 0 {
		for t := Invalid + 1; t < numEventTypes; t++ {
			types = append(types, t)
		}
	}
	b.subMu.Lock()
	defer b.subMu.Unlock()
	next := *b.subs.Load() // copy the table; the drain goroutine may be reading the old one
	for _, t := range types {
		next[t] = append(next[t][:len(next[t]):len(next[t])], s)
	}
	b.subs.Store(&next)
	return nil
}

// Publish queues ev for delivery and reports whether it was accepted. It
// never blocks: when the queue is full, when ev.Type is not a defined type,
// or after Shutdown began, the event is dropped, counted by Dropped, and
// Publish returns false. A zero ev.Time is set to time.Now().
func (b *Bus) Publish(ev Event) bool {
	if !ev.Type.Valid() {
		b.dropped.Add(1)
		return false
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	b.mu.RLock()
	if b.stopped {
		b.mu.RUnlock()
		b.dropped.Add(1)
		return false
	}
	select {
	case b.queue <- ev:
		b.mu.RUnlock()
		b.published.Add(1)
		return true
	default:
		b.mu.RUnlock()
		b.dropped.Add(1)
		return false
	}
}

// Published returns how many events Publish accepted. It is monotonic.
func (b *Bus) Published() uint64 { return b.published.Load() }

// Dropped returns how many events were dropped: refused by Publish (queue
// full, invalid type, bus shut down) or discarded undelivered when
// Shutdown's context expired. It is monotonic.
func (b *Bus) Dropped() uint64 { return b.dropped.Load() }

// Len returns the number of events waiting in the queue.
func (b *Bus) Len() int { return len(b.queue) }

// Cap returns the queue's capacity (Config.QueueSize).
func (b *Bus) Cap() int { return cap(b.queue) }

// Start starts the drain goroutine. It is idempotent; after Shutdown it does
// nothing.
func (b *Bus) Start() {
	b.startOnce.Do(func() { go b.run() })
}

// Shutdown stops accepting events, lets the drain goroutine deliver every
// event already queued, and waits for it to exit. If ctx ends first, the
// events not yet delivered are discarded (and counted as dropped), and
// Shutdown returns an error wrapping ctx.Err() as soon as the subscriber call
// in progress, if any, returns. Shutdown on a bus that was never started
// starts it so that queued events are still delivered. Later calls wait the
// same way and return nil once the goroutine has exited.
func (b *Bus) Shutdown(ctx context.Context) error {
	b.Start()
	b.stopOnce.Do(func() {
		b.mu.Lock() // waits for Publish calls in progress; none can send afterwards
		b.stopped = true
		b.mu.Unlock()
		close(b.quit)
	})
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
	}
	b.abortOnce.Do(func() { close(b.abort) })
	<-b.done
	return fmt.Errorf("event bus shutdown: %w", ctx.Err())
}

// run is the drain goroutine: it delivers queued events and ticks until
// Shutdown, then delivers what is left and exits.
func (b *Bus) run() {
	defer close(b.done)
	ticker := time.NewTicker(b.interval)
	defer ticker.Stop()
	for {
		// Shutdown takes precedence over the queue, so that once its context
		// expires nothing more is delivered than the call in progress.
		select {
		case <-b.quit:
			b.drain()
			return
		default:
		}
		select {
		case ev := <-b.queue:
			b.dispatch(ev)
		case now := <-ticker.C:
			b.dispatch(Event{Type: Tick, Time: now})
		case <-b.quit:
			b.drain()
			return
		}
	}
}

// drain delivers the events left in the queue; no Publish can add any now.
func (b *Bus) drain() {
	for {
		select {
		case <-b.abort:
			b.dropped.Add(uint64(len(b.queue)))
			return
		default:
		}
		select {
		case ev := <-b.queue:
			b.dispatch(ev)
		default:
			return
		}
	}
}

func (b *Bus) dispatch(ev Event) {
	for _, s := range b.subs.Load()[ev.Type] {
		s.HandleEvent(ev)
	}
}
