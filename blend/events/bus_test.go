package events

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// recorder is a subscriber that keeps what it receives (used from the drain
// goroutine; read after Shutdown, or under mu).
type recorder struct {
	mu  sync.Mutex
	evs []Event
}

func (r *recorder) HandleEvent(ev Event) {
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
}

func (r *recorder) events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.evs...)
}

func TestEventTypeNames(t *testing.T) {
	for ty := Invalid + 1; ty < numEventTypes; ty++ {
		got, err := ParseEventType(ty.String())
		if err != nil || got != ty {
			t.Errorf("ParseEventType(%q) = %v, %v; want %v", ty.String(), got, err, ty)
		}
	}
	tests := []struct {
		ty         EventType
		name       string
		start, end bool
		pair       EventType
	}{
		{LookupStart, "CB_LOOKUP_START", true, false, LookupEnd},
		{LookupEnd, "CB_LOOKUP_END", false, true, LookupStart},
		{PrefixLookupEnd, "CB_PREFIX_LOOKUP_END", false, true, PrefixLookupStart},
		{L2LoadTaskStart, "L2_LOAD_TASK_START", true, false, L2LoadTaskEnd},
		{ScatterEnd, "CB_SCATTER_END", false, true, ScatterStart},
		{StoreStart, "CB_STORE_START", true, false, StoreEnd},
		{Tick, "TICK", false, false, Invalid},
		{Invalid, "INVALID", false, false, Invalid},
		{EventType(200), "EventType(200)", false, false, Invalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.ty.String(); got != tc.name {
				t.Errorf("String() = %q, want %q", got, tc.name)
			}
			if tc.ty.IsStart() != tc.start || tc.ty.IsEnd() != tc.end || tc.ty.Pair() != tc.pair {
				t.Errorf("IsStart %v IsEnd %v Pair %v; want %v %v %v",
					tc.ty.IsStart(), tc.ty.IsEnd(), tc.ty.Pair(), tc.start, tc.end, tc.pair)
			}
		})
	}
	if _, err := ParseEventType("CB_NOPE"); !errors.Is(err, ErrUnknownEventType) {
		t.Errorf("ParseEventType(unknown) error = %v, want ErrUnknownEventType", err)
	}
}

func TestBusDeliversByTypeInOrder(t *testing.T) {
	b := NewBus(Config{QueueSize: 16})
	var lookups, all recorder
	if err := b.Subscribe(&lookups, LookupStart, LookupEnd); err != nil {
		t.Fatal(err)
	}
	if err := b.Subscribe(&all, RetrieveStart, RetrieveEnd, LookupStart, LookupEnd); err != nil {
		t.Fatal(err)
	}
	seq := []EventType{LookupStart, RetrieveStart, LookupEnd, RetrieveEnd, ScatterStart}
	for i, ty := range seq {
		if !b.Publish(Event{Type: ty, RequestID: "r", CopyID: uint64(i)}) {
			t.Fatalf("Publish(%v) refused", ty)
		}
	}
	b.Start()
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := typesOf(lookups.events()); !equalTypes(got, []EventType{LookupStart, LookupEnd}) {
		t.Errorf("lookup subscriber got %v", got)
	}
	if got := typesOf(all.events()); !equalTypes(got, seq[:4]) {
		t.Errorf("second subscriber got %v, want %v", got, seq[:4])
	}
	if b.Published() != 5 || b.Dropped() != 0 {
		t.Errorf("Published %d Dropped %d, want 5 0", b.Published(), b.Dropped())
	}
}

