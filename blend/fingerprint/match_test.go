package fingerprint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/reuseplan"
)

// registry remembers what the test registered, by sequence id, to check
// matches independently of the table.
type registry struct {
	seqs map[uint64]Sequence
	n    uint64
}

func (r *registry) register(t testing.TB, tab *Table, tokens []int32, cs int, model string) []chunkstore.Key {
	t.Helper()
	keys := chunkstore.ChainKeys(model, 0, tokens, cs)
	if _, err := tab.Register(Sequence{Keys: keys, Tokens: tokens, ChunkSize: cs}); err != nil {
		t.Fatal(err)
	}
	if r.seqs == nil {
		r.seqs = make(map[uint64]Sequence)
	}
	r.n++
	r.seqs[r.n] = Sequence{Keys: keys, Tokens: slices.Clone(tokens), ChunkSize: cs}
	return keys
}

// check verifies the invariants of a Match result: every match token-exact,
// in range, at least minMatch long, not below from, with the right keys, and
// matches sorted and non-overlapping in the prompt.
func (r *registry) check(prompt []int32, from, minMatch int, res Result) error {
	prevEd := max(from, 0)
	hit := 0
	for i, m := range res.Matches {
		seq, ok := r.seqs[m.Sequence]
		if !ok {
			return fmt.Errorf("match %d: unknown sequence %d", i, m.Sequence)
		}
		st := m.Stored()
		switch {
		case m.Cur.Start < prevEd:
			return fmt.Errorf("match %d %+v overlaps or precedes %d", i, m, prevEd)
		case m.Cur.End > len(prompt) || st.Start < 0 || st.End > len(seq.Tokens):
			return fmt.Errorf("match %d %+v out of range", i, m)
		case m.Prefix || m.Validate(seq.ChunkSize, len(prompt)) != nil:
			return fmt.Errorf("match %d %+v invalid", i, m)
		case m.Len() < minMatch:
			return fmt.Errorf("match %d %+v shorter than %d", i, m, minMatch)
		case !slices.Equal(prompt[m.Cur.Start:m.Cur.End], seq.Tokens[st.Start:st.End]):
			return fmt.Errorf("match %d %+v not token-exact", i, m)
		}
		cs := seq.ChunkSize
		first, last := st.Start/cs, (st.End-1)/cs
		if m.ChunkSize != cs || m.FirstChunkStart != first*cs || !slices.Equal(m.Keys, seq.Keys[first:last+1]) {
			return fmt.Errorf("match %d %+v: wrong chunk keys or start", i, m)
		}
		prevEd = m.Cur.End
		hit += m.Len()
	}
	if res.Stats.Matches != len(res.Matches) || res.Stats.HitTokens != hit {
		return fmt.Errorf("stats %+v disagree with %d matches of %d tokens", res.Stats, len(res.Matches), hit)
	}
	return nil
}

func randTokens(r *rand.Rand, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = r.Int32N(32000)
	}
	return t
}

func TestFindsDocumentAtEveryOffset(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	doc := randTokens(r, 300) // stored as chunks of 256 + 44
	base := randTokens(r, 2000)
	tab := NewTable(Config{})
	var reg registry
	keys := reg.register(t, tab, doc, 256, "m")
	if len(keys) != 2 || tab.Stats().Fingerprints != 2 {
		t.Fatalf("keys %d, stats %+v", len(keys), tab.Stats())
	}
	for off := range 256 {
		prompt := slices.Clone(base)
		copy(prompt[off:], doc)
		res := tab.Match(prompt, 0)
		want := mt(0, off, off+300, keys, 0)
		if len(res.Matches) != 1 || !equalMatch(res.Matches[0], want) {
			t.Fatalf("offset %d: matches %+v, want %+v", off, res.Matches, want)
		}
		if err := reg.check(prompt, 0, 16, res); err != nil {
			t.Fatalf("offset %d: %v", off, err)
		}
		// Probing skipped the 300 matched tokens.
		if want := 2000 - 16 + 1 - 300 + 1; res.Stats.Probes != want || res.Stats.TableHits != 1 || res.Stats.Collisions != 0 {
			t.Fatalf("offset %d: stats %+v, want %d probes", off, res.Stats, want)
		}
	}
}

