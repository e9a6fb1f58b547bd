package reuseplan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func key(i int) Key {
	var k Key
	k[0], k[1] = byte(i), byte(i>>8)
	return k
}

func keys(from, n int) []Key {
	out := make([]Key, n)
	for i := range out {
		out[i] = key(from + i)
	}
	return out
}

func TestNew(t *testing.T) {
	const cs = 4
	pre := Match{Cur: Range{0, 8}, StoredStart: 0, Prefix: true, Keys: keys(0, 2)}
	mid := Match{Cur: Range{10, 14}, StoredStart: 2, Keys: keys(10, 2), FirstChunkStart: 0}
	tests := []struct {
		name      string
		matches   []Match
		local     int
		total     int
		wantErr   bool
		wantStart int
		want      []Match
	}{
		{name: "nothing", total: 20, wantErr: true},
		{name: "prefix and middle", matches: []Match{mid, pre}, total: 20, wantStart: 8, want: []Match{pre, mid}},
		{name: "local cache covers the prefix", matches: []Match{pre, mid}, local: 8, total: 20, wantStart: 8, want: []Match{mid}},
		{name: "prefix clipped at local, keys trimmed", matches: []Match{pre}, local: 4, total: 20, wantStart: 8,
			want: []Match{{Cur: Range{4, 8}, StoredStart: 4, Prefix: true, Keys: keys(1, 1), FirstChunkStart: 4}}},
		{name: "whole prompt reused: last token still computed", matches: []Match{pre}, total: 8, wantStart: 7, want: []Match{pre}},
		{name: "overlap: earlier kept", matches: []Match{mid, {Cur: Range{12, 16}, StoredStart: 0, Keys: keys(20, 1)}}, total: 20, wantStart: 0, want: []Match{mid}},
		{name: "invalid dropped", matches: []Match{{Cur: Range{5, 3}}, {Cur: Range{0, 30}}, {Cur: Range{0, 2}, StoredStart: -1}}, total: 20, wantErr: true},
		{name: "non-prefix at local does not move start", matches: []Match{mid}, local: 10, total: 20, wantStart: 10, want: []Match{mid}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.matches, cs, tc.local, tc.total, 0.15)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("New = %+v, want an error", p)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Start != tc.wantStart {
				t.Errorf("Start = %d, want %d", p.Start, tc.wantStart)
			}
			if fmt.Sprint(p.Matches) != fmt.Sprint(tc.want) {
				t.Errorf("Matches =\n %+v, want\n %+v", p.Matches, tc.want)
			}
		})
	}
}

func TestRuns(t *testing.T) {
	const cs = 4
	// Stored [2, 13) spans chunks 0..3 (keys 0..3); chunk 2 is gone.
	m := Match{Cur: Range{20, 31}, StoredStart: 2, Keys: keys(0, 4)}
	got := m.Runs(cs, func(k Key) bool { return k != key(2) })
	want := []Match{
		{Cur: Range{20, 26}, StoredStart: 2, Keys: keys(0, 2)},
		{Cur: Range{30, 31}, StoredStart: 12, Keys: keys(3, 1), FirstChunkStart: 12},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Runs =\n %+v, want\n %+v", got, want)
	}
	for _, r := range got {
		if err := r.Validate(cs, 100); err != nil {
			t.Errorf("run %+v invalid: %v", r, err)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := Match{Cur: Range{4, 10}, StoredStart: 2, Keys: keys(0, 3)}
	tests := []struct {
		name string
		edit func(m *Match)
		ok   bool
	}{
		{"valid", func(*Match) {}, true},
		{"empty", func(m *Match) { m.Cur.End = m.Cur.Start }, false},
		{"negative", func(m *Match) { m.Cur = Range{-1, 5} }, false},
		{"beyond max", func(m *Match) { m.Cur = Range{90, 101} }, false},
		{"stored negative", func(m *Match) { m.StoredStart = -3 }, false},
		{"first chunk after stored start", func(m *Match) { m.FirstChunkStart = 4 }, false},
		{"too few keys", func(m *Match) { m.Keys = m.Keys[:1] }, false},
		{"prefix at another position", func(m *Match) { m.Prefix = true }, false},
		{"prefix in place", func(m *Match) { m.Prefix, m.StoredStart = true, 4; m.Keys = keys(0, 3) }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := ok
			m.Keys = slices.Clone(ok.Keys)
			tc.edit(&m)
			err := m.Validate(4, 100)
			if (err == nil) != tc.ok {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", m, err, tc.ok)
			}
		})
	}
}

func TestRangeSubtractMerge(t *testing.T) {
	tests := []struct {
		name  string
		r     Range
		minus []Range
		want  []Range
	}{
		{"none", Range{0, 10}, nil, []Range{{0, 10}}},
		{"middle", Range{0, 10}, []Range{{3, 5}}, []Range{{0, 3}, {5, 10}}},
		{"all", Range{2, 4}, []Range{{0, 10}}, nil},
		{"edges", Range{0, 10}, []Range{{0, 2}, {8, 12}}, []Range{{2, 8}}},
		{"empty minus", Range{0, 3}, []Range{{2, 2}}, []Range{{0, 3}}},
		{"empty r", Range{3, 3}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.Subtract(tc.minus); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("Subtract = %v, want %v", got, tc.want)
			}
		})
	}
	if got := Merge([]Range{{5, 7}, {0, 2}, {2, 3}, {6, 9}, {4, 4}}); fmt.Sprint(got) != fmt.Sprint([]Range{{0, 3}, {5, 9}}) {
		t.Fatalf("Merge = %v", got)
	}
}

