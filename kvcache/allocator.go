package kvcache

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
)

// ErrNoFreeBlocks reports an allocation larger than the blocks available
// (free plus cached); nothing was allocated. The scheduler reacts by
// preempting a running sequence or by leaving a request waiting.
var ErrNoFreeBlocks = errors.New("kvcache: not enough free blocks")

// ErrBadBlock reports a block id outside the pool, or a release of a block
// that holds no reference.
var ErrBadBlock = errors.New("kvcache: bad block")

// BlockHash identifies the content of a full block together with everything
// before it: hash_i = SHA-256(hash_{i-1} || tokens of block i). Two sequences
// share a block hash exactly when they share every token up to the end of
// that block, so a cached block can stand in for the computation of its
// tokens at the same positions.
type BlockHash [32]byte

// HashBlock returns the chain hash of one block of tokens following parent
// (the zero BlockHash for the first block). It is safe for concurrent use.
func HashBlock(parent BlockHash, tokens []int32) BlockHash {
	h := sha256.New()
	h.Write(parent[:])
	var buf [64]byte
	for len(tokens) > 0 {
		n := min(len(tokens), len(buf)/4)
		for i := range n {
			binary.LittleEndian.PutUint32(buf[4*i:], uint32(tokens[i]))
		}
		h.Write(buf[:4*n])
		tokens = tokens[n:]
	}
	var out BlockHash
	h.Sum(out[:0])
	return out
}

// ChainHashes appends to dst the chain hashes of the full blocks of tokens
// from block index len(dst) on, continuing the chain dst already holds, and
// returns the extended slice. A trailing partial block is not hashed. Passing
// the previous result back in hashes only the new full blocks. It is safe for
// concurrent use with distinct dst.
func ChainHashes(dst []BlockHash, tokens []int32, blockSize int) []BlockHash {
	if blockSize <= 0 {
		return dst
	}
	for i := len(dst); (i+1)*blockSize <= len(tokens); i++ {
		var parent BlockHash
		if i > 0 {
			parent = dst[i-1]
		}
		dst = append(dst, HashBlock(parent, tokens[i*blockSize:(i+1)*blockSize]))
	}
	return dst
}

// AllocatorStats is a snapshot of an [Allocator]. Free + Used + Cached ==
// NumBlocks always.
type AllocatorStats struct {
	NumBlocks int // blocks in the pool
	BlockSize int // tokens per block
	Free      int // no reference, no cached content
	Used      int // referenced by at least one sequence
	Cached    int // no reference, content kept in the prefix cache (evictable)
	// Evictions counts cached blocks whose content was dropped to satisfy an
	// allocation (monotonic).
	Evictions uint64
	// PrefixQueries and PrefixHits count blocks asked for and found by
	// [Allocator.Acquire] (monotonic).
	PrefixQueries uint64
	PrefixHits    uint64
}

// Allocator is the paged KV block allocator of the scheduler: a pool of
// NumBlocks blocks of BlockSize tokens, reference-counted so that sequences
// sharing a prefix share its blocks, with a prefix cache of full blocks keyed
// by [BlockHash].
//
// A block is in one of three states: used (referenced), cached (unreferenced
// but registered in the prefix cache: its content can be reused until it is
// evicted) or free. Unreferenced blocks, cached or free, sit in one LRU list;
// an allocation takes the least recently released block and, if it was
// cached, evicts its content. Released blocks join the list's tail in
// reverse order, so a sequence's last blocks are evicted before its first
// ones (its prefix is the part most likely shared).
//
// All methods are safe for concurrent use. Operations are O(1) per block.
type Allocator struct {
	mu        sync.Mutex
	blockSize int
	refs      []int32
	hashed    []bool
	hashes    []BlockHash
	cache     map[BlockHash]int32

	// LRU list of unreferenced blocks: prev/next links, -1 terminated.
	prev, next []int32
	inList     []bool
	head, tail int32
	nList      int // unreferenced blocks (free + cached)
	nCached    int // unreferenced and hashed

	evictions, queries, hits uint64
}

// NewAllocator returns an allocator of numBlocks free blocks of blockSize
// tokens. Both must be positive.
func NewAllocator(numBlocks, blockSize int) (*Allocator, error) {
	if numBlocks <= 0 || blockSize <= 0 || numBlocks > 1<<30 {
		return nil, fmt.Errorf("%w: %d blocks of %d tokens", ErrBadLayout, numBlocks, blockSize)
	}
	a := &Allocator{
		blockSize: blockSize,
		refs:      make([]int32, numBlocks),
		hashed:    make([]bool, numBlocks),
		hashes:    make([]BlockHash, numBlocks),
		cache:     make(map[BlockHash]int32),
		prev:      make([]int32, numBlocks),
		next:      make([]int32, numBlocks),
		inList:    make([]bool, numBlocks),
		head:      -1,
		tail:      -1,
	}
	for b := range numBlocks {
		a.pushTail(int32(b))
	}
	return a, nil
}

// NumBlocks returns the size of the pool.
func (a *Allocator) NumBlocks() int { return len(a.refs) }

// BlockSize returns the number of tokens per block.
func (a *Allocator) BlockSize() int { return a.blockSize }

// BlocksFor returns the number of blocks that hold n tokens.
func (a *Allocator) BlocksFor(n int) int { return (n + a.blockSize - 1) / a.blockSize }

// Available returns how many blocks an allocation can take now (free plus
// cached).
func (a *Allocator) Available() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nList
}

