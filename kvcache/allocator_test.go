package kvcache

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

func checkSum(t *testing.T, a *Allocator) AllocatorStats {
	t.Helper()
	s := a.Stats()
	if s.Free+s.Used+s.Cached != s.NumBlocks {
		t.Fatalf("free %d + used %d + cached %d != pool %d", s.Free, s.Used, s.Cached, s.NumBlocks)
	}
	return s
}

func seq(n int, base int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = base + int32(i)
	}
	return out
}

func TestNewAllocatorRejectsBadSizes(t *testing.T) {
	for _, tc := range []struct {
		name          string
		blocks, bsize int
	}{
		{"zero blocks", 0, 16},
		{"negative blocks", -1, 16},
		{"zero block size", 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewAllocator(tc.blocks, tc.bsize); !errors.Is(err, ErrBadLayout) {
				t.Fatalf("err = %v, want ErrBadLayout", err)
			}
		})
	}
}

func TestChainHashes(t *testing.T) {
	a := seq(40, 0)
	b := slices.Clone(a)
	b[20] = 999 // differs in the second block

	ha := ChainHashes(nil, a, 16)
	hb := ChainHashes(nil, b, 16)
	if len(ha) != 2 || len(hb) != 2 {
		t.Fatalf("got %d and %d hashes, want 2 full blocks each", len(ha), len(hb))
	}
	if ha[0] != hb[0] {
		t.Error("same first block, different hash")
	}
	if ha[1] == hb[1] {
		t.Error("different second block, same hash")
	}
	// The chain: the same block content after a different prefix hashes differently.
	c := slices.Concat(seq(16, 100), a[16:32])
	if hc := ChainHashes(nil, c, 16); hc[1] == ha[1] {
		t.Error("block hash does not depend on its prefix")
	}
	// Incremental extension equals hashing from scratch.
	inc := ChainHashes(nil, a[:20], 16)
	inc = ChainHashes(inc, seq(48, 0), 16)
	if !slices.Equal(inc, ChainHashes(nil, seq(48, 0), 16)) {
		t.Error("incremental chain differs from a full one")
	}
	if got := ChainHashes(nil, a, 0); got != nil {
		t.Error("block size 0 hashed something")
	}
}

func TestAllocateFreeStates(t *testing.T) {
	a, err := NewAllocator(8, 16)
	if err != nil {
		t.Fatal(err)
	}
	if s := checkSum(t, a); s.Free != 8 || s.Used != 0 || s.Cached != 0 {
		t.Fatalf("fresh stats %+v", s)
	}
	blocks, err := a.Allocate(3)
	if err != nil {
		t.Fatal(err)
	}
	if s := checkSum(t, a); s.Used != 3 || s.Free != 5 {
		t.Fatalf("after allocate: %+v", s)
	}
	// Commit the first two as full blocks of a sequence.
	h := ChainHashes(nil, seq(32, 0), 16)
	for i := range 2 {
		if ok, err := a.Commit(blocks[i], h[i]); !ok || err != nil {
			t.Fatalf("commit %d: %v %v", i, ok, err)
		}
	}
	if err := a.Free(blocks); err != nil {
		t.Fatal(err)
	}
	if s := checkSum(t, a); s.Used != 0 || s.Cached != 2 || s.Free != 6 {
		t.Fatalf("after free: %+v", s)
	}
	// Double free is an error and changes nothing.
	if err := a.Free(blocks[:1]); !errors.Is(err, ErrBadBlock) {
		t.Fatalf("double free err = %v", err)
	}
	if err := a.Free([]int32{42}); !errors.Is(err, ErrBadBlock) {
		t.Fatalf("unknown block err = %v", err)
	}
	checkSum(t, a)
	if _, err := a.Commit(blocks[0], h[0]); !errors.Is(err, ErrBadBlock) {
		t.Fatalf("commit without reference err = %v", err)
	}
}

