package reuseplan

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
)

// KeySize is the size of a chunk key in bytes.
const KeySize = 32

// Key identifies a stored chunk: a SHA-256 of the chunk's prefix chain (see
// chunkstore.ChainKeys). A Key is a plain value, safe to copy and compare.
type Key [KeySize]byte

// String is the lowercase hex form of the key (also the chunk file's name).
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// KeyFromBytes converts the raw bytes of a key (as carried in RPCs) to a
// Key; any length other than KeySize is an error.
func KeyFromBytes(b []byte) (Key, error) {
	var k Key
	if len(b) != KeySize {
		return k, fmt.Errorf("reuseplan: key has %d bytes, want %d", len(b), KeySize)
	}
	copy(k[:], b)
	return k, nil
}

// Range is a half-open range of token positions [Start, End).
type Range struct {
	Start, End int
}

// Len is the number of positions in r (0 when empty).
func (r Range) Len() int { return max(0, r.End-r.Start) }

// Empty reports whether r holds no position.
func (r Range) Empty() bool { return r.End <= r.Start }

// Intersect returns the positions in both r and o (possibly empty).
func (r Range) Intersect(o Range) Range {
	return Range{max(r.Start, o.Start), min(r.End, o.End)}
}

// Subtract returns r minus every range of minus, in order.
func (r Range) Subtract(minus []Range) []Range {
	if r.Empty() {
		return nil
	}
	out := []Range{r}
	for _, m := range minus {
		if m.Empty() {
			continue
		}
		var next []Range
		for _, o := range out { // the parts of o before and after m
			for _, part := range [2]Range{{o.Start, min(o.End, m.Start)}, {max(o.Start, m.End), o.End}} {
				if !part.Empty() {
					next = append(next, part)
				}
			}
		}
		out = next
	}
	return out
}

