package gateway

import (
	"container/list"
	"context"
	"errors"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cacheblend/cacheblend/internal/idle"
)

// Errors of pool.acquire.
var (
	// errNoEngine: no engine is healthy (or every healthy one failed this request already).
	errNoEngine = errors.New("gateway: no engine can serve the request")
	// errQueueFull: the queue of waiting requests is full.
	errQueueFull = errors.New("gateway: queue full")
	// errQueueTimeout: the request waited QueueTimeout without a free engine slot.
	errQueueTimeout = errors.New("gateway: no engine slot within the queue timeout")
	// errEngineDown cuts the stalled attempts whose response has not begun on an engine taken
	// out of routing: they fail over.
	errEngineDown = errors.New("gateway: the engine was taken out of routing")
)

// upstream is one engine. Its fields after mu are guarded by the pool's mutex.
type upstream struct {
	i     int
	url   string // base URL
	name  string // host:port, the route.engine attribute and the engine label
	index *reuseIndex

	up       bool
	checked  bool // a health check has completed
	fails    int  // consecutive failed health probes
	reason   string
	gauges   engineGauges
	gwAtPoll int // the gateway's in-flight units when the gauges were read
	inFlight int // requests the gateway has in flight on the engine
	units    int // the engine requests they make (a document ingest makes one per document)
	recent   float64
	recentAt time.Time
	placed   int                    // new prompt tokens routed to the engine, a running total
	placedAt int                    // placed when the probe that read the gauges began
	pending  map[*progress]struct{} // attempts whose response has not begun
}

// progress is one attempt's upstream activity (the time of the last byte received from the
// engine, response headers included) and the cut of the attempt. Safe for concurrent use.
type progress struct {
	idle.Activity
	cancel context.CancelCauseFunc
}

func newUpstream(i int, base string, idx *reuseIndex) *upstream {
	name := base
	if u, err := url.Parse(base); err == nil && u.Host != "" {
		name = u.Host
	}
	return &upstream{i: i, url: base, name: name, index: idx}
}

// candidate returns the engine as a policy sees it (pool lock held).
func (u *upstream) candidate(now time.Time, hits int) Candidate {
	c := Candidate{Name: u.name, URL: u.url, InFlight: u.inFlight, ExpectedHitTokens: hits, Recent: u.decayed(now)}
	if g := u.gauges; g.Has {
		c.Waiting, c.Running = g.Waiting, g.Running
		if g.KVPool > 0 {
			c.KVUsed = math.Min(1, float64(g.KVUsed)/float64(g.KVPool))
		}
	}
	c.Load, c.KVHeld = u.load(), u.kvHeld()
	return c
}

// Assumptions of kvHeld: the tokens of a KV block (the stack's block size), and the pool of
// an engine that reported none.
const (
	kvBlockTokens     = 16
	nominalPoolBlocks = 4096
)

// kvHeld is the share of the engine's KV pool that holds KV (pool lock held): its used and
// cached blocks at its last gauges, plus the new prompt tokens routed there since the probe
// that read them.
func (u *upstream) kvHeld() float64 {
	held, pool := float64(u.placed-u.placedAt)/kvBlockTokens, nominalPoolBlocks
	if g := u.gauges; g.Has {
		held += float64(g.KVUsed + g.KVCached)
		if g.KVPool > 0 {
			pool = g.KVPool
		}
	}
	return held / float64(pool)
}

// load is the load the policies compare (pool lock held): the gateway's in-flight requests
// plus those the engine reported that were not the gateway's (its waiting and running requests
// beyond the engine requests the gateway had in flight when they were read), plus the used KV
// fraction.
func (u *upstream) load() float64 {
	l := float64(u.units)
	if g := u.gauges; g.Has {
		l += float64(max(0, g.Waiting+g.Running-u.gwAtPoll))
		if g.KVPool > 0 {
			l += math.Min(1, float64(g.KVUsed)/float64(g.KVPool))
		}
	}
	return l
}

// decayed returns the recent-requests count decayed to now (pool lock held).
func (u *upstream) decayed(now time.Time) float64 {
	if u.recentAt.IsZero() {
		return 0
	}
	return u.recent * math.Pow(decay, now.Sub(u.recentAt).Seconds())
}

