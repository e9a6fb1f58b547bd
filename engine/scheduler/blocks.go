package scheduler

import (
	"fmt"
	"slices"
	"time"

	"github.com/cacheblend/cacheblend/kvcache"
)

// storeHold keeps the blocks of a request whose store the worker has not
// reported done.
type storeHold struct {
	blocks   [][]int32
	deadline time.Time
	doc      *seq // a document waiting for this report (finishing it again does nothing)
}

// blockManager owns the worker's KV block pool as the engine sees it: the
// allocator with its prefix cache (chain hashes of full blocks), the blocks
// held for stores the worker has not reported done, and the prefix-hit
// accounting. The scheduler uses it through its methods only. Guarded by
// Scheduler.mu; it never logs: accounting errors wait in errs until the
// scheduler releases its lock.
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

// reset drops the pool and every hold (the worker's memory is gone) and
// starts over with pool (nil until the worker answers again).
func (b *blockManager) reset(pool *kvcache.Allocator) {
	if b.pool != nil {
		b.evictions += b.pool.Stats().Evictions
	}
	b.pool = pool
	clear(b.holds)
	clear(b.handoffs)
}

// fits returns an ErrTooLong error when a request of tokens positions can
// never fit the pool.
func (b *blockManager) fits(tokens int) error {
	if need, have := b.pool.BlocksFor(tokens), b.pool.NumBlocks(); need > have {
		return fmt.Errorf("%w: %d tokens need %d KV blocks, the pool has %d", ErrTooLong, tokens, need, have)
	}
	return nil
}

// holding reports whether blocks are held for request id's store.
func (b *blockManager) holding(id string) bool { _, ok := b.holds[id]; return ok }

// handingOff reports whether blocks are held for request id's hand-over.
func (b *blockManager) handingOff(id string) bool { _, ok := b.handoffs[id]; return ok }

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

// release gives up the blocks of request id: held for its pending store,
// else freed.
func (b *blockManager) release(id string, kv *seqKV) {
	if len(kv.blocks) == 0 {
		return
	}
	if hold, ok := b.holds[id]; ok {
		hold.blocks = append(hold.blocks, kv.blocks)
	} else {
		b.free(kv.blocks)
	}
	kv.blocks = nil
}

// grow allocates blocks so that kv's table covers tokens positions.
func (b *blockManager) grow(kv *seqKV, tokens int) error {
	need := b.pool.BlocksFor(tokens) - len(kv.blocks)
	if need <= 0 {
		return nil
	}
	if kv.blocks == nil {
		// Room for the whole request up front: decode steps then grow the
		// table without allocating.
		kv.blocks = make([]int32, 0, max(need, b.pool.BlocksFor(kv.maxLen)))
	}
	blocks, err := b.pool.AllocateAppend(kv.blocks, need)
	if err != nil {
		return err
	}
	kv.blocks = blocks
	return nil
}

// take gives kv the blocks acquired from the prefix cache (registered
// there) and grows its table to tokens positions. When the pool cannot,
// the acquired blocks are given back, kv holds none, and take is false.
func (b *blockManager) take(kv *seqKV, acquired []int32, tokens int) bool {
	kv.blocks, kv.committed = acquired, len(acquired)
	if err := b.grow(kv, tokens); err != nil {
		b.free(acquired)
		kv.blocks, kv.committed = nil, 0
		return false
	}
	return true
}

// acquire takes the blocks of kv's longest cached prefix within its first
// upTo tokens (none for a NoReuse request) and returns them with the tokens
// they cover.
func (b *blockManager) acquire(kv *seqKV, upTo int) (blocks []int32, local int) {
	bs := b.pool.BlockSize()
	if kv.hashes == nil {
		kv.hashes = make([]kvcache.BlockHash, 0, kv.maxLen/bs)
	}
	kv.hashes = kvcache.ChainHashes(kv.hashes, kv.tokens, bs)
	maxHit := upTo / bs
	if kv.noCache {
		maxHit = 0
	}
	blocks = b.pool.Acquire(kv.hashes[:min(maxHit, len(kv.hashes))])
	return blocks, len(blocks) * bs
}

// admitted counts an admission for the prefix-hit ratio: hit of the total
// prompt tokens came from cached or reused KV.
func (b *blockManager) admitted(hit, total int) {
	b.hitNum += uint64(min(hit, total))
	b.hitDen += uint64(total)
}

// commit registers kv's newly computed full blocks in the prefix cache.
func (b *blockManager) commit(kv *seqKV) {
	bs := b.pool.BlockSize()
	full := min(kv.computed/bs, len(kv.blocks))
	if full <= kv.committed {
		return
	}
	kv.hashes = kvcache.ChainHashes(kv.hashes, kv.tokens, bs)
	for i := kv.committed; i < full && i < len(kv.hashes); i++ {
		if _, err := b.pool.Commit(kv.blocks[i], kv.hashes[i]); err != nil {
			b.errs = append(b.errs, err)
		}
	}
	kv.committed = full
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

// parkDoc moves the blocks of document sq, whose prefill is done, to the
// hold of its store (deadline if it has none yet); the report finishes it.
func (b *blockManager) parkDoc(sq *seq, deadline time.Time) {
	hold := b.hold(sq.id, deadline)
	hold.blocks = append(hold.blocks, sq.kv.blocks)
	hold.doc = sq
	sq.kv.blocks = nil
}

// storesInFlight returns the ids of the stores not reported done (at most
// n, any n of them when more are held): a lookup names them so that the
// blend server waits for those its worker has not sent yet.
func (b *blockManager) storesInFlight(n int) []string {
	if len(b.holds) == 0 {
		return nil
	}
	ids := make([]string, 0, min(n, len(b.holds)))
	for id := range b.holds {
		if len(ids) == n {
			break
		}
		ids = append(ids, id)
	}
	return ids
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
func (b *blockManager) holdHandoff(id string, blocks []int32, deadline time.Time) {
	if err := b.pool.Ref(blocks); err != nil {
		b.errs = append(b.errs, err)
		return
	}
	if old, ok := b.handoffs[id]; ok { // cannot happen: ids are unique in flight
		b.free(old.blocks...)
	}
	b.handoffs[id] = &storeHold{blocks: [][]int32{slices.Clone(blocks)}, deadline: deadline}
}

// handoffDone frees what the hand-over of id held.
func (b *blockManager) handoffDone(id string) {
	if h, ok := b.handoffs[id]; ok {
		delete(b.handoffs, id)
		b.free(h.blocks...)
	}
}

// polling reports whether a store or a hand-over awaits the worker's report.
func (b *blockManager) polling() bool { return len(b.holds) > 0 || len(b.handoffs) > 0 }

// expire frees the store holds and the hand-over holds past their deadline
// and returns them by request id.
func (b *blockManager) expire(now time.Time) (stores, handoffs map[string]*storeHold) {
	return b.expireIn(b.holds, now), b.expireIn(b.handoffs, now)
}

func (b *blockManager) expireIn(holds map[string]*storeHold, now time.Time) map[string]*storeHold {
	var out map[string]*storeHold
	for id, h := range holds {
		if now.Before(h.deadline) {
			continue
		}
		delete(holds, id)
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
