package scatter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of a zero PoolConfig.
const (
	DefaultWorkers   = 2
	DefaultQueueSize = 64
)

// ErrPoolClosed is the Result error of a job submitted to a pool that is not
// running (before Start or after Shutdown); nothing was copied.
var ErrPoolClosed = errors.New("scatter: pool not running")

// Job is one Scatter call to run on the pool (one retrieve's copy).
type Job struct {
	Copy
	// Workers is the layer parallelism of this copy (see ScatterParallel);
	// <= 1 copies on the pool worker alone.
	Workers int
	// Done, when set, is called with the result from the goroutine that ran
	// the copy, before the result is sent on Submit's channel.
	Done func(Result)
}

// Result is the outcome of a Job. End is the time the copy finished: the
// time stamped on the END event of the scatter.
type Result struct {
	Stats  Stats
	Err    error
	Queued time.Time // when Submit was called
	Start  time.Time // when the copy started
	End    time.Time // when the copy finished
	Inline bool      // the queue was full and the submitter ran the copy
}

// PoolConfig holds the optional settings of a Pool; the zero value is two
// workers and a queue of 64 jobs.
type PoolConfig struct {
	Workers   int // copy goroutines (DefaultWorkers when <= 0)
	QueueSize int // jobs waiting for a worker (DefaultQueueSize when <= 0)
}

// PoolStats counts a pool's jobs.
type PoolStats struct {
	Submitted int64 // jobs accepted (queued or inline)
	Inline    int64 // jobs run by the submitter because the queue was full
	Completed int64 // jobs finished
	Rejected  int64 // jobs refused because the pool was not running
	Queued    int   // jobs waiting now
}

// Pool is our "stream": a few goroutines running scatter jobs off a bounded
// queue, so a retrieve's copy can be submitted and waited on, with the finish
// time of each copy recorded. When the queue is full the submitter runs the
// copy inline rather than dropping KV (the worker would otherwise have to
// recompute it); this is counted in PoolStats.Inline. All methods are safe
// for concurrent use.
type Pool struct {
	cfg PoolConfig

	mu      sync.RWMutex // guards running and the queue's closing
	running bool
	stopped bool
	queue   chan queued
	wg      sync.WaitGroup

	submitted, inline, completed, rejected atomic.Int64
}

type queued struct {
	job    Job
	out    chan Result
	queued time.Time
}

// NewPool returns a pool for cfg; call Start before Submit.
func NewPool(cfg PoolConfig) *Pool {
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	return &Pool{cfg: cfg, queue: make(chan queued, cfg.QueueSize)}
}

// Start launches the workers. The context is not retained: the workers run
// until Shutdown. Starting twice, or after Shutdown, is an error.
func (p *Pool) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running || p.stopped {
		return errors.New("scatter: pool already started")
	}
	p.running = true
	for range p.cfg.Workers {
		p.wg.Go(p.work)
	}
	return nil
}

func (p *Pool) work() {
	for q := range p.queue {
		p.run(q, false)
	}
}

func (p *Pool) run(q queued, inline bool) {
	res := Result{Queued: q.queued, Start: time.Now(), Inline: inline}
	res.Stats, res.Err = ScatterParallel(q.job.Copy, q.job.Workers)
	res.End = time.Now()
	p.completed.Add(1)
	if q.job.Done != nil {
		q.job.Done(res)
	}
	q.out <- res
}

// Submit queues job and returns a channel (buffered, never closed) that
// receives its Result once. When the queue is full the copy runs in the
// calling goroutine before Submit returns (Result.Inline). A pool that is not
// running answers at once with ErrPoolClosed.
func (p *Pool) Submit(job Job) <-chan Result {
	q := queued{job: job, out: make(chan Result, 1), queued: time.Now()}
	p.mu.RLock()
	if !p.running {
		p.mu.RUnlock()
		p.rejected.Add(1)
		q.out <- Result{Err: ErrPoolClosed, Queued: q.queued, Start: q.queued, End: q.queued}
		return q.out
	}
	p.submitted.Add(1)
	select {
	case p.queue <- q:
		p.mu.RUnlock()
	default:
		p.mu.RUnlock()
		p.inline.Add(1)
		p.run(q, true)
	}
	return q.out
}

// Shutdown stops accepting jobs, lets the workers finish every queued job
// and waits for them to exit, or returns ctx's error if ctx ends first (the
// workers then still finish the queue and exit on their own).
func (p *Pool) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.running = false
		close(p.queue)
	}
	p.stopped = true
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats returns the pool's counters.
func (p *Pool) Stats() PoolStats {
	return PoolStats{
		Submitted: p.submitted.Load(), Inline: p.inline.Load(), Completed: p.completed.Load(),
		Rejected: p.rejected.Load(), Queued: len(p.queue),
	}
}