// lease is a slot on an engine held by one attempt; release it once.
type lease struct {
	u        *upstream
	units    int
	decision Decision
	cand     Candidate
	all      []Candidate // every candidate of the decision
	waited   time.Duration
	once     sync.Once
}

// routeJob is one request asking for a slot.
type routeJob struct {
	units   int // engine requests it makes (documents: one per document), at least 1
	req     *RouteRequest
	hits    []int        // expected hit tokens per engine
	exclude map[int]bool // engines that failed this request
	// handOver: a generation request with prefill/decode routing, which also takes a decode
	// engine.
	handOver bool
}

// waiter is a queued routeJob.
type waiter struct {
	job   *routeJob
	ready chan struct{} // closed when lease or err is set
	lease *lease
	err   error
}

// pool holds the engines, their state, and the queue of requests waiting for a slot.
type pool struct {
	engines     []*upstream
	policy      Policy
	maxInFlight int
	maxQueue    int
	onQueue     func(n int) // reports the queue length after each change
	// failures is the number of consecutive failed probes that take an engine down (≤ 1: one);
	// stall is the window within which an attempt on an engine taken down must have received
	// a byte to be kept.
	failures int
	stall    time.Duration

	mu      sync.Mutex
	waiters list.List // of *waiter, oldest first
	seq     uint64
	closed  bool
	drain   drainClock   // the queue's measured drain rate
	resv    reservations // queue slots promised to refused requests (Retry-After)
}

// eligible reports whether engine u can take the job at all (healthy, not excluded); pool
// lock held.
func (p *pool) eligible(u *upstream, j *routeJob) bool { return u.up && !j.exclude[u.i] }

// anyEligible reports whether some engine is eligible for the job; pool lock held.
func (p *pool) anyEligible(j *routeJob) bool {
	for _, u := range p.engines {
		if p.eligible(u, j) {
			return true
		}
	}
	return false
}