// randomMatches returns up to n valid matches against a prompt of total
// tokens, with chunks of cs tokens; some overlap, some are prefix matches.
func randomMatches(r *rand.Rand, total, cs, n int) []Match {
	var out []Match
	for range r.IntN(n + 1) {
		st := r.IntN(total)
		ed := st + 1 + r.IntN(total-st)
		m := Match{Cur: Range{st, ed}}
		if r.IntN(3) == 0 {
			m.Prefix, m.StoredStart = true, st
		} else {
			m.StoredStart = r.IntN(3 * cs)
		}
		m.FirstChunkStart = m.StoredStart - r.IntN(min(m.StoredStart, cs-1)+1)
		nk := (m.Stored().End-1-m.FirstChunkStart)/cs + 1
		m.Keys = keys(r.IntN(1000), nk)
		out = append(out, m)
	}
	return out
}

// TestPlanProperties pins the plan's invariants on random prompts and
// matches: valid matches stay valid, pieces are disjoint and cover the
// prompt, segments tile each match, and retrieve passes over a growing
// allocation write every reused position exactly once, never at or beyond
// the allocation's slot bound.
func TestPlanProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		cs := 1 + r.IntN(8)
		total := 1 + r.IntN(80)
		local := r.IntN(total + 1)
		matches := randomMatches(r, total, cs, 5)
		for _, m := range matches {
			if err := m.Validate(cs, 1<<20); err != nil {
				t.Fatalf("iter %d: generated match %+v invalid: %v", iter, m, err)
			}
		}
		p, err := New(matches, cs, local, total, 0.15)
		if err != nil {
			continue
		}
		if p.Start < local || p.Start >= total {
			t.Fatalf("iter %d: Start %d outside [%d, %d)", iter, p.Start, local, total)
		}
		prev := local
		for _, m := range p.Matches {
			if err := m.Validate(cs, 1<<20); err != nil {
				t.Fatalf("iter %d: planned match %+v invalid: %v", iter, m, err)
			}
			if m.Cur.Start < prev {
				t.Fatalf("iter %d: matches overlap or precede local: %+v", iter, p.Matches)
			}
			prev = m.Cur.End
			// Segments tile the match.
			pos := m.Cur.Start
			for _, s := range m.Segments(cs) {
				if s.Cur.Start != pos || s.Cur.Empty() || s.ChunkOff < 0 || s.ChunkOff+s.Cur.Len() > cs {
					t.Fatalf("iter %d: segment %+v of %+v (cs %d) does not tile", iter, s, m, cs)
				}
				pos = s.Cur.End
			}
			if pos != m.Cur.End {
				t.Fatalf("iter %d: segments of %+v end at %d", iter, m, pos)
			}
		}
		// Pieces: ordered, disjoint, non-empty, cover [0, total).
		pos := 0
		reused := 0
		for _, pc := range p.Pieces(local, total) {
			if pc.Start != pos || pc.Empty() {
				t.Fatalf("iter %d: pieces %v do not tile [0,%d)", iter, p.Pieces(local, total), total)
			}
			if pc.Kind == Prefix || pc.Kind == Reused {
				reused += pc.Len()
			}
			if pc.Kind == Prefix && pc.End > p.Start {
				t.Fatalf("iter %d: prefix piece %v after Start %d", iter, pc, p.Start)
			}
			pos = pc.End
		}
		if pos != total || reused != p.ReusedTokens() {
			t.Fatalf("iter %d: pieces end %d (want %d), reused %d (want %d)", iter, pos, total, reused, p.ReusedTokens())
		}
		// Retrieve passes over a growing allocation.
		written := make([]int, total)
		var l Loaded
		capacity := 0
		for capacity < total {
			capacity = min(total, capacity+1+r.IntN(total))
			if !l.Pending(p, capacity) {
				l.To = max(l.To, capacity)
				continue
			}
			for _, m := range p.Matches {
				for _, s := range m.Segments(cs) {
					w, dropped := s.Window(l.To, capacity)
					if !w.Empty() && (w.Start < l.To || w.End > capacity) {
						t.Fatalf("iter %d: window %v outside [%d,%d)", iter, w, l.To, capacity)
					}
					if w.Len()+dropped != s.Cur.Intersect(Range{l.To, total}).Len() {
						t.Fatalf("iter %d: window %v + dropped %d != segment %v from %d", iter, w, dropped, s.Cur, l.To)
					}
					for q := w.Start; q < w.End; q++ {
						written[q]++
					}
				}
			}
			l.Add(p, capacity, nil)
		}
		loaded := make([]bool, total)
		for q := range l.Prefix {
			loaded[q] = true
		}
		for _, rr := range l.Reused {
			for q := rr.Start; q < rr.End; q++ {
				if loaded[q] {
					t.Fatalf("iter %d: position %d loaded twice: %+v", iter, q, l)
				}
				loaded[q] = true
			}
		}
		for _, m := range p.Matches {
			for q := m.Cur.Start; q < m.Cur.End; q++ {
				if written[q] != 1 || !loaded[q] {
					t.Fatalf("iter %d: position %d written %d times, loaded %v", iter, q, written[q], loaded[q])
				}
			}
		}
		prefix, re := l.Forward(p.Start, total)
		if prefix < p.Start {
			t.Fatalf("iter %d: forward prefix %d before start %d", iter, prefix, p.Start)
		}
		for _, rr := range re {
			if rr.Start < prefix || rr.End > total {
				t.Fatalf("iter %d: forward reused %v outside [%d,%d)", iter, rr, prefix, total)
			}
		}
	}
}

