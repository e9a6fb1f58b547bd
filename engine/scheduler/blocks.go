package scheduler

import (
	"slices"
	"time"

	"github.com/cacheblend/cacheblend/kvcache"
)

// storeHold keeps the blocks of a request whose store the worker has not
// reported done.
type storeHold struct {
	blocks   [][]int32
	deadline time.Time
	doc      *seq // a document waiting for this report
}

// blockManager owns the worker's KV block pool as the engine sees it: the
// allocator with its prefix cache (chain hashes of full blocks), the blocks
// held for stores the worker has not reported done, and the prefix-hit
// accounting. Guarded by Scheduler.mu; it never logs: accounting errors
// wait in errs until the scheduler releases its lock.
type blockManager struct {
	pool      *kvcache.Allocator // nil until the worker answered Info
	holds     map[string]*storeHold
	handoffs  map[string]*storeHold // blocks of handed-over requests, until the worker's keep ends
	evictions uint64                // evictions of pools dropped with a failed worker
	hitNum    uint64                // admitted prompt tokens served from cached or reused KV
	hitDen    uint64                // admitted prompt tokens
	errs      []error
}

func newBlockManager() *blockManager {
	return &blockManager{holds: make(map[string]*storeHold), handoffs: make(map[string]*storeHold)}
}

// reset drops the pool and every hold (the worker's memory is gone).
func (b *blockManager) reset() {
	if b.pool != nil {
		b.evictions += b.pool.Stats().Evictions
	}
	b.pool = nil
	clear(b.holds)
	clear(b.handoffs)
}

// stats fills the KV part of st.
func (b *blockManager) stats(st *Stats) {
	st.Evictions += b.evictions
	st.StoresPending = len(b.holds)
	st.HandoffsHeld = len(b.handoffs)
	if b.hitDen > 0 {
		st.PrefixHitRatio = min(1, float64(b.hitNum)/float64(b.hitDen))
	}
	if b.pool != nil {
		a := b.pool.Stats()
		st.KVFree, st.KVUsed, st.KVCached, st.KVTotal = a.Free, a.Used, a.Cached, a.NumBlocks
		st.Evictions += a.Evictions
	}
}

// free returns block lists to the pool.
func (b *blockManager) free(lists ...[]int32) {
	for _, bl := range lists {
		if len(bl) == 0 {
			continue
		}
		if err := b.pool.Free(bl); err != nil {
			b.errs = append(b.errs, err)
		}
	}
}

// release gives up sq's blocks: held for its pending store, else freed.
func (b *blockManager) release(sq *seq) {
	if len(sq.blocks) == 0 {
		return
	}
	if hold, ok := b.holds[sq.id]; ok {
		hold.blocks = append(hold.blocks, sq.blocks)
	} else {
		b.free(sq.blocks)
	}
	sq.blocks = nil
}

// grow allocates blocks so that sq's table covers tokens positions.
func (b *blockManager) grow(sq *seq, tokens int) error {
	need := b.pool.BlocksFor(tokens) - len(sq.blocks)
	if need <= 0 {
		return nil
	}
	if sq.blocks == nil {
		// Room for the whole request up front: decode steps then grow the
		// table without allocating.
		sq.blocks = make([]int32, 0, max(need, b.pool.BlocksFor(sq.maxLen())))
	}
	blocks, err := b.pool.AllocateAppend(sq.blocks, need)
	if err != nil {
		return err
	}
	sq.blocks = blocks
	return nil
}

// acquirePrefix takes the blocks of sq's longest cached prefix (never the
// whole prompt: the last token is always computed) and returns them with
// the tokens they cover.
func (b *blockManager) acquirePrefix(sq *seq) (blocks []int32, local int) {
	return b.acquire(sq, (len(sq.tokens)-1)/b.pool.BlockSize())
}

// acquire takes the blocks of sq's longest cached prefix of at most maxHit
// blocks (none for a NoReuse request).
func (b *blockManager) acquire(sq *seq, maxHit int) (blocks []int32, local int) {
	bs := b.pool.BlockSize()
	if sq.hashes == nil {
		sq.hashes = make([]kvcache.BlockHash, 0, sq.maxLen()/bs)
	}
	sq.hashes = kvcache.ChainHashes(sq.hashes, sq.tokens, bs)
	if sq.req.NoReuse {
		maxHit = 0
	}
	blocks = b.pool.Acquire(sq.hashes[:min(maxHit, len(sq.hashes))])
	return blocks, len(blocks) * bs
}