// Merge sorts rs and merges the ranges that overlap or touch, dropping empty
// ones. It reuses rs's storage.
func Merge(rs []Range) []Range {
	rs = slices.DeleteFunc(rs, Range.Empty)
	slices.SortFunc(rs, func(a, b Range) int { return cmp.Compare(a.Start, b.Start) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && r.Start <= out[n-1].End {
			out[n-1].End = max(out[n-1].End, r.End)
			continue
		}
		out = append(out, r)
	}
	return out
}

// Match is a token-exact reused range: the stored tokens
// [StoredStart, StoredStart+Cur.Len()) of a stored sequence equal the
// current prompt's Cur.
type Match struct {
	// Cur is the range of the current prompt.
	Cur Range
	// StoredStart is the position of Cur.Start in the stored sequence.
	StoredStart int
	// Prefix marks the prefix leg: StoredStart == Cur.Start, and the keys
	// need no re-RoPE.
	Prefix bool
	// Keys are the stored chunks that the stored range spans, in order:
	// Keys[i] holds stored positions [FirstChunkStart+i·cs, …+cs).
	Keys []Key
	// FirstChunkStart is the stored position of Keys[0]'s first token.
	FirstChunkStart int
}

// Stored is the match's range in the stored sequence.
func (m Match) Stored() Range { return Range{m.StoredStart, m.StoredStart + m.Cur.Len()} }

// Validate checks m for chunks of cs tokens and prompts of at most maxTokens
// tokens (current range, stored range covered by the keys, a prefix match at
// its own position); matches from outside must pass it before
// [Match.Segments].
func (m Match) Validate(cs, maxTokens int) error {
	ss := m.StoredStart
	switch {
	case cs <= 0:
		return fmt.Errorf("chunk size %d", cs)
	case m.Cur.Start < 0 || m.Cur.Empty() || m.Cur.End > maxTokens:
		return fmt.Errorf("current range [%d,%d)", m.Cur.Start, m.Cur.End)
	case ss < 0 || ss > maxTokens:
		return fmt.Errorf("stored start %d", ss)
	case m.FirstChunkStart < 0 || m.FirstChunkStart > ss:
		return fmt.Errorf("first chunk start %d after stored start %d", m.FirstChunkStart, ss)
	case m.Prefix && ss != m.Cur.Start:
		return fmt.Errorf("prefix match with stored start %d != current start %d", ss, m.Cur.Start)
	}
	if last := (m.Stored().End - 1 - m.FirstChunkStart) / cs; last >= len(m.Keys) {
		return fmt.Errorf("%d chunk keys for stored range [%d,%d) from %d", len(m.Keys), ss, m.Stored().End, m.FirstChunkStart)
	}
	return nil
}

// Clip restricts m to the current positions inside r, dropping the keys of
// chunks it no longer touches; false when nothing is left.
func (m Match) Clip(r Range, cs int) (Match, bool) {
	cur := m.Cur.Intersect(r)
	if cur.Empty() {
		return Match{}, false
	}
	c := m
	c.StoredStart += cur.Start - m.Cur.Start
	c.Cur = cur
	if cs > 0 && len(c.Keys) > 0 {
		if last := (c.Stored().End - 1 - c.FirstChunkStart) / cs; last >= 0 && last+1 < len(c.Keys) {
			c.Keys = c.Keys[:last+1]
		}
		if k := min((c.StoredStart-c.FirstChunkStart)/cs, len(c.Keys)); k > 0 {
			c.Keys = c.Keys[k:]
			c.FirstChunkStart += k * cs
		}
	}
	return c, true
}

// Runs cuts m into the maximal runs of its chunks for which usable is true,
// each a Match of its own (see [Match.Clip]; the blend server serves only
// chunks it holds).
func (m Match) Runs(cs int, usable func(Key) bool) []Match {
	var out []Match
	off := m.Cur.Start - m.StoredStart + m.FirstChunkStart // current position of Keys[0]'s start
	for j := 0; j < len(m.Keys); j++ {
		if !usable(m.Keys[j]) {
			continue
		}
		k := j + 1
		for k < len(m.Keys) && usable(m.Keys[k]) {
			k++
		}
		if c, ok := m.Clip(Range{off + j*cs, off + k*cs}, cs); ok {
			out = append(out, c)
		}
		j = k
	}
	return out
}

// Segment is the part of a match that lies in one stored chunk.
type Segment struct {
	// Key is the chunk.
	Key Key
	// ChunkOff is the segment's first token within the chunk.
	ChunkOff int
	// Cur is where the segment goes in the current prompt.
	Cur Range
	// Shift is true for non-prefix matches: K needs re-RoPE by
	// Cur.Start-(chunk start+ChunkOff).
	Shift bool
}

// Segments cuts a validated match into its per-chunk segments, in order.
func (m Match) Segments(cs int) []Segment {
	st := m.Stored()
	first, last := (st.Start-m.FirstChunkStart)/cs, (st.End-1-m.FirstChunkStart)/cs
	out := make([]Segment, 0, last-first+1)
	for j := first; j <= last; j++ {
		c0 := m.FirstChunkStart + j*cs
		part := st.Intersect(Range{c0, c0 + cs})
		cur := m.Cur.Start + (part.Start - st.Start)
		out = append(out, Segment{Key: m.Keys[j], ChunkOff: part.Start - c0,
			Cur: Range{cur, cur + part.Len()}, Shift: !m.Prefix})
	}
	return out
}

// Window bounds one retrieve pass (positions below from were written by an
// earlier pass, positions from capacity on have no block yet): the part of s
// to write now and the number of positions a later pass must write.
func (s Segment) Window(from, capacity int) (write Range, dropped int) {
	todo := Range{max(s.Cur.Start, from), s.Cur.End}
	write = todo.Intersect(Range{todo.Start, capacity})
	return write, todo.Len() - write.Len()
}

// Plan is the CacheBlend plan of one request: which matches the worker
// loads and where computation starts. Build it with [New].
type Plan struct {
	// ChunkSize is the stored chunk size in tokens.
	ChunkSize int
	// RecompRatio is the fraction of reused tokens the forward recomputes.
	RecompRatio float64
	// Start is the first position computed: everything before it is in the
	// engine's prefix cache or loaded through the prefix leg.
	Start int
	// Matches are sorted by Cur.Start and disjoint.
	Matches []Match
}

// ErrEmpty is returned by [New] when nothing is reused.
var ErrEmpty = errors.New("reuseplan: nothing to reuse")

// New builds the plan of a prompt of total tokens whose first local tokens
// are in the engine's own prefix cache: matches are clipped to [local,
// total) (cached blocks are never written), invalid or overlapping ones
// dropped (the earlier kept), and Start is local extended through the
// following prefix matches, at most total-1 (a token is always computed, to
// sample from). It returns ErrEmpty when no match is left.
func New(matches []Match, cs, local, total int, recompRatio float64) (Plan, error) {
	p := Plan{ChunkSize: cs, RecompRatio: recompRatio, Start: local}
	for _, m := range matches {
		if m.Cur.End > total || m.Validate(cs, math.MaxInt32) != nil {
			continue // not a usable match
		}
		if c, ok := m.Clip(Range{local, total}, cs); ok {
			p.Matches = append(p.Matches, c)
		}
	}
	slices.SortStableFunc(p.Matches, func(a, b Match) int { return cmp.Compare(a.Cur.Start, b.Cur.Start) })
	end := 0
	p.Matches = slices.DeleteFunc(p.Matches, func(m Match) bool {
		if m.Cur.Start < end {
			return true
		}
		end = m.Cur.End
		return false
	})
	if len(p.Matches) == 0 {
		return Plan{}, ErrEmpty
	}
	for _, m := range p.Matches {
		if m.Prefix && m.Cur.Start <= p.Start && m.Cur.End > p.Start {
			p.Start = m.Cur.End
		}
	}
	p.Start = min(p.Start, total-1)
	return p, nil
}

// ReusedTokens counts the tokens the plan loads (prefix and non-prefix legs).
func (p Plan) ReusedTokens() int {
	n := 0
	for _, m := range p.Matches {
		n += m.Cur.Len()
	}
	return n
}

// Kind says where a piece of the prompt comes from.
type Kind uint8

// The kinds of [Piece].
const (
	// Cached: the engine's own prefix cache (blocks shared, never written).
	Cached Kind = iota
	// Prefix: loaded through the prefix leg and not computed.
	Prefix
	// Reused: loaded (re-RoPE'd when not a prefix match); only the tokens the
	// check layer selects are recomputed.
	Reused
	// Recompute: computed in full.
	Recompute
)

var kindNames = [...]string{Cached: "cached", Prefix: "prefix", Reused: "reused", Recompute: "recompute"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Piece is one part of the prompt's segmentation.
type Piece struct {
	Kind Kind
	Range
}

// Pieces segments a prompt of total tokens whose first local tokens are
// cached: the pieces are in order, disjoint, non-empty, and cover
// [0, total).
func (p Plan) Pieces(local, total int) []Piece {
	var out []Piece
	add := func(k Kind, r Range) {
		r = r.Intersect(Range{0, total})
		if r.Empty() {
			return
		}
		if n := len(out); n > 0 && out[n-1].Kind == k && out[n-1].End == r.Start {
			out[n-1].End = r.End
			return
		}
		out = append(out, Piece{k, r})
	}
	add(Cached, Range{0, local})
	pos := max(local, 0)
	for _, m := range p.Matches {
		if m.Cur.Start > pos {
			add(Recompute, Range{pos, m.Cur.Start})
		}
		c := m.Cur.Intersect(Range{pos, total})
		add(Prefix, c.Intersect(Range{c.Start, p.Start}))
		add(Reused, c.Intersect(Range{max(c.Start, p.Start), c.End}))
		pos = max(pos, c.End)
	}
	add(Recompute, Range{pos, total})
	return out
}

// Loaded is what a worker has loaded of a plan so far: retrieve passes over
// [0, To), a contiguous exact prefix [?, Prefix) and non-prefix Reused ranges.
// The zero value is nothing loaded.
type Loaded struct {
	// To is the end of the positions retrieve passes covered.
	To int
	// Prefix is the end of the exact prefix loaded from position 0.
	Prefix int
	// Reused are the other loaded ranges.
	Reused []Range
}

// Pending reports whether a retrieve pass over [l.To, capacity) would write
// anything of p.
func (l Loaded) Pending(p Plan, capacity int) bool {
	if capacity <= l.To {
		return false
	}
	for _, m := range p.Matches {
		if m.Cur.End > l.To && m.Cur.Start < capacity {
			return true
		}
	}
	return false
}

// Add records a retrieve pass over [l.To, capacity) that could not serve
// the missing ranges.
func (l *Loaded) Add(p Plan, capacity int, missing []Range) {
	window := Range{l.To, capacity}
	l.To = max(l.To, capacity)
	for _, m := range p.Matches {
		for _, r := range m.Cur.Intersect(window).Subtract(missing) {
			if r.Start == l.Prefix && m.Prefix { // matches are disjoint: m alone holds r
				l.Prefix = r.End
				continue
			}
			l.Reused = append(l.Reused, r)
		}
	}
}

// Forward returns what the forward pass computing [start, end) takes as
// loaded: the exact prefix it skips (at least start) and the reused ranges
// inside [prefix, end).
func (l Loaded) Forward(start, end int) (prefix int, reused []Range) {
	prefix = max(start, min(l.Prefix, end))
	for _, r := range l.Reused {
		if c := r.Intersect(Range{prefix, end}); !c.Empty() {
			reused = append(reused, c)
		}
	}
	return prefix, reused
}