func TestLoadedMissing(t *testing.T) {
	p := Plan{ChunkSize: 4, Start: 8, Matches: []Match{
		{Cur: Range{0, 8}, Prefix: true, Keys: keys(0, 2)},
		{Cur: Range{10, 16}, StoredStart: 0, Keys: keys(5, 2)},
	}}
	var l Loaded
	l.Add(p, 12, []Range{{4, 8}})
	if l.Prefix != 4 || fmt.Sprint(l.Reused) != "[{10 12}]" || l.To != 12 {
		t.Fatalf("after first pass: %+v", l)
	}
	l.Add(p, 16, nil)
	if fmt.Sprint(l.Reused) != "[{10 12} {12 16}]" {
		t.Fatalf("after second pass: %+v", l)
	}
	prefix, re := l.Forward(8, 16)
	if prefix != 8 || fmt.Sprint(re) != "[{10 12} {12 16}]" {
		t.Fatalf("Forward = %d %v", prefix, re)
	}
}

func FuzzValidateSegments(f *testing.F) {
	f.Add(4, 0, 8, 0, 0, true, 2, 0, 16)
	f.Add(4, 10, 14, 2, 0, false, 2, 3, 12)
	f.Fuzz(func(t *testing.T, cs, st, ed, ss, fcs int, prefix bool, nk, from, capacity int) {
		if nk < 0 || nk > 64 {
			return
		}
		m := Match{Cur: Range{st, ed}, StoredStart: ss, Prefix: prefix, Keys: keys(0, nk), FirstChunkStart: fcs}
		if cs > 1<<16 || m.Validate(cs, 1<<20) != nil {
			return
		}
		n := 0
		for _, s := range m.Segments(cs) {
			w, d := s.Window(from, capacity)
			if w.Len() < 0 || d < 0 || s.ChunkOff < 0 || s.ChunkOff+s.Cur.Len() > cs {
				t.Fatalf("segment %+v window %v dropped %d", s, w, d)
			}
			n += s.Cur.Len()
		}
		if n != m.Cur.Len() {
			t.Fatalf("segments cover %d of %d", n, m.Cur.Len())
		}
	})
}
