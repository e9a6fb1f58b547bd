package vocab

import (
	"cmp"
	"hash/maphash"
	"math/bits"
	"slices"
)

// tokenIndex finds a token's id by its text: an open-addressing table of
// ids+1 (0: empty) probed linearly from the text's hash, the text compared
// with the vocabulary's own. At most half full (2n to 4n slots for n
// tokens), it takes 8–16 bytes a token where a map[string]int32 takes about
// 45 (151,936 tokens: 2 MiB against 6.8 MB), and it holds no string of its
// own. Immutable after newTokenIndex; safe for concurrent lookups.
type tokenIndex struct {
	seed   maphash.Seed
	slots  []int32
	mask   uint64
	tokens texts
}

// newTokenIndex indexes tokens (distinct texts; a repeated text is
// reported as the id of its first occurrence through dup).
func newTokenIndex(tokens texts) (ix tokenIndex, dupOf, dup int32) {
	size := uint64(1) << max(4, bits.Len(uint(2*tokens.len())))
	ix = tokenIndex{seed: maphash.MakeSeed(), slots: make([]int32, size), mask: size - 1, tokens: tokens}
	for i, t := range tokens.all() {
		h := maphash.String(ix.seed, t) & ix.mask
		for ; ix.slots[h] != 0; h = (h + 1) & ix.mask {
			if j := ix.slots[h] - 1; tokens.at(int(j)) == t {
				return ix, j, int32(i)
			}
		}
		ix.slots[h] = int32(i) + 1
	}
	return ix, -1, -1
}

// id returns the id whose text is t.
func (ix *tokenIndex) id(t string) (int32, bool) {
	if len(ix.slots) == 0 {
		return 0, false
	}
	for h := maphash.String(ix.seed, t) & ix.mask; ix.slots[h] != 0; h = (h + 1) & ix.mask {
		if j := ix.slots[h] - 1; ix.tokens.at(int(j)) == t {
			return j, true
		}
	}
	return 0, false
}

// mergeRanks holds a gpt2 vocabulary's merge ranks by the ids of the
// merge's two sides, in compressed rows: the merges whose left side is
// token l are right[start[l]:start[l+1]] (ascending) with their ranks —
// 8 bytes a merge and 4 a token (151,387 merges of a 151,936-token
// vocabulary: 1.8 MB, against 4.2 in a map[uint64]int32 and 12.3 keyed by
// the sides' strings). Merges with a side that is no token, which a
// well-formed vocabulary does not have, keep their texts in other.
type mergeRanks struct {
	start       []uint32
	right, rank []int32
	other       map[pair]int32
}

// idMerge is a merge of tokens l and r of rank k.
type idMerge struct{ l, r, k int32 }

// setByID stores ms (merges between tokens of a vocabulary of n), the
// first rank of a merge listed twice.
func (m *mergeRanks) setByID(n int, ms []idMerge) {
	slices.SortFunc(ms, func(a, b idMerge) int {
		return cmp.Or(cmp.Compare(a.l, b.l), cmp.Compare(a.r, b.r), cmp.Compare(a.k, b.k))
	})
	ms = slices.CompactFunc(ms, func(a, b idMerge) bool { return a.l == b.l && a.r == b.r })
	m.start = make([]uint32, n+1)
	m.right, m.rank = make([]int32, len(ms)), make([]int32, len(ms))
	for i, x := range ms {
		m.start[x.l+1]++
		m.right[i], m.rank[i] = x.r, x.k
	}
	for l := range n {
		m.start[l+1] += m.start[l]
	}
}

// rank returns the rank of merging left and right.
func (v *Vocab) rank(left, right string) (int32, bool) {
	l, lok := v.toID.id(left)
	r, rok := v.toID.id(right)
	if lok && rok {
		if len(v.ranks.start) == 0 {
			return 0, false
		}
		lo, hi := v.ranks.start[l], v.ranks.start[l+1]
		if i, ok := slices.BinarySearch(v.ranks.right[lo:hi], r); ok {
			return v.ranks.rank[int(lo)+i], true
		}
		return 0, false
	}
	k, ok := v.ranks.other[pair{left, right}]
	return k, ok
}