// decide routes the job if an eligible engine has a free slot; pool lock held.
func (p *pool) decide(j *routeJob, now time.Time) *lease {
	cands := make([]Candidate, 0, len(p.engines))
	ups := make([]*upstream, 0, len(p.engines))
	for _, u := range p.engines {
		if p.eligible(u, j) && u.inFlight < p.maxInFlight {
			cands = append(cands, u.candidate(now, j.hits[u.i]))
			ups = append(ups, u)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	d := p.policy.Choose(j.req, cands, p.seq)
	p.seq++
	if d.Index < 0 || d.Index >= len(cands) {
		d.Index = 0
	}
	u := ups[d.Index]
	u.inFlight++
	u.units += max(1, j.units)
	u.recent = u.decayed(now) + 1
	u.recentAt = now
	u.placed += max(0, j.req.PromptTokens-j.hits[u.i])
	return &lease{u: u, units: max(1, j.units), decision: d, cand: cands[d.Index], all: cands}
}

// acquire returns a lease on an engine for the job: at once when an eligible engine has a free
// slot and nobody waits, else after waiting in the queue (FIFO) until one frees up, ctx ends
// (errQueueTimeout when its deadline passed, else ctx's error) or no engine is eligible any
// more (errNoEngine). A full queue is errQueueFull.
//
// A full queue is full for a new request once the slots promised to refused clients that are
// due take their room (reservations): a client's retry (retryTicket.retry) arriving when a
// promised slot is due claims it and is queued even over MaxQueue (the promise is kept; the
// promises are spaced at the drain rate and bounded by maxReservations). A refused request's
// ticket gets the wait the pool expects before a slot is free for it (reserve).
func (p *pool) acquire(ctx context.Context, j *routeJob) (*lease, error) {
	t0 := time.Now()
	tk := ticketFrom(ctx)
	p.mu.Lock()
	if p.closed || !p.anyEligible(j) {
		p.mu.Unlock()
		return nil, errNoEngine
	}
	p.resv.expire(t0)
	claimed := tk != nil && tk.retry && !tk.claimed && p.resv.claim(t0)
	if claimed {
		tk.claimed = true // one claim per request, failovers included
	}
	if p.waiters.Len() == 0 {
		if l := p.decide(j, t0); l != nil {
			p.mu.Unlock()
			return l, nil
		}
	}
	limit := p.maxQueue - p.resv.due(t0)
	if claimed {
		limit = p.maxQueue + maxReservations // the promised slot is kept
	}
	if p.waiters.Len() >= limit {
		wait := p.reserve(t0, tk != nil && tk.holds)
		if tk != nil {
			tk.wait = wait
		}
		p.mu.Unlock()
		return nil, errQueueFull
	}
	w := &waiter{job: j, ready: make(chan struct{})}
	el := p.waiters.PushBack(w)
	p.notifyQueue()
	p.mu.Unlock()

	select {
	case <-w.ready:
	case <-ctx.Done():
		p.mu.Lock()
		select {
		case <-w.ready: // granted meanwhile: keep it
		default:
			p.waiters.Remove(el)
			p.notifyQueue()
			w.err = errQueueTimeout
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				w.err = ctx.Err()
			}
		}
		p.mu.Unlock()
	}
	if w.lease != nil {
		w.lease.waited = time.Since(t0)
	}
	return w.lease, w.err
}

// release frees the lease's slot and hands it to the queue. Idempotent.
func (p *pool) release(l *lease) {
	l.once.Do(func() {
		p.mu.Lock()
		l.u.inFlight--
		l.u.units -= l.units
		if p.waiters.Len() > 0 {
			p.drain.released(time.Now()) // a slot freed with requests waiting: the queue drains
		}
		p.dispatch()
		p.mu.Unlock()
	})
}

// dispatch serves the queue in order while slots are free; waiters no engine can serve any
// more fail with errNoEngine. Pool lock held.
func (p *pool) dispatch() {
	now := time.Now()
	changed := false
	for el := p.waiters.Front(); el != nil; {
		w := el.Value.(*waiter)
		next := el.Next()
		switch {
		case p.closed || !p.anyEligible(w.job):
			w.err = errNoEngine
		default:
			if w.lease = p.decide(w.job, now); w.lease == nil {
				next = nil // FIFO: the head waits for the next free slot
			}
		}
		if w.lease != nil || w.err != nil {
			p.waiters.Remove(el)
			close(w.ready)
			changed = true
		}
		el = next
	}
	if changed {
		p.notifyQueue()
	}
}

// notifyQueue reports the queue length; pool lock held.
func (p *pool) notifyQueue() {
	p.drain.busy(p.waiters.Len() > 0, time.Now())
	if p.onQueue != nil {
		p.onQueue(p.waiters.Len())
	}
}

// placedMark returns u's running total of new prompt tokens routed to it, read before a probe
// of its gauges (for setHealth).
func (p *pool) placedMark(u *upstream) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return u.placed
}

// setHealth records the outcome of a health check (probe true) or of a failed attempt (probe
// false, up false) and serves the queue when an engine came up or went down; g, when not nil,
// are the gauges read by a probe that began at placed total mark. A failed attempt takes the
// engine down at once, failed probes after pool.failures in a row. While the engine is down,
// its attempts whose response has not begun and that received no byte within pool.stall are
// cut (errEngineDown: they fail over); the others keep going. It returns whether the state
// changed.
func (p *pool) setHealth(u *upstream, up, probe bool, reason string, g *engineGauges, mark int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if up {
		u.fails = 0
	} else if probe {
		u.fails++
		if u.up && u.checked && u.fails < p.failures {
			return false // not yet: one slow or failed probe does not take it out
		}
	}
	changed := u.up != up || !u.checked
	u.checked = true
	u.up, u.reason = up, reason
	if !up {
		now := time.Now()
		for pr := range u.pending {
			if pr.Stalled(now, p.stall) {
				pr.cancel(errEngineDown)
				delete(u.pending, pr)
			}
		}
	}
	if g != nil {
		u.gauges, u.gwAtPoll, u.placedAt = *g, u.units, mark
	}
	if changed {
		p.dispatch()
	}
	return changed
}