// CachedPrefix returns how many leading hashes are in the prefix cache,
// without taking references or counting a query.
func (a *Allocator) CachedPrefix(hashes []BlockHash) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, h := range hashes {
		if _, ok := a.cache[h]; !ok {
			break
		}
		n++
	}
	return n
}

// Acquire takes a reference on the blocks of the longest prefix of hashes
// present in the prefix cache and returns their ids, in order. Cached
// (unreferenced) blocks become used. The blocks asked for and found are
// counted in the prefix statistics.
func (a *Allocator) Acquire(hashes []BlockHash) []int32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []int32
	for _, h := range hashes {
		b, ok := a.cache[h]
		if !ok {
			break
		}
		a.ref(b)
		out = append(out, b)
	}
	a.queries += uint64(len(hashes))
	a.hits += uint64(len(out))
	return out
}

// Allocate takes n blocks from the head of the LRU list, evicting cached
// content, and returns them with one reference each. It allocates all n or
// none: with fewer than n available it returns [ErrNoFreeBlocks].
func (a *Allocator) Allocate(n int) ([]int32, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: negative count %d", ErrNoFreeBlocks, n)
	}
	return a.AllocateAppend(make([]int32, 0, n), n)
}

// AllocateAppend is [Allocator.Allocate] appending the n blocks to dst: no
// allocation when dst has the capacity. On error dst is returned unchanged.
func (a *Allocator) AllocateAppend(dst []int32, n int) ([]int32, error) {
	if n < 0 {
		return dst, fmt.Errorf("%w: negative count %d", ErrNoFreeBlocks, n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if n > a.nList {
		return dst, fmt.Errorf("%w: want %d, %d available", ErrNoFreeBlocks, n, a.nList)
	}
	for range n {
		b := a.head
		a.ref(b) // unlinks b (and uncounts it as cached) before the eviction
		if a.hashed[b] {
			delete(a.cache, a.hashes[b])
			a.hashed[b] = false
			a.evictions++
		}
		dst = append(dst, b)
	}
	return dst, nil
}

// Commit registers the full block b, whose content has been computed, in the
// prefix cache under h. It reports false, changing nothing, when another
// block already caches h or b is already registered under a different hash.
// b must hold a reference.
func (a *Allocator) Commit(b int32, h BlockHash) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b < 0 || int(b) >= len(a.refs) || a.refs[b] == 0 {
		return false, fmt.Errorf("%w: commit of block %d without a reference", ErrBadBlock, b)
	}
	if a.hashed[b] {
		return a.hashes[b] == h, nil
	}
	if _, ok := a.cache[h]; ok {
		return false, nil
	}
	a.cache[h] = b
	a.hashes[b] = h
	a.hashed[b] = true
	return true, nil
}

// Free releases one reference on each of blocks. Blocks left without
// references join the LRU list's tail in reverse order (the last block of a
// sequence is reused first); cached ones keep their content until evicted.
// An id outside the pool or without a reference is an error wrapping
// [ErrBadBlock]; the valid ids are still released.
func (a *Allocator) Free(blocks []int32) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var bad []int32
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		if b < 0 || int(b) >= len(a.refs) || a.refs[b] == 0 {
			bad = append(bad, b)
			continue
		}
		a.refs[b]--
		if a.refs[b] == 0 {
			a.pushTail(b)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: release of unreferenced or unknown blocks %v", ErrBadBlock, bad)
	}
	return nil
}

// Ref takes one more reference on each of blocks, which must all be used
// (hold a reference already): a second owner of the same blocks, released
// by its own Free. An id outside the pool or without a reference is an
// error wrapping [ErrBadBlock], and then no reference is taken.
func (a *Allocator) Ref(blocks []int32) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, b := range blocks {
		if b < 0 || int(b) >= len(a.refs) || a.refs[b] == 0 {
			return fmt.Errorf("%w: reference on unreferenced or unknown block %d", ErrBadBlock, b)
		}
	}
	for _, b := range blocks {
		a.refs[b]++
	}
	return nil
}

// Stats returns a snapshot of the block states and counters.
func (a *Allocator) Stats() AllocatorStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return AllocatorStats{
		NumBlocks:     len(a.refs),
		BlockSize:     a.blockSize,
		Free:          a.nList - a.nCached,
		Used:          len(a.refs) - a.nList,
		Cached:        a.nCached,
		Evictions:     a.evictions,
		PrefixQueries: a.queries,
		PrefixHits:    a.hits,
	}
}

// ref takes a reference on b, removing it from the LRU list if it was there.
func (a *Allocator) ref(b int32) {
	if a.refs[b] == 0 {
		a.unlink(b)
	}
	a.refs[b]++
}

func (a *Allocator) pushTail(b int32) {
	a.prev[b], a.next[b] = a.tail, -1
	if a.tail >= 0 {
		a.next[a.tail] = b
	} else {
		a.head = b
	}
	a.tail = b
	a.inList[b] = true
	a.nList++
	if a.hashed[b] {
		a.nCached++
	}
}

func (a *Allocator) unlink(b int32) {
	if !a.inList[b] {
		return
	}
	p, n := a.prev[b], a.next[b]
	if p >= 0 {
		a.next[p] = n
	} else {
		a.head = n
	}
	if n >= 0 {
		a.prev[n] = p
	} else {
		a.tail = p
	}
	a.inList[b] = false
	a.nList--
	if a.hashed[b] {
		a.nCached--
	}
}
