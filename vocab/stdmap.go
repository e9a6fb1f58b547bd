package vocab

import "encoding/binary"

// llama.cpp finds EOT, EOM and the FIM tokens by iterating its token→id
// std::unordered_map and taking the first token whose text is a candidate;
// when a vocabulary has several candidates, which one wins depends on the
// map's iteration order. To choose the same one, this file reproduces that
// order for the map llama.cpp builds (inserting token 0, 1, … in order with
// operator[]) as libstdc++ (GCC's standard library, which the prebuilt
// llama.cpp libraries use) lays it out: std::hash<std::string> is
// _Hash_bytes (64-bit MurmurHash2 variant, seed 0xc70f6907), buckets are a
// prime number growing along _Prime_rehash_policy's sequence at load factor
// 1, and nodes form one singly linked list in which a node goes first in
// its bucket, or first in the list when its bucket was empty.

// stdHash is libstdc++'s std::hash<std::string> on 64-bit platforms.
func stdHash(s string) uint64 {
	const mul = 0xc6a4a793<<32 + 0x5bd1e995
	shiftMix := func(v uint64) uint64 { return v ^ v>>47 }
	h := uint64(0xc70f6907) ^ uint64(len(s))*mul
	aligned := len(s) &^ 7
	for p := 0; p < aligned; p += 8 {
		h ^= shiftMix(binary.LittleEndian.Uint64([]byte(s[p:p+8]))*mul) * mul
		h *= mul
	}
	if r := len(s) & 7; r != 0 {
		var d uint64
		for i := len(s) - 1; i >= aligned; i-- {
			d = d<<8 | uint64(s[i])
		}
		h ^= d
		h *= mul
	}
	h = shiftMix(h) * mul
	return shiftMix(h)
}

// stdBuckets are the bucket counts of a libstdc++ unordered_map growing
// one insertion at a time from empty: the map moves to stdBuckets[k] when
// an insertion would make its size exceed stdBuckets[k-1] (0 before the
// first).
var stdBuckets = []uint64{13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229,
	172933, 351061, 712697, 1447153, 2938679, 5967347, 12117689, 24607243, 49969847}

// stdMapOrder returns the ids of tokens in the order a libstdc++
// std::unordered_map<std::string, int> iterates them after tokens[0],
// tokens[1], … were inserted in turn (texts distinct); nil past the
// largest bucket count known.
func stdMapOrder(tokens texts) []int32 {
	n := tokens.len()
	if n == 0 || uint64(n) > stdBuckets[len(stdBuckets)-1] {
		return nil
	}
	const (
		empty  = -2 // bucket with no node
		before = -1 // the list head ("before begin") precedes the bucket
	)
	hash := make([]uint64, n)
	next := make([]int32, n)
	head := int32(-1)
	var buckets []int32
	var nb uint64
	// link inserts node as libstdc++'s _M_insert_bucket_begin (and
	// _M_rehash_aux, moving the nodes in list order) do.
	link := func(node int32) {
		b := hash[node] % nb
		switch prev := buckets[b]; prev {
		case empty:
			next[node] = head
			head = node
			if next[node] != -1 {
				buckets[hash[next[node]]%nb] = node
			}
			buckets[b] = before
		case before:
			next[node] = head
			head = node
		default:
			next[node] = next[prev]
			next[prev] = node
		}
	}
	k := 0
	for i := range n {
		hash[i] = stdHash(tokens.at(i))
		if uint64(i)+1 > nb {
			p := head
			buckets, nb, head = make([]int32, stdBuckets[k]), stdBuckets[k], -1
			k++
			for b := range buckets {
				buckets[b] = empty
			}
			for p != -1 {
				nx := next[p]
				link(p)
				p = nx
			}
		}
		link(int32(i))
	}
	order := make([]int32, 0, n)
	for p := head; p != -1; p = next[p] {
		order = append(order, p)
	}
	return order
}