func TestPrefixCacheHitAndShare(t *testing.T) {
	a, _ := NewAllocator(8, 4)
	toks := seq(12, 7)
	h := ChainHashes(nil, toks, 4)
	blocks, _ := a.Allocate(3)
	for i := range 3 {
		if _, err := a.Commit(blocks[i], h[i]); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.CachedPrefix(h); n != 3 {
		t.Fatalf("CachedPrefix = %d, want 3", n)
	}
	// A second sequence with the same first 8 tokens shares 2 blocks while the first still runs.
	other := slices.Concat(toks[:8], []int32{1, 2, 3, 4})
	got := a.Acquire(ChainHashes(nil, other, 4))
	if !slices.Equal(got, blocks[:2]) {
		t.Fatalf("Acquire = %v, want %v", got, blocks[:2])
	}
	s := checkSum(t, a)
	if s.Used != 3 || s.PrefixQueries != 3 || s.PrefixHits != 2 {
		t.Fatalf("stats %+v", s)
	}
	// Releasing the first sequence keeps the shared blocks used, the third cached.
	_ = a.Free(blocks)
	if s := checkSum(t, a); s.Used != 2 || s.Cached != 1 {
		t.Fatalf("after first free: %+v", s)
	}
	_ = a.Free(got)
	if s := checkSum(t, a); s.Used != 0 || s.Cached != 3 {
		t.Fatalf("after second free: %+v", s)
	}
	// A re-acquire of a cached block takes it off the LRU list.
	again := a.Acquire(h[:1])
	if len(again) != 1 || again[0] != blocks[0] {
		t.Fatalf("re-acquire = %v", again)
	}
	if s := checkSum(t, a); s.Used != 1 || s.Cached != 2 {
		t.Fatalf("after re-acquire: %+v", s)
	}
	// Committing a hash another block holds is refused.
	nb, _ := a.Allocate(1)
	if ok, err := a.Commit(nb[0], h[0]); ok || err != nil {
		t.Fatalf("duplicate commit = %v, %v", ok, err)
	}
}

func TestEvictionIsLRUAndCounted(t *testing.T) {
	a, _ := NewAllocator(4, 2)
	toks := seq(8, 0)
	h := ChainHashes(nil, toks, 2)
	blocks, _ := a.Allocate(4)
	for i, b := range blocks {
		_, _ = a.Commit(b, h[i])
	}
	_ = a.Free(blocks) // tail order: b3, b2, b1, b0 (last block evicted first)
	if s := checkSum(t, a); s.Cached != 4 {
		t.Fatalf("stats %+v", s)
	}
	got, err := a.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != blocks[3] {
		t.Fatalf("evicted %d first, want the sequence's last block %d", got[0], blocks[3])
	}
	s := checkSum(t, a)
	if s.Evictions != 1 || s.Cached != 3 || s.Used != 1 {
		t.Fatalf("stats after eviction %+v", s)
	}
	if n := a.CachedPrefix(h); n != 3 {
		t.Fatalf("prefix after evicting the tail = %d, want 3", n)
	}
	if _, err := a.Allocate(4); !errors.Is(err, ErrNoFreeBlocks) {
		t.Fatalf("over-allocation err = %v", err)
	}
	if s2 := checkSum(t, a); s2 != s {
		t.Fatalf("failed allocation changed stats: %+v -> %+v", s, s2)
	}
}

// TestRandomOpsKeepInvariants drives the allocator with random operations and
// checks the state sum and reference accounting against a model.
func TestRandomOpsKeepInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	a, _ := NewAllocator(32, 4)
	var held [][]int32
	for step := range 5000 {
		switch op := r.IntN(4); {
		case op == 0 || len(held) == 0:
			n := r.IntN(6)
			toks := seq(n*4, int32(r.IntN(3))) // few distinct prefixes: real sharing
			hashes := ChainHashes(nil, toks, 4)
			got := a.Acquire(hashes)
			fresh, err := a.Allocate(n - len(got))
			if err != nil {
				_ = a.Free(got)
				continue
			}
			blocks := append(got, fresh...)
			for i := len(got); i < n; i++ {
				_, _ = a.Commit(blocks[i], hashes[i])
			}
			held = append(held, blocks)
		default:
			i := r.IntN(len(held))
			if err := a.Free(held[i]); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			held = slices.Delete(held, i, i+1)
		}
		s := checkSum(t, a)
		distinct := map[int32]bool{}
		for _, bl := range held {
			for _, b := range bl {
				distinct[b] = true
			}
		}
		if s.Used != len(distinct) {
			t.Fatalf("step %d: used %d, distinct held %d", step, s.Used, len(distinct))
		}
	}
}

func BenchmarkAllocateFree(b *testing.B) {
	a, _ := NewAllocator(4096, 16)
	toks := seq(16*96, 0)
	hashes := ChainHashes(nil, toks, 16)
	b.ReportAllocs()
	for b.Loop() {
		got := a.Acquire(hashes)
		fresh, err := a.Allocate(len(hashes) - len(got))
		if err != nil {
			b.Fatal(err)
		}
		for i, blk := range fresh {
			_, _ = a.Commit(blk, hashes[len(got)+i])
		}
		_ = a.Free(append(got, fresh...))
	}
}

func BenchmarkChainHashes1536(b *testing.B) {
	toks := seq(1536, 0)
	b.ReportAllocs()
	for b.Loop() {
		_ = ChainHashes(nil, toks, 16)
	}
}

// TestRef: a second owner keeps blocks used until both released them.
func TestRef(t *testing.T) {
	a, err := NewAllocator(4, 16)
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.Allocate(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Ref(got); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(got); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Used != 2 {
		t.Fatalf("after the first owner's free: %+v", st)
	}
	if err := a.Free(got); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Used != 0 || st.Free != 4 {
		t.Fatalf("after both frees: %+v", st)
	}
	if err := a.Ref([]int32{0}); err == nil {
		t.Error("reference on a free block taken")
	}
	if err := a.Ref([]int32{9}); err == nil {
		t.Error("reference on a block outside the pool taken")
	}
	if st := a.Stats(); st.Used != 0 {
		t.Fatalf("refused Ref changed the pool: %+v", st)
	}
}
