package scheduler

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Prefill/decode hand-over (docs/design.md §9): the prefill side
// (Request.HandoffSecret) and the decode side (Request.Prefilled).

// pullOutcome is a finished pull, handed back to the step loop.
type pullOutcome struct {
	sq    *seq
	bytes int64
	err   error
	at    time.Time
}

// handedOff finishes a request whose first token was sampled for a
// hand-over: its worker keeps the prompt's KV (and forgot the request), so
// its blocks are held until the worker reports the keep's end.
func (s *Scheduler) handedOff(sq *seq, now time.Time) {
	if err := s.blocks.holdHandoff(sq.id, sq.blocks, now.Add(s.cfg.HandoffTimeout)); err != nil {
		s.blocks.errs = append(s.blocks.errs, err)
	}
	sq.started = false // the worker moved the request to its keep: no finished id
	s.finish(sq, FinishHandoff, nil, now)
}

// ReleaseHandoff ends the keep of a handed-over request (prefill side):
// the worker drops the prompt's KV, stopping a read in progress, and the
// held blocks are freed once it reports so. Call it when the hand-over
// ended, failed or not; it is a no-op for a request whose blocks were
// already freed.
func (s *Scheduler) ReleaseHandoff(id string) {
	s.mu.Lock()
	if _, ok := s.blocks.handoffs[id]; ok && !slices.Contains(s.pendingFinished, id) {
		s.pendingFinished = append(s.pendingFinished, id)
	}
	s.unlock()
	s.poke()
}

// startPull admits a Prefilled request: it takes the prompt's cached
// blocks (every full block may be found: nothing is computed before the
// first decode step) and allocates the rest, then pulls the rest on a
// goroutine. False when the pool cannot hold the prompt now.
func (s *Scheduler) startPull(sq *seq, now time.Time) bool {
	pool := s.blocks.pool
	bs := pool.BlockSize()
	acquired, local := s.blocks.acquire(sq, sq.nPrompt/bs)
	sq.blocks = acquired
	if err := s.blocks.grow(sq, sq.nPrompt); err != nil {
		s.blocks.free(acquired)
		sq.blocks = nil
		return false
	}
	sq.committed = len(acquired)
	sq.admitted = true
	sq.state = stPulling
	s.pulling = append(s.pulling, sq)
	s.blocks.admitted(local, sq.nPrompt)
	ctx, cancel := context.WithCancel(sq.reqCtx)
	sq.pullCancel = cancel
	bt := slices.Clone(sq.blocks)
	from := len(acquired)
	tr := Transfer{Blocks: len(bt), Deduped: from, Start: now}
	s.defer_(func() {
		sq.h.update(func(r *Result) {
			r.Admitted = now
			r.CachedTokens = local
			t := tr
			r.Transfer = &t
		})
	})
	pull := sq.req.Prefilled.Pull
	s.pullCalls.Go(func() {
		var o pullOutcome
		o.sq = sq
		if from < len(bt) {
			o.bytes, o.err = pull(ctx, bt, from)
		}
		o.at = time.Now()
		select {
		case s.pullOutcomes <- o:
			s.poke()
		case <-s.loopCtx.Done():
		}
	})
	return true
}

// drivePulls folds the finished pulls into their requests.
func (s *Scheduler) drivePulls() {
	for {
		select {
		case o := <-s.pullOutcomes:
			s.pullDone(o)
		default:
			return
		}
	}
}

// pullDone starts a request whose pull succeeded, with its first token, or
// fails it.
func (s *Scheduler) pullDone(o pullOutcome) {
	sq := o.sq
	if sq.state != stPulling {
		return // finished meanwhile (canceled, aborted)
	}
	sent := len(sq.blocks) - sq.committed
	bytes, at := o.bytes, o.at
	sq.h.update(func(r *Result) {
		if r.Transfer != nil { // copied, never changed in place: snapshots share it
			t := *r.Transfer
			t.End, t.Bytes, t.Done, t.OK = at, bytes, true, o.err == nil
			if o.err == nil {
				t.Sent = sent
			}
			r.Transfer = &t
		}
	})
	if o.err != nil {
		err := fmt.Errorf("%w: %w", ErrHandoff, o.err)
		if sq.reqCtx.Err() != nil { // the request's own end stopped the pull
			err = ErrCanceled
		}
		s.finish(sq, "", err, o.at)
		return
	}
	s.pulling = slices.DeleteFunc(s.pulling, func(x *seq) bool { return x == sq })
	sq.pullCancel()
	sq.computed = sq.nPrompt
	s.blocks.commit(sq) // the pulled blocks join the prefix cache
	sq.state = stRunning
	s.running = append(s.running, sq)
	s.appendToken(sq, sq.req.Prefilled.FirstToken, o.at)
}