// admitted counts an admission for the prefix-hit ratio: hit of the total
// prompt tokens came from cached or reused KV.
func (b *blockManager) admitted(hit, total int) {
	b.hitNum += uint64(min(hit, total))
	b.hitDen += uint64(total)
}

// commit registers sq's newly computed full blocks in the prefix cache.
func (b *blockManager) commit(sq *seq) {
	bs := b.pool.BlockSize()
	full := min(sq.computed/bs, len(sq.blocks))
	if full <= sq.committed {
		return
	}
	sq.hashes = kvcache.ChainHashes(sq.hashes, sq.tokens, bs)
	for i := sq.committed; i < full && i < len(sq.hashes); i++ {
		if _, err := b.pool.Commit(sq.blocks[i], sq.hashes[i]); err != nil {
			b.errs = append(b.errs, err)
		}
	}
	sq.committed = full
}

// hold starts holding the blocks of request id until its store is
// reported, at most until deadline.
func (b *blockManager) hold(id string, deadline time.Time) *storeHold {
	h, ok := b.holds[id]
	if !ok {
		h = &storeHold{deadline: deadline}
		b.holds[id] = h
	}
	return h
}

// storeDone frees what the store of id held and returns the hold (nil when
// none).
func (b *blockManager) storeDone(id string) *storeHold {
	h, ok := b.holds[id]
	if !ok {
		return nil
	}
	delete(b.holds, id)
	b.free(h.blocks...)
	return h
}

// holdHandoff holds blocks (a reference of their own) for the hand-over
// of request id until handoffDone, at most until deadline.
func (b *blockManager) holdHandoff(id string, blocks []int32, deadline time.Time) error {
	if err := b.pool.Ref(blocks); err != nil {
		return err
	}
	if old, ok := b.handoffs[id]; ok { // cannot happen: ids are unique in flight
		b.free(old.blocks...)
	}
	b.handoffs[id] = &storeHold{blocks: [][]int32{slices.Clone(blocks)}, deadline: deadline}
	return nil
}

// handoffDone frees what the hand-over of id held; false when nothing.
func (b *blockManager) handoffDone(id string) bool {
	h, ok := b.handoffs[id]
	if !ok {
		return false
	}
	delete(b.handoffs, id)
	b.free(h.blocks...)
	return true
}

// expireHandoffs frees the hand-over holds past their deadline and returns
// their ids.
func (b *blockManager) expireHandoffs(now time.Time) []string {
	var out []string
	for id, h := range b.handoffs {
		if now.Before(h.deadline) {
			continue
		}
		delete(b.handoffs, id)
		b.free(h.blocks...)
		out = append(out, id)
	}
	return out
}

// polling reports whether a store or a hand-over awaits the worker's report.
func (b *blockManager) polling() bool { return len(b.holds) > 0 || len(b.handoffs) > 0 }

// expire frees the holds past their deadline and returns their ids and
// holds.
func (b *blockManager) expire(now time.Time) map[string]*storeHold {
	var out map[string]*storeHold
	for id, h := range b.holds {
		if now.Before(h.deadline) {
			continue
		}
		delete(b.holds, id)
		b.free(h.blocks...)
		if out == nil {
			out = make(map[string]*storeHold)
		}
		out[id] = h
	}
	return out
}

// nextDeadline is the earliest hold deadline, if any.
func (b *blockManager) nextDeadline() (time.Time, bool) {
	var at time.Time
	for _, m := range []map[string]*storeHold{b.holds, b.handoffs} {
		for _, h := range m {
			if at.IsZero() || h.deadline.Before(at) {
				at = h.deadline
			}
		}
	}
	return at, !at.IsZero()
}

// takeErrors returns and forgets the accounting errors collected so far.
func (b *blockManager) takeErrors() []error {
	errs := b.errs
	b.errs = nil
	return errs
}
