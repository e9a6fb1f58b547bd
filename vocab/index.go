package vocab

import (
	"hash/maphash"
	"math/bits"
)

// tokenIndex finds a token's id by its text: an open-addressing table of
// ids+1 (0: empty) probed linearly from the text's hash, the text compared
// with the vocabulary's own. At most half full, it takes 4–8 bytes a token
// where a map[string]int32 takes about 45 (151,936 tokens: 1 MiB against
// 6.8 MB), and it holds no string of its own. Immutable after
// newTokenIndex; safe for concurrent lookups.
type tokenIndex struct {
	seed   maphash.Seed
	slots  []int32
	mask   uint64
	tokens []string
}

// newTokenIndex indexes tokens (distinct texts; a repeated text is
// reported as the id of its first occurrence through dup).
func newTokenIndex(tokens []string) (ix tokenIndex, dupOf, dup int32) {
	size := uint64(1) << max(4, bits.Len(uint(2*len(tokens))))
	ix = tokenIndex{seed: maphash.MakeSeed(), slots: make([]int32, size), mask: size - 1, tokens: tokens}
	for i, t := range tokens {
		h := maphash.String(ix.seed, t) & ix.mask
		for ; ix.slots[h] != 0; h = (h + 1) & ix.mask {
			if j := ix.slots[h] - 1; tokens[j] == t {
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
		if j := ix.slots[h] - 1; ix.tokens[j] == t {
			return j, true
		}
	}
	return 0, false
}

// mergeRanks holds a gpt2 vocabulary's merge ranks keyed by the ids of the
// merge's two sides (8 bytes a key where the sides' strings took 32);
// merges with a side that is no token, which a well-formed vocabulary does
// not have, keep their texts in other.
type mergeRanks struct {
	byID  map[uint64]int32
	other map[pair]int32
}

// rank returns the rank of merging left and right.
func (v *Vocab) rank(left, right string) (int32, bool) {
	l, lok := v.toID.id(left)
	r, rok := v.toID.id(right)
	if lok && rok {
		k, ok := v.ranks.byID[uint64(l)<<32|uint64(r)]
		return k, ok
	}
	k, ok := v.ranks.other[pair{left, right}]
	return k, ok
}