// track records an attempt on u whose response has not begun, to be cut (pr.cancel with
// errEngineDown) when u is out of routing and pr has stalled; the returned function forgets
// it (call it when the response begins, and at the latest when the attempt ends).
func (p *pool) track(u *upstream, pr *progress) (untrack func()) {
	p.mu.Lock()
	if u.pending == nil {
		u.pending = map[*progress]struct{}{}
	}
	u.pending[pr] = struct{}{}
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		delete(u.pending, pr)
		p.mu.Unlock()
	}
}

// close fails every waiter and refuses new requests.
func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.dispatch()
}

// snapshot returns, per engine, its health, in-flight count and load.
func (p *pool) snapshot() []engineState {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]engineState, len(p.engines))
	for i, u := range p.engines {
		out[i] = engineState{up: u.up, reason: u.reason, fails: u.fails, inFlight: u.inFlight, load: u.load()}
	}
	return out
}

// engineState is one engine in a pool snapshot.
type engineState struct {
	up       bool
	reason   string
	fails    int // consecutive failed probes
	inFlight int
	load     float64
}

// Back-pressure: the Retry-After of a full queue (docs/design.md §10).
const (
	// drainWindow is how much of the queue's busy time (a request waiting) its drain rate is
	// measured over.
	drainWindow = 10 * time.Second
	// minDrainSpan is the least busy time a rate is computed over (a few releases right
	// after the queue filled do not make a rate of thousands).
	minDrainSpan = 100 * time.Millisecond
	// coldRetryAfter is the wait of a refusal before any slot freed with requests waiting
	// (nothing measured yet): by then the rate is measured, and a retry refused again is told
	// the measured wait.
	coldRetryAfter = time.Second
	// maxRetryAfter caps a wait: openai-node follows a Retry-After below 60 s (openai-go up
	// to 2 min); beyond, clients fall back to their own short backoff.
	maxRetryAfter = 59 * time.Second
	// reservationGrace is how long a promised slot stays held after the whole seconds of its
	// Retry-After (clients that read only Retry-After come back at the whole second).
	reservationGrace = time.Second
)

// drainClock measures the queue's drain rate: the slots freed while requests waited, per
// second of busy time (time with a request waiting), over the last drainWindow of busy
// time. Idle time does not dilute it: a burst after a quiet minute is measured at the rate
// the engines serve. Guarded by the pool's mutex; the zero value is ready.
type drainClock struct {
	acc   time.Duration   // busy time before since
	since time.Time       // start of the current busy period; zero when idle
	marks []time.Duration // busy-clock times of the slots freed, oldest first
}

// clock is the busy time up to now.
func (d *drainClock) clock(now time.Time) time.Duration {
	if d.since.IsZero() {
		return d.acc
	}
	return d.acc + now.Sub(d.since)
}

// busy records whether requests wait from now on.
func (d *drainClock) busy(b bool, now time.Time) {
	switch {
	case b && d.since.IsZero():
		d.since = now
	case !b && !d.since.IsZero():
		d.acc += now.Sub(d.since)
		d.since = time.Time{}
	}
}

// released records a slot freed at now with requests waiting.
func (d *drainClock) released(now time.Time) {
	c := d.clock(now)
	d.marks = append(d.marks, c)
	d.trim(c)
}

func (d *drainClock) trim(c time.Duration) {
	i := 0
	for i < len(d.marks) && c-d.marks[i] > drainWindow {
		i++
	}
	if i > 0 {
		d.marks = append(d.marks[:0], d.marks[i:]...)
	}
}

// rate returns the slots freed per second of busy time over the window, and false when
// fewer than two were measured in it (the cold start).
func (d *drainClock) rate(now time.Time) (float64, bool) {
	c := d.clock(now)
	d.trim(c)
	if len(d.marks) < 2 {
		return 0, false
	}
	span := max(min(c, drainWindow), minDrainSpan)
	return float64(len(d.marks)) / span.Seconds(), true
}

// reservations are the queue slots promised to refused requests: each is due at the time its
// Retry-After named and held until expires. While due, it keeps a new request out of the
// queue's room; a client's retry claims it. Guarded by the pool's mutex; the zero value is
// ready.
type reservations struct {
	held []reservation // by due time
}

type reservation struct{ due, expires time.Time }

