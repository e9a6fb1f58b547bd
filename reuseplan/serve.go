package reuseplan

// Chunk is the range of chunk i of a sequence of n tokens cut into chunks of
// cs tokens (the last one may be shorter).
func Chunk(i, cs, n int) Range { return Range{i * cs, min((i+1)*cs, n)} }

// WholeChunks is the number of tokens of the whole chunks of cs tokens at the
// start of a sequence of n tokens (the prefix leg keys only those).
func WholeChunks(n, cs int) int { return n / cs * cs }

// Coverage is the number of tokens of n whole chunks of cs tokens.
func Coverage(n, cs int) int { return n * cs }

// Len is the number of tokens the match reuses.
func (m Match) Len() int { return m.Cur.Len() }

// PrefixMatch is the prefix leg's match over the chain keys of a prompt's
// whole chunks of cs tokens: the leading keys for which usable is true, at
// their own positions. False when the first key is not usable.
func PrefixMatch(keys []Key, cs int, usable func(Key) bool) (Match, bool) {
	n := 0
	for n < len(keys) && usable(keys[n]) {
		n++
	}
	if n == 0 {
		return Match{}, false
	}
	return Match{Cur: Range{End: n * cs}, Prefix: true, Keys: keys[:n]}, true
}

// Hits are the hit statistics of one lookup (the attributes of cb.lookup and
// cb.request, the fields of a lookup result).
type Hits struct {
	// Requested is the prompt's length in tokens.
	Requested int
	// Coverage is the prompt's leading tokens covered by stored prefix
	// chunks (the prefix leg), usable or not.
	Coverage int
	// Prefix is the usable part of the coverage: the prefix matches' tokens.
	Prefix int
	// NonPrefix is the non-prefix matches' tokens, all in the complement of
	// the coverage.
	NonPrefix int
}

// HitsOf is the statistics of a lookup of requested tokens whose prefix leg
// found coverageChunks chunks of cs tokens and which answers matches.
func HitsOf(requested, coverageChunks, cs int, matches []Match) Hits {
	h := Hits{Requested: requested, Coverage: Coverage(coverageChunks, cs)}
	for _, m := range matches {
		if m.Prefix {
			h.Prefix += m.Len()
		} else {
			h.NonPrefix += m.Len()
		}
	}
	return h
}

// Tokens is the number of tokens reused: Prefix + NonPrefix.
func (h Hits) Tokens() int { return h.Prefix + h.NonPrefix }

// Rate is Tokens / Requested (0 for an empty prompt).
func (h Hits) Rate() float64 {
	if h.Requested <= 0 {
		return 0
	}
	return float64(h.Tokens()) / float64(h.Requested)
}

// Searched is the complement of the coverage, which the non-prefix leg
// searches: Requested - Coverage.
func (h Hits) Searched() int { return h.Requested - h.Coverage }

// Window cuts the segments of a retrieve pass to their non-empty written
// parts (see [Segment.Window]), in order, and counts the positions a later
// pass must write.
func Window(segs []Segment, from, capacity int) (write []Segment, dropped int) {
	for _, s := range segs {
		w, d := s.Window(from, capacity)
		dropped += d
		if !w.Empty() {
			s.ChunkOff += w.Start - s.Cur.Start
			s.Cur = w
			write = append(write, s)
		}
	}
	return write, dropped
}

// Tokens is the number of positions in rs (disjoint, as [Merge] leaves them).
func Tokens(rs []Range) int {
	n := 0
	for _, r := range rs {
		n += r.Len()
	}
	return n
}

// Ranges is the current ranges of segs, in order.
func Ranges(segs []Segment) []Range {
	out := make([]Range, len(segs))
	for i, s := range segs {
		out[i] = s.Cur
	}
	return out
}
