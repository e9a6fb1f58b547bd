package gateway

import (
	"container/list"
	"sync"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
)

// keyBytes is what one chunk key costs in the index's accounting.
const keyBytes = len(chunkstore.Key{})

// reuseIndex is the gateway's knowledge of what one engine holds: the prompts and documents it
// routed there, as a fingerprint table (package blend/fingerprint, the blend server's
// non-prefix matcher) over their tokens, chunked and keyed like the engines' chunks
// (chunkstore.ChainKeys). Match tells how many tokens of a prompt the engine is expected to
// reuse, at any offset.
//
// It is bounded: beyond maxBytes (tokens are counted twice, the table keeps a copy, plus the
// chunk keys) or maxSeqs registrations, the least recently used registrations are evicted
// (a match touches the registrations it came from). A chunk key shared by several
// registrations leaves the table with the last of them. The table cannot drop one
// registration's reference to a shared chunk, so once the evicted registrations' bytes exceed
// maxBytes the table is rebuilt from the live ones.
//
// A registration is skipped (only touched) when the index already matches all of it but less
// than a chunk, so repeated requests for a document with different questions cost nothing.
// Safe for concurrent use.
type reuseIndex struct {
	model     string
	chunkSize int
	maxBytes  int
	maxSeqs   int

	mu     sync.Mutex
	table  *fingerprint.Table
	nextID uint64 // the table's id of the next registration (fingerprint.Match.Sequence)
	lru    *list.List
	byID   map[uint64]*list.Element
	refs   map[chunkstore.Key]int
	bytes  int // live registrations
	dead   int // evicted registrations still referenced by the table
}

// indexEntry is one registration.
type indexEntry struct {
	id     uint64
	keys   []chunkstore.Key
	tokens []int32
	bytes  int
}

func newReuseIndex(model string, chunkSize, maxBytes, maxSeqs int) *reuseIndex {
	x := &reuseIndex{model: model, chunkSize: chunkSize, maxBytes: maxBytes, maxSeqs: maxSeqs}
	x.resetLocked()
	return x
}

func (x *reuseIndex) resetLocked() {
	x.table = fingerprint.NewTable(fingerprint.Config{})
	x.nextID = 1
	x.lru = list.New()
	x.byID = map[uint64]*list.Element{}
	x.refs = map[chunkstore.Key]int{}
	x.bytes, x.dead = 0, 0
}

// Match returns the number of tokens of prompt the engine is expected to reuse: the tokens of
// the matches of at least a quarter chunk (shorter ones, such as a chat template every prompt
// starts with, say nothing about where a document is).
func (x *reuseIndex) Match(prompt []int32) int {
	x.mu.Lock()
	t := x.table
	x.mu.Unlock()
	n := 0
	for _, m := range t.Match(prompt, 0).Matches {
		if m.Len() >= x.chunkSize/4 {
			n += m.Len()
		}
	}
	return n
}

// Register records that tokens (a prompt or a document) were routed to the engine: the
// registrations it matches are touched, and it is registered when it brings a new chunk.
func (x *reuseIndex) Register(tokens []int32) {
	if len(tokens) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	res := x.table.Match(tokens, 0)
	for _, m := range res.Matches {
		if el, ok := x.byID[m.Sequence]; ok {
			x.lru.MoveToBack(el)
		}
	}
	if len(tokens)-res.Stats.HitTokens < min(x.chunkSize, len(tokens)) {
		return // less than a chunk the index does not match already
	}
	keys := chunkstore.ChainKeys(x.model, 0, tokens, x.chunkSize)
	e := &indexEntry{keys: keys, tokens: append([]int32(nil), tokens...), bytes: 8*len(tokens) + keyBytes*len(keys)}
	if e.bytes > x.maxBytes {
		return // larger than the whole index
	}
	x.add(e)
	for x.bytes > x.maxBytes || x.lru.Len() > x.maxSeqs {
		x.evictOldest()
	}
	if x.dead > x.maxBytes {
		x.rebuild()
	}
}

// add registers e in the table (the caller holds mu).
func (x *reuseIndex) add(e *indexEntry) {
	if _, err := x.table.Register(fingerprint.Sequence{Keys: e.keys, Tokens: e.tokens, ChunkSize: x.chunkSize}); err != nil {
		return // unreachable: keys come from ChainKeys over the same tokens
	}
	e.id = x.nextID
	x.nextID++
	x.byID[e.id] = x.lru.PushBack(e)
	for _, k := range e.keys {
		x.refs[k]++
	}
	x.bytes += e.bytes
}

// evictOldest evicts the least recently used registration (the caller holds mu).
func (x *reuseIndex) evictOldest() {
	el := x.lru.Front()
	if el == nil {
		return
	}
	e := x.lru.Remove(el).(*indexEntry)
	delete(x.byID, e.id)
	x.bytes -= e.bytes
	shared := false
	for _, k := range e.keys {
		x.refs[k]--
		if x.refs[k] <= 0 {
			delete(x.refs, k)
			x.table.Unregister(k)
		} else {
			shared = true
		}
	}
	if shared {
		x.dead += e.bytes
	}
}

// rebuild makes a fresh table of the live registrations, oldest first (the caller holds mu).
func (x *reuseIndex) rebuild() {
	var live []*indexEntry
	for el := x.lru.Front(); el != nil; el = el.Next() {
		live = append(live, el.Value.(*indexEntry))
	}
	x.resetLocked()
	for _, e := range live {
		x.add(e)
	}
}

// Stats returns the live registrations and their bytes.
func (x *reuseIndex) Stats() (seqs, bytes int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.lru.Len(), x.bytes
}