// mt is the match of stored position ss at current [c0, c1) in a registered
// sequence 1 of 256-token chunks.
func mt(ss, c0, c1 int, keys []chunkstore.Key, fcs int) Match {
	return Match{Match: reuseplan.Match{Cur: reuseplan.Range{Start: c0, End: c1}, StoredStart: ss, Keys: keys, FirstChunkStart: fcs},
		ChunkSize: 256, Sequence: 1}
}

func equalMatch(a, b Match) bool {
	return a.StoredStart == b.StoredStart && a.Cur == b.Cur && a.Prefix == b.Prefix &&
		slices.Equal(a.Keys, b.Keys) && a.FirstChunkStart == b.FirstChunkStart && a.ChunkSize == b.ChunkSize &&
		a.Sequence == b.Sequence
}

func TestMatchCases(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	doc := randTokens(r, 300)
	base := randTokens(r, 1500)
	tab := NewTable(Config{})
	var reg registry
	keys := reg.register(t, tab, doc, 256, "m")
	with := func(parts ...any) []int32 { // pairs of (offset, tokens) over base
		p := slices.Clone(base)
		for i := 0; i < len(parts); i += 2 {
			copy(p[parts[i].(int):], parts[i+1].([]int32))
		}
		return p
	}
	tests := []struct {
		name   string
		prompt []int32
		from   int
		want   []Match
	}{
		{"no document", base, 0, nil},
		{"tail of document found by its second chunk, extended backward",
			with(700, doc[100:]), 0,
			[]Match{mt(100, 700, 900, keys, 0)}},
		{"head of document only",
			with(10, doc[:200]), 0,
			[]Match{mt(0, 10, 210, keys[:1], 0)}},
		{"from inside the document: backward extension stops at from",
			with(50, doc), 120,
			[]Match{mt(70, 120, 350, keys, 0)}},
		{"document twice, back to back",
			with(0, doc, 300, doc), 0,
			[]Match{
				mt(0, 0, 300, keys, 0),
				mt(0, 300, 600, keys, 0),
			}},
		{"overlapping copies: the second starts at the first's end",
			with(0, doc, 280, doc[250:]), 0,
			[]Match{
				mt(0, 0, 280, keys, 0),
				mt(250, 280, 330, keys, 0),
			}},
		{"prompt shorter than the window", doc[:10], 0, nil},
		{"from past the end", with(0, doc), 5000, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := tab.Match(tc.prompt, tc.from)
			if err := reg.check(tc.prompt, tc.from, 16, res); err != nil {
				t.Fatal(err)
			}
			if len(res.Matches) != len(tc.want) {
				t.Fatalf("matches %+v, want %+v", res.Matches, tc.want)
			}
			for i := range tc.want {
				if !equalMatch(res.Matches[i], tc.want[i]) {
					t.Fatalf("match %d = %+v, want %+v", i, res.Matches[i], tc.want[i])
				}
			}
		})
	}
}

func TestCollisionsRejected(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	doc := randTokens(r, 100)
	t.Run("multiset hash (base 1): a permuted window collides", func(t *testing.T) {
		tab := NewTable(Config{Base: 1})
		var reg registry
		reg.register(t, tab, doc, 256, "m")
		perm := slices.Clone(doc[:16])
		slices.Reverse(perm)
		prompt := append(randTokens(r, 50), perm...)
		prompt = append(prompt, randTokens(r, 50)...)
		res := tab.Match(prompt, 0)
		if len(res.Matches) != 0 || res.Stats.TableHits != 1 || res.Stats.Collisions != 1 {
			t.Fatalf("result %+v", res)
		}
	})
	t.Run("every hash equal: only the true document matches", func(t *testing.T) {
		tab := newConstHashTable(Config{})
		var reg registry
		reg.register(t, tab, doc, 32, "m") // chunks of 32,32,32,4: 3 fingerprints sharing one hash
		prompt := slices.Concat(randTokens(r, 40), doc, randTokens(r, 40))
		res := tab.Match(prompt, 0)
		if err := reg.check(prompt, 0, 16, res); err != nil {
			t.Fatal(err)
		}
		if len(res.Matches) != 1 || res.Matches[0].Cur.Start != 40 || res.Matches[0].Len() != 100 {
			t.Fatalf("matches %+v", res.Matches)
		}
		if res.Stats.TableHits != res.Stats.Probes || res.Stats.Collisions < 3*40 {
			t.Fatalf("stats %+v", res.Stats)
		}
	})
}

