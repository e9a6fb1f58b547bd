package scheduler

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Prefill/decode hand-over (docs/design.md §9): the prefill side
// (Request.HandoffSecret) and the decode side (Request.Prefilled).

// handedOff finishes a request whose first token was sampled for a
// hand-over: its worker keeps the prompt's KV (and forgot the request), so
// its blocks are held until the worker reports the keep's end.
func (s *Scheduler) handedOff(sq *seq, now time.Time) {
	s.blocks.holdHandoff(sq.id, sq.kv.blocks, now.Add(s.cfg.HandoffTimeout))
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
	if s.blocks.handingOff(id) && !slices.Contains(s.buf.finished, id) {
		s.buf.finished = append(s.buf.finished, id)
	}
	s.unlock()
	s.poke()
}

// startPull admits a Prefilled request: it takes the prompt's cached
// blocks (every full block may be found: nothing is computed before the
// first decode step) and allocates the rest, then pulls the rest through
// Scheduler.pulls. False when the pool cannot hold the prompt now.
func (s *Scheduler) startPull(sq *seq, now time.Time) bool {
	acquired, local := s.blocks.acquire(&sq.kv, sq.kv.nPrompt) // a pulled prompt computes nothing
	if !s.blocks.take(&sq.kv, acquired, sq.kv.nPrompt) {
		return false
	}
	sq.admitted = true
	sq.state = stPulling
	s.q.pulling = append(s.q.pulling, sq)
	s.blocks.admitted(local, sq.kv.nPrompt)
	bt, from := slices.Clone(sq.kv.blocks), len(acquired)
	tr := Transfer{Blocks: len(bt), Deduped: from, Start: now}
	s.defer_(func() {
		sq.h.update(func(r *Result) { r.Admitted, r.CachedTokens, r.Transfer = now, local, &tr })
	})
	pull := sq.req.Prefilled.Pull
	sq.pullCancel = s.pulls.start(sq.trace.reqCtx, sq, func(ctx context.Context) (int64, error) {
		if from == len(bt) {
			return 0, nil // every block was in the prefix cache
		}
		return pull(ctx, bt, from)
	})
	return true
}

// pullDone starts a request whose pull succeeded, with its first token, or
// fails it.
func (s *Scheduler) pullDone(o outcome[int64]) {
	sq := o.sq
	if sq.state != stPulling {
		return // finished meanwhile (canceled, aborted)
	}
	sent := len(sq.kv.blocks) - sq.kv.committed
	sq.h.update(func(r *Result) {
		if r.Transfer != nil { // copied, never changed in place: snapshots share it
			t := *r.Transfer
			t.End, t.Bytes, t.Done, t.OK = o.at, o.val, true, o.err == nil
			if o.err == nil {
				t.Sent = sent
			}
			r.Transfer = &t
		}
	})
	if o.err != nil {
		err := fmt.Errorf("%w: %w", ErrHandoff, o.err)
		if sq.trace.reqCtx.Err() != nil { // the request's own end stopped the pull
			err = ErrCanceled
		}
		s.finish(sq, "", err, o.at)
		return
	}
	s.q.pulling = without(s.q.pulling, sq)
	sq.pullCancel()
	sq.kv.computed = sq.kv.nPrompt
	s.blocks.commit(&sq.kv) // the pulled blocks join the prefix cache
	sq.state = stRunning
	s.q.running = append(s.q.running, sq)
	s.appendToken(sq, sq.req.Prefilled.FirstToken, o.at)
}
