package vocab

import (
	"iter"
	"unsafe"
)

// texts is a vocabulary's token texts in one immutable buffer: text i is
// data[end[i-1]:end[i]] (from 0 for the first). 4 bytes a token besides
// its bytes, where a []string takes a 16-byte header a token — 2.4 MB at
// Qwen2.5's 151,936 tokens, which the collector also scans and counts as
// live. The zero value holds no token. Safe for concurrent reads.
type texts struct {
	data string
	end  []uint32
}

// newTexts copies tokens into one buffer; their bytes must total less
// than 4 GiB (setTokens checks).
func newTexts(tokens []string) texts {
	total := 0
	for _, t := range tokens {
		total += len(t)
	}
	buf := make([]byte, 0, total)
	end := make([]uint32, len(tokens))
	for i, t := range tokens {
		buf = append(buf, t...)
		end[i] = uint32(len(buf))
	}
	// buf is never written again: the strings over it are immutable.
	return texts{data: unsafe.String(unsafe.SliceData(buf), len(buf)), end: end}
}

// len is the number of texts.
func (t texts) len() int { return len(t.end) }

// at is text i (0 ≤ i < len).
func (t texts) at(i int) string {
	s := uint32(0)
	if i > 0 {
		s = t.end[i-1]
	}
	return t.data[s:t.end[i]]
}

// all yields every id and its text, in order.
func (t texts) all() iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		s := uint32(0)
		for i, e := range t.end {
			if !yield(i, t.data[s:e]) {
				return
			}
			s = e
		}
	}
}