func TestMinMatch(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	short, long := randTokens(r, 30), randTokens(r, 50)
	tests := []struct {
		name     string
		cfg      Config
		doc      []int32
		wantLen  int
		wantShrt int
	}{
		{"below minimum", Config{MinMatch: 40}, short, 0, 1},
		{"above minimum", Config{MinMatch: 40}, long, 50, 0},
		{"minimum below the window is raised to it", Config{Window: 8, MinMatch: 2}, short[:8], 8, 0},
		{"chunk shorter than the window has no fingerprint", Config{Window: 32}, short, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab := NewTable(tc.cfg)
			var reg registry
			reg.register(t, tab, tc.doc, 256, "m")
			prompt := slices.Concat(randTokens(r, 20), tc.doc, randTokens(r, 20))
			res := tab.Match(prompt, 0)
			if err := reg.check(prompt, 0, tab.MinMatch(), res); err != nil {
				t.Fatal(err)
			}
			got := 0
			if len(res.Matches) == 1 {
				got = res.Matches[0].Len()
			}
			if len(res.Matches) > 1 || got != tc.wantLen || res.Stats.Short != tc.wantShrt {
				t.Fatalf("matches %+v stats %+v", res.Matches, res.Stats)
			}
		})
	}
}

func TestStaleAndUnregister(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	doc := randTokens(r, 300)
	prompt := slices.Concat(randTokens(r, 30), doc, randTokens(r, 30))
	tab := NewTable(Config{})
	var reg registry
	keys := reg.register(t, tab, doc, 256, "m")
	matchLen := func() int {
		res := tab.Match(prompt, 0)
		if err := reg.check(prompt, 0, 16, res); err != nil {
			t.Fatal(err)
		}
		return res.Stats.HitTokens
	}
	if tab.MarkStale(keys[1]) {
		t.Fatal("first strike unregistered")
	}
	if got := matchLen(); got != 300 {
		t.Fatalf("after one strike: %d tokens", got)
	}
	if !tab.MarkStale(keys[1]) {
		t.Fatal("second strike did not unregister")
	}
	// The match no longer extends into the unregistered chunk.
	if got := matchLen(); got != 256 {
		t.Fatalf("after unregistering chunk 1: %d tokens, want 256", got)
	}
	if st := tab.Stats(); st.StaleUnregistered != 1 || st.StaleMarks != 2 || st.Fingerprints != 1 || st.Chunks != 1 {
		t.Fatalf("stats %+v", st)
	}
	if !tab.Unregister(keys[0]) || tab.Unregister(keys[0]) || tab.MarkStale(keys[0]) {
		t.Fatal("Unregister/MarkStale of a gone key")
	}
	if got := matchLen(); got != 0 {
		t.Fatalf("after unregistering all: %d tokens", got)
	}
	// Registering again brings it back, with fresh strikes.
	reg.register(t, tab, doc, 256, "m")
	if got := matchLen(); got != 300 {
		t.Fatalf("after re-register: %d tokens", got)
	}
	if tab.MarkStale(keys[0]) {
		t.Fatal("strikes were not reset by re-registration")
	}
}

func TestSharedPrefixSequences(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	head := randTokens(r, 256)
	a := slices.Concat(head, randTokens(r, 100))
	b := slices.Concat(head, randTokens(r, 100))
	tab := NewTable(Config{})
	var reg registry
	ka := reg.register(t, tab, a, 256, "m")
	kb := reg.register(t, tab, b, 256, "m")
	if ka[0] != kb[0] || tab.Stats().Fingerprints != 3 {
		t.Fatalf("shared chunk not shared: stats %+v", tab.Stats())
	}
	prompt := slices.Concat(randTokens(r, 7), b, randTokens(r, 7))
	res := tab.Match(prompt, 0)
	if err := reg.check(prompt, 0, 16, res); err != nil {
		t.Fatal(err)
	}
	if res.Stats.HitTokens != 356 {
		t.Fatalf("covered %d tokens of 356: %+v", res.Stats.HitTokens, res.Matches)
	}
}

