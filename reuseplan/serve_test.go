package reuseplan

import (
	"slices"
	"testing"
)

func TestChunk(t *testing.T) {
	tests := []struct {
		name     string
		i, cs, n int
		want     Range
		whole    int
	}{
		{"first of many", 0, 4, 10, Range{0, 4}, 8},
		{"short last", 2, 4, 10, Range{8, 10}, 8},
		{"exact", 1, 5, 10, Range{5, 10}, 10},
		{"shorter than a chunk", 0, 8, 3, Range{0, 3}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Chunk(tc.i, tc.cs, tc.n); got != tc.want {
				t.Errorf("Chunk = %v, want %v", got, tc.want)
			}
			if got := WholeChunks(tc.n, tc.cs); got != tc.whole {
				t.Errorf("WholeChunks = %d, want %d", got, tc.whole)
			}
		})
	}
}

func TestPrefixMatchAndHits(t *testing.T) {
	const cs = 4
	ks := keys(0, 3)
	np := Match{Cur: Range{20, 26}, StoredStart: 2, Keys: keys(10, 2)}
	tests := []struct {
		name     string
		usable   func(Key) bool
		wantOK   bool
		want     Match
		wantHits Hits
	}{
		{"all usable", func(Key) bool { return true }, true,
			Match{Cur: Range{0, 12}, Prefix: true, Keys: ks}, Hits{Requested: 40, Coverage: 12, Prefix: 12, NonPrefix: 6}},
		{"stops at the first unusable", func(k Key) bool { return k != ks[1] }, true,
			Match{Cur: Range{0, 4}, Prefix: true, Keys: ks[:1]}, Hits{Requested: 40, Coverage: 12, Prefix: 4, NonPrefix: 6}},
		{"none", func(Key) bool { return false }, false, Match{}, Hits{Requested: 40, Coverage: 12, NonPrefix: 6}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, ok := PrefixMatch(ks, cs, tc.usable)
			if ok != tc.wantOK || m.Cur != tc.want.Cur || m.Prefix != tc.want.Prefix || !slices.Equal(m.Keys, tc.want.Keys) {
				t.Fatalf("PrefixMatch = %+v %v, want %+v %v", m, ok, tc.want, tc.wantOK)
			}
			ms := []Match{np}
			if ok {
				ms = append(ms, m)
			}
			h := HitsOf(40, len(ks), cs, ms)
			if h != tc.wantHits {
				t.Fatalf("HitsOf = %+v, want %+v", h, tc.wantHits)
			}
			if h.Tokens() != h.Prefix+h.NonPrefix || h.Rate() != float64(h.Tokens())/40 || h.Searched() != 40-12 {
				t.Fatalf("Tokens %d Rate %v Searched %d", h.Tokens(), h.Rate(), h.Searched())
			}
		})
	}
	if r := (Hits{}).Rate(); r != 0 {
		t.Fatalf("rate of an empty prompt: %v", r)
	}
}

func TestWindow(t *testing.T) {
	segs := []Segment{
		{Key: key(1), ChunkOff: 2, Cur: Range{10, 16}, Shift: true},
		{Key: key(2), Cur: Range{16, 24}, Shift: true},
		{Key: key(3), Cur: Range{30, 34}},
	}
	tests := []struct {
		name           string
		from, capacity int
		want           []Segment
		dropped        int
	}{
		{"everything", 0, 64, segs, 0},
		{"capacity cuts the second", 0, 20,
			[]Segment{segs[0], {Key: key(2), Cur: Range{16, 20}, Shift: true}}, 4 + 4},
		{"second pass", 20, 64,
			[]Segment{{Key: key(2), ChunkOff: 4, Cur: Range{20, 24}, Shift: true}, segs[2]}, 0},
		{"nothing allocated", 0, 0, nil, 6 + 8 + 4},
		{"all written before", 40, 64, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, dropped := Window(segs, tc.from, tc.capacity)
			if !slices.Equal(got, tc.want) || dropped != tc.dropped {
				t.Fatalf("Window = %+v, %d; want %+v, %d", got, dropped, tc.want, tc.dropped)
			}
			before := 0 // written by an earlier pass
			for _, s := range segs {
				before += s.Cur.Intersect(Range{0, tc.from}).Len()
			}
			if n := Tokens(Ranges(got)); n+dropped+before != Tokens(Ranges(segs)) {
				t.Fatalf("written %d + dropped %d + before %d != %d", n, dropped, before, Tokens(Ranges(segs)))
			}
		})
	}
}
