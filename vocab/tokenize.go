package vocab

import (
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// fragment is a piece of the text being tokenized: raw text text[start:end]
// (tok < 0) or a special token matched by its text.
type fragment struct {
	tok        int32
	start, end int
}

// cIsSpace is C's isspace in the "C" locale.
func cIsSpace(b byte) bool {
	return b == ' ' || (b >= '\t' && b <= '\r')
}

// partition is llama.cpp's tokenizer_st_partition: for each special token,
// longest first, every raw fragment is split at the token's occurrences.
// Control and unknown tokens are matched only with parseSpecial;
// user-defined ones always. A token with the lstrip (rstrip) attribute
// eats the whitespace before (after) it.
func (v *Vocab) partition(text string, parseSpecial bool, frags, spare []fragment, ranks []int32) ([]fragment, []int32) {
	frags = append(frags[:0], fragment{tok: -1, start: 0, end: len(text)})
	// Only the special tokens that occur in text can split it.
	ranks = v.trie.find(text, ranks[:0])
	for _, rank := range ranks {
		id := v.specials[rank]
		attr := v.attrs[id]
		if !parseSpecial && attr&attrSpecial != 0 {
			continue
		}
		tt := v.tokens.at(int(id))
		out := spare[:0]
		for _, f := range frags {
			if f.tok >= 0 {
				out = append(out, f)
				continue
			}
			off, end := f.start, f.end
			for {
				i := strings.Index(text[off:end], tt)
				if i < 0 {
					if end > off {
						out = append(out, fragment{tok: -1, start: off, end: end})
					}
					break
				}
				m := off + i
				if m > off {
					l := m
					if attr&attrLStrip != 0 {
						for l > off && cIsSpace(text[l-1]) {
							l--
						}
					}
					if l > off {
						out = append(out, fragment{tok: -1, start: off, end: l})
					}
				}
				out = append(out, fragment{tok: id, start: m, end: m + len(tt)})
				if m+len(tt) >= end {
					break
				}
				off = m + len(tt)
				if attr&attrRStrip != 0 {
					for off < end && cIsSpace(text[off]) {
						off++
					}
				}
			}
		}
		frags, spare = out, frags
	}
	return frags, ranks
}

// specialTrie finds which special tokens occur in a text.
type specialTrie struct {
	first [256]bool
	edges map[uint32]int32 // node<<8 | byte → child node
	ends  [][]int32        // node → ranks (indexes in Vocab.specials) of the tokens ending there
}

func newSpecialTrie(v *Vocab) *specialTrie {
	t := &specialTrie{edges: map[uint32]int32{}, ends: [][]int32{nil}}
	for rank, id := range v.specials {
		tt := v.tokens.at(int(id))
		t.first[tt[0]] = true
		node := int32(0)
		for i := 0; i < len(tt); i++ {
			k := uint32(node)<<8 | uint32(tt[i])
			next, ok := t.edges[k]
			if !ok {
				next = int32(len(t.ends))
				t.ends = append(t.ends, nil)
				t.edges[k] = next
			}
			node = next
		}
		t.ends[node] = append(t.ends[node], int32(rank))
	}
	return t
}

// find appends to ranks the ranks of the special tokens occurring in text,
// ascending (longest token first, as partition processes them).
func (t *specialTrie) find(text string, ranks []int32) []int32 {
	for i := 0; i < len(text); i++ {
		if !t.first[text[i]] {
			continue
		}
		node := int32(0)
		for j := i; j < len(text); j++ {
			next, ok := t.edges[uint32(node)<<8|uint32(text[j])]
			if !ok {
				break
			}
			node = next
			ranks = append(ranks, t.ends[node]...)
		}
	}
	if len(ranks) > 1 {
		slices.Sort(ranks)
		ranks = slices.Compact(ranks)
	}
	return ranks
}

// scratch holds the buffers of one Tokenize call.
type scratch struct {
	frags, spare []fragment
	ranks        []int32
	cpts         []uint32
	flags        []uint16
	segs, segs2  []int
	pos          []int
	canon        []byte
	enc          []byte
	text         []byte
	syms         []symbol
	queue        mergeQueue
	ids          []int32
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Tokenize is llama_tokenize: the ids of text, with BOS/EOS added as the
// vocabulary says when addSpecial, and control tokens written as text
// (e.g. "<|im_start|>") recognised when parseSpecial. Invalid UTF-8 is
// tokenized as llama.cpp does (each bad byte read as U+FFFD by the gpt2
// pre-tokenizers; byte fallback for llama models).
func (v *Vocab) Tokenize(text string, addSpecial, parseSpecial bool) []int32 {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	var out []int32
	if text != "" {
		sc.frags, sc.ranks = v.partition(text, parseSpecial, sc.frags, sc.spare, sc.ranks)
		out = make([]int32, 0, len(text)/3+2)
	} else {
		sc.frags = sc.frags[:0]
	}
	if addSpecial && v.addBOS {
		out = append(out, v.ids.BOS)
	}
	switch v.model {
	case modelSPM:
		prevSpecial := true // prefix with a space if first or after a special token
		for _, f := range sc.frags {
			if f.tok >= 0 {
				out = append(out, f.tok)
				prevSpecial = true
				continue
			}
			buf := sc.text[:0]
			if v.addSpacePrefix && prevSpecial {
				buf = append(buf, "\u2581"...)
			}
			for _, b := range []byte(text[f.start:f.end]) {
				if b == ' ' {
					buf = append(buf, "\u2581"...)
				} else {
					buf = append(buf, b)
				}
			}
			sc.text = buf
			out = v.spmCut(string(buf), out, sc)
			prevSpecial = false
		}
	case modelBPE:
		for _, f := range sc.frags {
			if f.tok >= 0 {
				out = append(out, f.tok)
				continue
			}
			out = v.bpe(text[f.start:f.end], out, sc)
		}
	}
	if addSpecial && v.addEOS {
		out = append(out, v.ids.EOS)
	}
	return out
}

// Encode is Tokenize(s, false, false): user text, in which special-token
// text such as "<|im_start|>" is plain text (user-defined tokens are still
// matched, as in llama.cpp).
func (v *Vocab) Encode(s string) []int32 { return v.Tokenize(s, false, false) }

// EncodeSpecial is Tokenize(s, false, true): text such as a rendered chat
// template, whose special-token text becomes the special tokens.
func (v *Vocab) EncodeSpecial(s string) []int32 { return v.Tokenize(s, false, true) }

// symbol is a piece of a word during merging: text[start:start+n], linked
// to its neighbours (n == 0: merged away).
type symbol struct {
	prev, next int32
	start, n   int32
}

// spmCut tokenizes text (a raw fragment with spaces escaped) as spm does,
// cut where no merge can cross: between two characters that are adjacent
// in no token. Every merged symbol is a token, and the first symbol to
// span such a cut would be a token holding the pair, so the pieces merge
// independently, in the same order (highest score, then leftmost, within
// each piece) and to the same ids as the whole text; short pieces come
// from the word cache.
func (v *Vocab) spmCut(text string, out []int32, sc *scratch) []int32 {
	start, prevKey := 0, uint32(0)
	for off, n := range chars(text) {
		key := charKey(text[off : off+n])
		if off > start && !v.spmPairs.has(prevKey, key) {
			out = v.spmCached(text[start:off], out, sc)
			start = off
		}
		prevKey = key
	}
	return v.spmCached(text[start:], out, sc)
}

func (v *Vocab) spmCached(text string, out []int32, sc *scratch) []int32 {
	if len(text) > maxCachedWord {
		return v.spm(text, out, sc)
	}
	if ids, ok := v.cache.get(text); ok {
		return append(out, ids...)
	}
	n0 := len(out)
	out = v.spm(text, out, sc)
	v.cache.put(text, out[n0:])
	return out
}

// charKey packs a character of at most 4 bytes into a uint32 (big-endian,
// zero-padded: different characters may share a key, which only makes
// spmCut cut less).
func charKey(c string) uint32 {
	var k uint32
	for i := 0; i < 4; i++ {
		k <<= 8
		if i < len(c) {
			k |= uint32(c[i])
		}
	}
	return k
}

// pairSet holds the pairs of characters adjacent in some token.
type pairSet map[uint64]struct{}

func (p pairSet) has(a, b uint32) bool {
	_, ok := p[uint64(a)<<32|uint64(b)]
	return ok
}

// spmPairSet collects the adjacent character pairs of every token, the
// characters cut as spm cuts text (by lead byte, clipped at the end).
func spmPairSet(tokens texts) pairSet {
	p := pairSet{}
	for _, t := range tokens.all() {
		prev := uint32(0)
		for off, n := range chars(t) {
			k := charKey(t[off : off+n])
			if off > 0 {
				p[uint64(prev)<<32|uint64(k)] = struct{}{}
			}
			prev = k
		}
	}
	return p
}

// spm is llm_tokenizer_spm_session::tokenize: the characters of text are
// merged, highest-scoring pair first (leftmost on ties), while the merged
// text is a token; what is left that is not a token is written as its
// bytes (<0xNN>).
func (v *Vocab) spm(text string, out []int32, sc *scratch) []int32 {
	syms := mergeSymbols(text, sc, func(l, r symbol) (float64, bool) {
		id, ok := v.toID.id(text[l.start : l.start+l.n+r.n])
		if !ok {
			return 0, false
		}
		return -float64(v.scores[id]), true // the highest score first
	})
	for i := int32(0); i != -1 && len(syms) > 0; i = syms[i].next {
		s := text[syms[i].start : syms[i].start+syms[i].n]
		if id, ok := v.toID.id(s); ok {
			out = append(out, id)
			continue
		}
		for _, c := range []byte(s) {
			if id := v.byteTok[c]; id >= 0 {
				out = append(out, id)
			}
		}
	}
	return out
}

// mergeSymbols cuts text into characters (by lead byte, clipped at the
// end) and merges adjacent symbols, lowest cost first (leftmost on ties),
// while cost accepts a pair. It returns the symbols, the remaining ones
// linked from index 0 (none for empty text); they live in sc until the
// next call.
func mergeSymbols(text string, sc *scratch, cost func(l, r symbol) (float64, bool)) []symbol {
	syms := sc.syms[:0]
	for off, n := range chars(text) {
		i := int32(len(syms))
		syms = append(syms, symbol{prev: i - 1, next: i + 1, start: int32(off), n: int32(n)})
	}
	if len(syms) == 0 {
		return syms
	}
	syms[len(syms)-1].next = -1
	q := sc.queue[:0]
	try := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		if c, ok := cost(syms[l], syms[r]); ok {
			q.push(bigram{left: l, right: r, cost: c, size: syms[l].n + syms[r].n})
		}
	}
	for i := int32(1); i < int32(len(syms)); i++ {
		try(i-1, i)
	}
	for len(q) > 0 {
		b := q.pop()
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		try(l.prev, b.left)
		try(b.left, l.next)
	}
	sc.syms, sc.queue = syms, q
	return syms
}

// bpe tokenizes one raw fragment of a gpt2 model: pre-tokenized into
// words, each byte-level encoded and merged.
func (v *Vocab) bpe(text string, out []int32, sc *scratch) []int32 {
	canon, bounds := v.words(text, sc)
	for i := 0; i+1 < len(bounds); i++ {
		out = v.bpeWord(canon[bounds[i]:bounds[i+1]], out, sc)
	}
	return out
}

// words splits text with the pre-tokenizer (llama.cpp's
// unicode_regex_split) and returns the text as llama.cpp rebuilds it from
// its codepoints (each invalid byte replaced by U+FFFD) with the byte
// offsets of the word boundaries.
func (v *Vocab) words(text string, sc *scratch) (string, []int) {
	cpts := appendCpts(sc.cpts[:0], text)
	flags := sc.flags[:0]
	t := bmpFlags()
	for _, c := range cpts {
		flags = append(flags, cptFlags(t, c))
	}
	segs, spare := split(v.split, cpts, flags, sc.segs, sc.segs2)
	canon := text
	pos := sc.pos[:0]
	if utf8.ValidString(text) {
		// Valid UTF-8 is read as llama.cpp reads it and rebuilt unchanged.
		pos = append(pos, 0)
		off := 0
		for _, seg := range segs {
			for k := 0; k < seg; k++ {
				_, n := decodeCpt(text, off)
				off += n
			}
			pos = append(pos, off)
		}
	} else {
		b := sc.canon[:0]
		pos = append(pos, 0)
		ci := 0
		for _, seg := range segs {
			for _, c := range cpts[ci : ci+seg] {
				b = appendCptUTF8(b, c)
			}
			ci += seg
			pos = append(pos, len(b))
		}
		sc.canon = b
		canon = string(b)
	}
	sc.cpts, sc.flags, sc.segs, sc.segs2, sc.pos = cpts, flags, segs, spare, pos
	return canon, pos
}

// maxCachedWord is the longest word (in bytes) whose ids are cached.
const maxCachedWord = 48

// bpeWord is llm_tokenizer_bpe_session::tokenize for one word: the word is
// byte-level encoded, then adjacent symbols are merged lowest merge rank
// first (leftmost on ties); a final symbol that is not a token is written
// as the tokens of its single bytes, when they are tokens.
func (v *Vocab) bpeWord(word string, out []int32, sc *scratch) []int32 {
	if len(word) <= maxCachedWord {
		if ids, ok := v.cache.get(word); ok {
			return append(out, ids...)
		}
	}
	n0 := len(out)
	enc := sc.enc[:0]
	for _, b := range []byte(word) {
		enc = append(enc, byteToUnicode[b]...)
	}
	sc.enc = enc
	text := string(enc)
	out = v.mergeWord(text, out, sc)
	if len(word) <= maxCachedWord {
		v.cache.put(word, out[n0:])
	}
	return out
}

func (v *Vocab) mergeWord(text string, out []int32, sc *scratch) []int32 {
	if v.pre.ignoreMerges {
		if id, ok := v.toID.id(text); ok {
			return append(out, id)
		}
	}
	syms := mergeSymbols(text, sc, func(l, r symbol) (float64, bool) {
		rank, ok := v.rank(text[l.start:l.start+l.n], text[r.start:r.start+r.n])
		return float64(rank), ok
	})
	for i := int32(0); i != -1 && len(syms) > 0; i = syms[i].next {
		s := text[syms[i].start : syms[i].start+syms[i].n]
		if id, ok := v.toID.id(s); ok {
			out = append(out, id)
			continue
		}
		for j := 0; j < len(s); j++ {
			if id, ok := v.toID.id(s[j : j+1]); ok {
				out = append(out, id)
			}
		}
	}
	return out
}

// bigram is a candidate merge of two adjacent symbols of size bytes
// together; the queue pops the lowest cost (a gpt2 merge's rank, a llama
// merge's negated score), then the leftmost.
type bigram struct {
	left, right, size int32
	cost              float64
}

func (a bigram) before(b bigram) bool {
	return a.cost < b.cost || (a.cost == b.cost && a.left < b.left)
}

// mergeQueue is a binary min-heap of merge candidates ordered by before.
type mergeQueue []bigram

func (q *mergeQueue) push(b bigram) {
	h := append(*q, b)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].before(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	*q = h
}

func (q *mergeQueue) pop() bigram {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		m := l
		if r := l + 1; r < len(h) && h[r].before(h[l]) {
			m = r
		}
		if !h[m].before(h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}

// wordCache remembers the ids of short words; bounded (cleared when full)
// and safe for concurrent use.
type wordCache struct {
	mu sync.RWMutex
	m  map[string][]int32
}

// maxCacheWords bounds a wordCache.
const maxCacheWords = 1 << 15

func newWordCache() *wordCache { return &wordCache{m: make(map[string][]int32)} }

func (c *wordCache) get(w string) ([]int32, bool) {
	c.mu.RLock()
	ids, ok := c.m[w]
	c.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []int32) {
	c.mu.Lock()
	if len(c.m) >= maxCacheWords {
		clear(c.m)
	}
	c.m[strings.Clone(w)] = append([]int32(nil), ids...)
	c.mu.Unlock()
}