func TestRegisterErrors(t *testing.T) {
	tab := NewTable(Config{})
	keys := chunkstore.ChainKeys("m", 0, make([]int32, 300), 256)
	tests := []struct {
		name string
		seq  Sequence
	}{
		{"no tokens", Sequence{}},
		{"too few keys", Sequence{Keys: keys[:1], Tokens: make([]int32, 300)}},
		{"too many keys", Sequence{Keys: keys, Tokens: make([]int32, 256)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tab.Register(tc.seq); !errors.Is(err, ErrBadSequence) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func TestGrowthKeepsEntries(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	tab := NewTable(Config{})
	var reg registry
	var docs [][]int32
	var allKeys []chunkstore.Key
	for i := range 3000 { // grows the table several times
		d := randTokens(r, 64)
		docs = append(docs, d)
		allKeys = append(allKeys, reg.register(t, tab, d, 256, fmt.Sprint(i))...)
	}
	for _, k := range allKeys[:1500] {
		tab.Unregister(k)
	}
	for i := range 20 { // more registrations reuse free entries and tombstones
		reg.register(t, tab, docs[i], 256, fmt.Sprint(i))
	}
	for i, d := range docs {
		prompt := slices.Concat(randTokens(r, 5), d)
		res := tab.Match(prompt, 0)
		if err := reg.check(prompt, 0, 16, res); err != nil {
			t.Fatal(err)
		}
		want := 64
		if i >= 20 && i < 1500 {
			want = 0
		}
		if res.Stats.HitTokens != want {
			t.Fatalf("doc %d: %d tokens, want %d", i, res.Stats.HitTokens, want)
		}
	}
	if st := tab.Stats(); st.Fingerprints != 1520 || st.Capacity < 2*1520 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConcurrentRegisterAndMatch(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	tab := NewTable(Config{})
	docs := make([][]int32, 40)
	for i := range docs {
		docs[i] = randTokens(r, 100+i)
	}
	prompt := slices.Concat(docs...)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i, d := range docs {
			keys := chunkstore.ChainKeys("m", 0, d, 64)
			if _, err := tab.Register(Sequence{Keys: keys, Tokens: d, ChunkSize: 64}); err != nil {
				t.Error(err)
			}
			if i%3 == 0 {
				tab.MarkStale(keys[0])
				tab.MarkStale(keys[0])
			}
		}
	})
	for range 2 {
		wg.Go(func() {
			for range 50 {
				res := tab.Match(prompt, 0)
				prev := 0
				for _, m := range res.Matches {
					if m.Cur.Start < prev || m.Cur.End > len(prompt) || m.Len() < 16 {
						t.Errorf("bad match %+v", m)
					}
					prev = m.Cur.End
				}
			}
		})
	}
	wg.Wait()
}

func FuzzMatch(f *testing.F) {
	f.Add([]byte("abcabcabcaabbccabcabcbbbcacbacbcbabcabcabcabc"), uint8(2), uint8(3), uint8(0), uint8(0), false)
	f.Add([]byte("the quick brown fox jumps over the lazy dog the quick brown fox"), uint8(3), uint8(1), uint8(5), uint8(9), true)
	f.Add([]byte{}, uint8(0), uint8(0), uint8(0), uint8(0), false)
	f.Fuzz(func(t *testing.T, data []byte, window, chunk, from, stale uint8, constHash bool) {
		if len(data) > 4096 {
			return
		}
		w := 1 + int(window%4)
		cs := w + int(chunk%8)
		cfg := Config{Window: w, MinMatch: int(from % 7), MaxCandidates: 1 + int(stale%8)}
		tab := NewTable(cfg)
		if constHash {
			tab = newConstHashTable(cfg)
		}
		prompt := make([]int32, len(data))
		for i, b := range data {
			prompt[i] = int32(b % 3)
		}
		// Register pieces of the prompt itself (plus a reversed piece), so
		// true matches, collisions and shared prefixes all occur.
		var reg registry
		var all []chunkstore.Key
		k := max(1, len(prompt)/4)
		for lo := 0; lo+k <= len(prompt); lo += k {
			all = append(all, reg.register(t, tab, prompt[lo:lo+k], cs, "m")...)
		}
		if len(prompt) > 0 {
			rev := slices.Clone(prompt)
			slices.Reverse(rev)
			all = append(all, reg.register(t, tab, rev[:min(len(rev), 3*cs)], cs, "m")...)
		}
		for i := 0; i < len(all); i += 1 + int(stale%5) {
			tab.MarkStale(all[i])
			if stale&1 == 1 {
				tab.MarkStale(all[i])
			}
		}
		st := int(from) - 20
		res := tab.Match(prompt, st)
		if err := reg.check(prompt, st, tab.MinMatch(), res); err != nil {
			t.Fatal(err)
		}
		if res.Stats.Probes > max(0, len(prompt)-max(st, 0)) {
			t.Fatalf("%d probes for %d tokens", res.Stats.Probes, len(prompt))
		}
	})
}
