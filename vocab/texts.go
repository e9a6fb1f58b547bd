package vocab

import (
	"iter"
	"math"
	"unsafe"
)

// texts is strings by id in one buffer: text i is data[end[i-1]:end[i]]
// (from 0 for the first). 4 bytes a text besides its bytes, where a
// []string takes a 16-byte header each — 2.4 MB at Qwen2.5's 151,936
// tokens, which the collector also scans and counts as live. A Vocab keeps
// its token texts and its pieces so. Built by add; the zero value holds
// no text. Safe for concurrent reads once built.
type texts struct {
	data []byte
	end  []uint32
}

// newTexts copies tokens into one buffer; ok is false when their bytes
// reach 4 GiB.
func newTexts(tokens []string) (t texts, ok bool) {
	total := 0
	for _, s := range tokens {
		total += len(s)
	}
	t.data = make([]byte, 0, total)
	t.end = make([]uint32, 0, len(tokens))
	for _, s := range tokens {
		if !t.add(s) {
			return texts{}, false
		}
	}
	return t, true
}

// add appends s as the next text; it returns false, adding nothing, when
// the texts would reach 4 GiB.
func (t *texts) add(s string) bool {
	if uint64(len(t.data))+uint64(len(s)) > math.MaxUint32 {
		return false
	}
	t.data = append(t.data, s...)
	t.end = append(t.end, uint32(len(t.data)))
	return true
}

// len is the number of texts.
func (t texts) len() int { return len(t.end) }

// at is text i (0 ≤ i < len), a string over the buffer, which is never
// written after the texts are built.
func (t texts) at(i int) string {
	s := uint32(0)
	if i > 0 {
		s = t.end[i-1]
	}
	if s == t.end[i] {
		return ""
	}
	return unsafe.String(&t.data[s], t.end[i]-s)
}

// all yields every id and its text, in order.
func (t texts) all() iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		for i := range t.end {
			if !yield(i, t.at(i)) {
				return
			}
		}
	}
}