// maxReservations bounds the slots held (beyond it a refusal still gets its time, unheld).
const maxReservations = 4096

// expire drops the reservations past their expiry (clients that did not come back).
func (r *reservations) expire(now time.Time) {
	r.held = slices.DeleteFunc(r.held, func(x reservation) bool { return now.After(x.expires) })
}

// due counts the reservations due at now.
func (r *reservations) due(now time.Time) int {
	n := 0
	for _, x := range r.held {
		if x.due.After(now) {
			break
		}
		n++
	}
	return n
}

// claim takes the earliest reservation due at now; false when none is.
func (r *reservations) claim(now time.Time) bool {
	if len(r.held) == 0 || r.held[0].due.After(now) {
		return false
	}
	r.held = slices.Delete(r.held, 0, 1)
	return true
}

// reserve returns the wait of a request refused at now: the time until the queue has room for
// it, the slots promised before it (held) being served first, one per 1/rate at the measured
// drain rate after the latest of them, at most maxRetryAfter; coldRetryAfter before any rate
// was measured. hold keeps the slot for the request's retry. Pool lock held.
func (p *pool) reserve(now time.Time, hold bool) time.Duration {
	wait := coldRetryAfter
	if r, ok := p.drain.rate(now); ok {
		// Room frees once the requests queued beyond MaxQueue (kept promises) are
		// dispatched, and after the slots promised before.
		from := now.Add(time.Duration(float64(max(0, p.waiters.Len()+1-p.maxQueue)) / r * float64(time.Second)))
		if n := len(p.resv.held); n > 0 && p.resv.held[n-1].due.After(from) {
			from = p.resv.held[n-1].due
		}
		wait = min(from.Sub(now)+time.Duration(float64(time.Second)/r), maxRetryAfter)
	}
	if hold && len(p.resv.held) < maxReservations {
		at := now.Add(wait)
		secs := (wait + time.Second - 1) / time.Second * time.Second // when seconds-only clients come
		i, _ := slices.BinarySearchFunc(p.resv.held, at, func(x reservation, t time.Time) int { return x.due.Compare(t) })
		p.resv.held = slices.Insert(p.resv.held, i, reservation{due: at, expires: now.Add(secs + reservationGrace)})
	}
	return wait
}

// retryTicket is one request's part in the back-pressure, carried in its context from the
// HTTP front (withRetryAfter) to the pool: whether the client retries as the OpenAI SDKs do,
// and the wait the pool gave it when it refused it. Used by the request's goroutine only.
type retryTicket struct {
	// holds: the client counts its retries (X-Stainless-Retry-Count, sent by the official
	// SDKs): a refusal holds a slot for its retry.
	holds bool
	// retry: the request is such a retry (count ≥ 1); it may claim a held slot.
	retry   bool
	claimed bool
	// wait, when positive, is the Retry-After of the pool's refusal.
	wait time.Duration
}

// HeaderRetryCount is the retry-count header of the OpenAI SDKs (0 on a first attempt).
const HeaderRetryCount = "X-Stainless-Retry-Count"

// newTicket reads a request's retry count.
func newTicket(h http.Header) *retryTicket {
	t := &retryTicket{}
	if v := h.Get(HeaderRetryCount); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			t.holds, t.retry = true, n > 0
		}
	}
	return t
}

type ticketKey struct{}

func withTicket(ctx context.Context, t *retryTicket) context.Context {
	return context.WithValue(ctx, ticketKey{}, t)
}

// ticketFrom returns the request's ticket, nil when it has none.
func ticketFrom(ctx context.Context) *retryTicket {
	t, _ := ctx.Value(ticketKey{}).(*retryTicket)
	return t
}

// retryAfterHeaders sets Retry-After (whole seconds, rounded up, at least 1) and Retry-After-Ms
// (milliseconds, rounded up, at least 1; the OpenAI SDKs prefer it) for a wait.
func retryAfterHeaders(h http.Header, wait time.Duration) {
	ms := max(1, int64((wait+time.Millisecond-1)/time.Millisecond))
	h.Set("Retry-After", strconv.FormatInt(max(1, (ms+999)/1000), 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(ms, 10))
}