func TestBusFullDropsWithoutBlocking(t *testing.T) {
	b := NewBus(Config{QueueSize: 2})
	entered := make(chan struct{})
	release := make(chan struct{})
	var mu sync.Mutex
	delivered := 0
	first := true
	err := b.Subscribe(SubscriberFunc(func(Event) {
		mu.Lock()
		block := first
		first = false
		delivered++
		mu.Unlock()
		if block {
			close(entered)
			<-release
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	b.Start()
	if !b.Publish(Event{Type: LookupStart, RequestID: "a"}) {
		t.Fatal("first Publish refused")
	}
	<-entered // the drain goroutine is stuck in the subscriber; the queue is empty
	for i := range 2 {
		if !b.Publish(Event{Type: LookupStart, RequestID: "b", CopyID: uint64(i)}) {
			t.Fatalf("Publish %d into a queue with room refused", i)
		}
	}
	for range 3 {
		if b.Publish(Event{Type: LookupEnd, RequestID: "c"}) {
			t.Fatal("Publish into a full queue accepted")
		}
	}
	if b.Dropped() != 3 || b.Published() != 3 || b.Len() != 2 {
		t.Errorf("Dropped %d Published %d Len %d, want 3 3 2", b.Dropped(), b.Published(), b.Len())
	}
	close(release)
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if delivered != 3 {
		t.Errorf("delivered %d events, want 3", delivered)
	}
}

func TestBusShutdownDrainsAndRefusesAfter(t *testing.T) {
	b := NewBus(Config{})
	if b.Cap() != DefaultQueueSize {
		t.Errorf("Cap() = %d, want %d", b.Cap(), DefaultQueueSize)
	}
	var rec recorder
	if err := b.Subscribe(&rec, ScatterEnd); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	for i := range n {
		b.Publish(Event{Type: ScatterEnd, RequestID: "r", CopyID: uint64(i)})
	}
	// Never started: Shutdown starts the goroutine and still delivers.
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	evs := rec.events()
	if len(evs) != n {
		t.Fatalf("delivered %d, want %d", len(evs), n)
	}
	for i, ev := range evs {
		if ev.CopyID != uint64(i) {
			t.Fatalf("event %d has CopyID %d: order lost", i, ev.CopyID)
		}
	}
	if b.Publish(Event{Type: ScatterEnd, RequestID: "late"}) {
		t.Error("Publish after Shutdown accepted")
	}
	if b.Dropped() != 1 {
		t.Errorf("Dropped = %d, want 1", b.Dropped())
	}
	if err := b.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
	b.Start() // no-op after Shutdown
}

func TestBusShutdownContextExpired(t *testing.T) {
	b := NewBus(Config{QueueSize: 8})
	entered := make(chan struct{})
	release := make(chan struct{})
	delivered := 0
	err := b.Subscribe(SubscriberFunc(func(Event) {
		delivered++
		if delivered == 1 {
			close(entered)
			<-release
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	b.Start()
	for range 5 {
		b.Publish(Event{Type: RetrieveStart, RequestID: "r"})
	}
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errc := make(chan error, 1)
	go func() { errc <- b.Shutdown(ctx) }()
	<-b.abort // Shutdown gave up waiting; the subscriber call still runs
	close(release)
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown error = %v, want context.Canceled", err)
	}
	if delivered != 1 || b.Dropped() != 4 {
		t.Errorf("delivered %d dropped %d, want 1 4", delivered, b.Dropped())
	}
}

func TestBusInvalidInput(t *testing.T) {
	b := NewBus(Config{QueueSize: 1})
	tests := []struct {
		name  string
		sub   Subscriber
		types []EventType
	}{
		{"nil subscriber", nil, nil},
		{"invalid type", &recorder{}, []EventType{Invalid}},
		{"out of range type", &recorder{}, []EventType{LookupStart, EventType(99)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := b.Subscribe(tc.sub, tc.types...); err == nil {
				t.Error("Subscribe accepted bad input")
			}
		})
	}
	if b.Publish(Event{Type: Invalid}) || b.Publish(Event{Type: EventType(77)}) {
		t.Error("Publish accepted an invalid type")
	}
	if b.Dropped() != 2 || b.Published() != 0 {
		t.Errorf("Dropped %d Published %d, want 2 0", b.Dropped(), b.Published())
	}
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestBusStampsZeroTimeAndTicks(t *testing.T) {
	b := NewBus(Config{TickInterval: time.Millisecond})
	ticks := make(chan Event, 1)
	var rec recorder
	if err := b.Subscribe(SubscriberFunc(func(ev Event) {
		select {
		case ticks <- ev:
		default:
		}
	}), Tick); err != nil {
		t.Fatal(err)
	}
	if err := b.Subscribe(&rec, LookupStart); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	b.Publish(Event{Type: LookupStart, RequestID: "r"})
	b.Start()
	tick := <-ticks
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tick.Type != Tick || tick.Time.Before(before) {
		t.Errorf("tick = %v at %v, want a Tick after %v", tick.Type, tick.Time, before)
	}
	evs := rec.events()
	if len(evs) != 1 || evs[0].Time.Before(before) {
		t.Errorf("zero Time not stamped: %+v", evs)
	}
}

func TestBusConcurrentPublish(t *testing.T) {
	b := NewBus(Config{QueueSize: 64})
	count := 0
	if err := b.Subscribe(SubscriberFunc(func(Event) { count++ }), ScatterStart); err != nil {
		t.Fatal(err)
	}
	b.Start()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				b.Publish(Event{Type: ScatterStart, RequestID: "r", CopyID: uint64(g*10000 + i)})
			}
		}()
	}
	// Subscribe while publishing: copy-on-write must be race free.
	if err := b.Subscribe(SubscriberFunc(func(Event) {}), ScatterStart); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := b.Published() + b.Dropped(); got != 8000 {
		t.Errorf("Published+Dropped = %d, want 8000", got)
	}
	if uint64(count) != b.Published() {
		t.Errorf("delivered %d, published %d", count, b.Published())
	}
}

func typesOf(evs []Event) []EventType {
	out := make([]EventType, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

func equalTypes(a, b []EventType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
