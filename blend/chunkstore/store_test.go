package chunkstore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

type evictLog struct {
	mu     sync.Mutex
	events []evictRec
}

type evictRec struct {
	key  Key
	tier Tier
	gone bool
}

func (l *evictLog) record(k Key, t Tier, gone bool) {
	l.mu.Lock()
	l.events = append(l.events, evictRec{k, t, gone})
	l.mu.Unlock()
}

func (l *evictLog) snapshot() []evictRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]evictRec(nil), l.events...)
}

func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		cfg  Config
	}{
		{"L1 only", Config{}},
		{"L1 and L2", Config{Dir: dir}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			c := randChunk(t, 1, 256)
			if err := s.Put(c); err != nil {
				t.Fatal(err)
			}
			got, tier, err := s.Get(c.Key)
			if err != nil || tier != TierL1 {
				t.Fatalf("Get = tier %v, err %v", tier, err)
			}
			if err := diffChunks(c, got); err != nil {
				t.Fatal(err)
			}
			if s.Contains(c.Key) != TierL1 {
				t.Fatal("Contains != L1")
			}
			if _, tier, err := s.Get(Key{1}); !errors.Is(err, ErrNotFound) || tier != TierNone {
				t.Fatalf("Get(unknown) = %v, %v", tier, err)
			}
		})
	}
	// A fresh store on the same directory (cold L1) serves from L2, then L1.
	s, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	c := randChunk(t, 1, 256)
	if s.Contains(c.Key) != TierL2 {
		t.Fatalf("Contains = %v, want l2", s.Contains(c.Key))
	}
	got, tier, err := s.Get(c.Key)
	if err != nil || tier != TierL2 {
		t.Fatalf("cold Get = %v, %v", tier, err)
	}
	if err := diffChunks(c, got); err != nil {
		t.Fatal(err)
	}
	if _, tier, _ := s.Get(c.Key); tier != TierL1 {
		t.Fatalf("second Get tier = %v, want l1 (promoted)", tier)
	}
	st := s.Stats()
	if st.L1Hits != 1 || st.L2Hits != 1 || st.L2Chunks != 1 || st.L2ReadBytes != EncodedSize(c) {
		t.Fatalf("stats %+v", st)
	}
}

func TestPutRejects(t *testing.T) {
	s, err := New(Config{ChunkSize: 16, Layout: testLayout})
	if err != nil {
		t.Fatal(err)
	}
	other := randChunk(t, 2, 8)
	other.Layout.HeadDim = 4
	other.KV = other.KV[:len(other.KV)/2]
	bad := randChunk(t, 3, 8)
	bad.KV = bad.KV[:5]
	tests := []struct {
		name string
		c    *Chunk
		want error
	}{
		{"nil", nil, ErrBadChunk},
		{"KV size", bad, ErrBadChunk},
		{"too many tokens", randChunk(t, 4, 17), ErrLayoutMismatch},
		{"other layout", other, ErrLayoutMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Put(tc.c); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestL1BudgetHardBound(t *testing.T) {
	per := randChunk(t, 0, 64).Size()
	budget := 10*per + per/2
	var log evictLog
	s, err := New(Config{L1Bytes: budget, ChunkSize: 1024, OnEvict: log.record})
	if err != nil {
		t.Fatal(err)
	}
	// Store 3x the budget; the bound must hold after every Put.
	var keys []Key
	for i := range 30 {
		c := randChunk(t, uint64(100+i), 64)
		keys = append(keys, c.Key)
		if err := s.Put(c); err != nil {
			t.Fatal(err)
		}
		if st := s.Stats(); st.L1Bytes > budget {
			t.Fatalf("after put %d: %d bytes > budget %d", i, st.L1Bytes, budget)
		}
	}
	st := s.Stats()
	if st.L1Chunks != 10 || st.L1Evictions != 20 {
		t.Fatalf("chunks %d evictions %d, want 10 and 20", st.L1Chunks, st.L1Evictions)
	}
	ev := log.snapshot()
	if len(ev) != 20 {
		t.Fatalf("%d evict callbacks, want 20", len(ev))
	}
	for i, e := range ev {
		if e.key != keys[i] || e.tier != TierL1 || !e.gone {
			t.Fatalf("evict %d = %+v, want LRU key %d gone from l1", i, e, i)
		}
	}
	// The LRU order respects reads: touching the oldest survivor keeps it.
	if _, _, err := s.Get(keys[20]); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(randChunk(t, 999, 64)); err != nil {
		t.Fatal(err)
	}
	if s.Contains(keys[20]) != TierL1 || s.Contains(keys[21]) != TierNone {
		t.Fatal("LRU evicted the recently read chunk")
	}
	// A chunk larger than the whole budget is not admitted.
	big := randChunk(t, 5, 1024)
	if err := s.Put(big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("big put err = %v", err)
	}
	if st := s.Stats(); st.L1Rejected != 1 || st.L1Bytes > budget || s.Contains(big.Key) != TierNone {
		t.Fatalf("big chunk admitted: %+v", st)
	}
}

func TestL1BudgetConcurrent(t *testing.T) {
	per := randChunk(t, 0, 32).Size()
	budget := 5 * per
	s, err := New(Config{L1Bytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20 {
				c := randChunk(t, uint64(g*1000+i), 32)
				if err := s.Put(c); err != nil {
					t.Error(err)
					return
				}
				s.Get(c.Key)
				if st := s.Stats(); st.L1Bytes > budget {
					t.Errorf("%d bytes > budget %d", st.L1Bytes, budget)
					return
				}
			}
		})
	}
	wg.Wait()
	if st := s.Stats(); st.L1Chunks != 5 || st.L1Evictions != 75 {
		t.Fatalf("stats %+v", st)
	}
}

func TestL2BudgetEvictsOldest(t *testing.T) {
	dir := t.TempDir()
	size := EncodedSize(randChunk(t, 0, 32))
	var log evictLog
	s, err := New(Config{Dir: dir, L2Bytes: 5 * size, L1Bytes: 2 * randChunk(t, 0, 32).Size(), OnEvict: log.record})
	if err != nil {
		t.Fatal(err)
	}
	var keys []Key
	for i := range 12 {
		c := randChunk(t, uint64(i), 32)
		keys = append(keys, c.Key)
		if err := s.Put(c); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if st.L2Chunks != 5 || st.L2Bytes != 5*size || st.L2Evictions != 7 || st.L1Evictions != 10 {
		t.Fatalf("stats %+v", st)
	}
	for i, k := range keys {
		_, err := os.Stat(filepath.Join(dir, k.String()+fileExt))
		if (i >= 7) != (err == nil) {
			t.Fatalf("file %d exists=%v, want only the 5 newest", i, err == nil)
		}
	}
	goneAll := 0
	for _, e := range log.snapshot() {
		if e.gone {
			goneAll++
		}
	}
	// Keys 0..6 left both tiers; keys 7..9 left only L1.
	if goneAll != 7 {
		t.Fatalf("%d gone-from-all-tiers events, want 7", goneAll)
	}
	// A chunk larger than L2's budget (but fitting L1) stays in L1 only.
	s2, err := New(Config{Dir: t.TempDir(), L2Bytes: size / 2})
	if err != nil {
		t.Fatal(err)
	}
	c := randChunk(t, 77, 32)
	if err := s2.Put(c); err != nil {
		t.Fatal(err)
	}
	if s2.Contains(c.Key) != TierL1 || s2.Stats().L2Rejected != 1 || s2.Stats().L2Chunks != 0 {
		t.Fatalf("stats %+v", s2.Stats())
	}
	// Restarting applies the budget to existing files, oldest first.
	s3, err := New(Config{Dir: dir, L2Bytes: 3 * size})
	if err != nil {
		t.Fatal(err)
	}
	if st := s3.Stats(); st.L2Chunks != 3 || st.L2Evictions != 2 {
		t.Fatalf("restart stats %+v", st)
	}
}

func TestCorruptL2FileIsMiss(t *testing.T) {
	layoutB := testLayout
	layoutB.HeadDim = 4
	tests := []struct {
		name    string
		damage  func(t *testing.T, path string)
		cfg     Config
		corrupt bool
	}{
		{"truncate", func(t *testing.T, p string) {
			if err := os.Truncate(p, 100); err != nil {
				t.Fatal(err)
			}
		}, Config{}, true},
		{"truncate to zero", func(t *testing.T, p string) {
			if err := os.Truncate(p, 0); err != nil {
				t.Fatal(err)
			}
		}, Config{}, true},
		{"flip middle byte", func(t *testing.T, p string) {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0xff
			writeFile(t, p, b)
		}, Config{}, true},
		{"wrong magic", func(t *testing.T, p string) {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			copy(b, "XXXXXXXX")
			writeFile(t, p, recrc(b))
		}, Config{}, true},
		{"other key's file", func(t *testing.T, p string) {
			other, err := EncodeChunk(randChunk(t, 555, 8))
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, p, other)
		}, Config{}, true},
		{"layout mismatch", func(*testing.T, string) {}, Config{Layout: layoutB}, true},
		// A FIFO would block open() forever: opened non-blocking, never read.
		{"replaced by a FIFO", func(t *testing.T, p string) {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}, Config{}, true},
		{"replaced by a symlink", func(t *testing.T, p string) {
			target := filepath.Join(t.TempDir(), "elsewhere")
			if err := os.Rename(p, target); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}, Config{}, true},
		{"file vanished", func(t *testing.T, p string) {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}, Config{}, false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			w, err := New(Config{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			c := randChunk(t, uint64(i), 32)
			if err := w.Put(c); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, c.Key.String()+fileExt)
			var log evictLog
			cfg := tc.cfg
			cfg.Dir, cfg.OnEvict = dir, log.record
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, path)
			for _, viaMany := range []bool{false, true} {
				if viaMany && !tc.corrupt {
					continue
				}
				if viaMany {
					// Restore the damage for the GetMany path.
					if err := w.Put(c); err != nil {
						t.Fatal(err)
					}
					if s, err = New(cfg); err != nil {
						t.Fatal(err)
					}
					tc.damage(t, path)
					got, ls := s.GetMany([]Key{c.Key})
					if len(got) != 0 || ls.Corrupt != 1 || ls.Chunks != 0 || ls.L2Misses != 1 {
						t.Fatalf("GetMany = %d chunks, %+v", len(got), ls)
					}
				} else {
					got, tier, err := s.Get(c.Key)
					if got != nil || tier != TierNone {
						t.Fatalf("Get returned %v, %v", got, tier)
					}
					if tc.corrupt != errors.Is(err, ErrCorrupt) || tc.corrupt == errors.Is(err, ErrNotFound) {
						t.Fatalf("err = %v (corrupt expected: %v)", err, tc.corrupt)
					}
				}
				st := s.Stats()
				if want := int64(0); tc.corrupt {
					want = 1
					if st.Corrupt != want {
						t.Fatalf("corrupt counter %d, want %d", st.Corrupt, want)
					}
				}
				if st.Misses != 1 || st.L2Chunks != 0 || s.Contains(c.Key) != TierNone {
					t.Fatalf("after miss: %+v contains %v", st, s.Contains(c.Key))
				}
				if _, err := os.Stat(path); tc.corrupt && err == nil {
					t.Fatal("corrupt file left in place")
				}
				ev := log.snapshot()
				if len(ev) == 0 || ev[len(ev)-1] != (evictRec{c.Key, TierL2, true}) {
					t.Fatalf("evict events %+v", ev)
				}
				if _, _, err := s.Get(c.Key); !errors.Is(err, ErrNotFound) {
					t.Fatalf("second Get err = %v, want not found", err)
				}
			}
		})
	}
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAtomicWriteLeavesNoTemps(t *testing.T) {
	dir := t.TempDir()
	// A temp file of an interrupted write is removed on start; a file
	// that only looks like one (not this store's name pattern) is left.
	writeFile(t, filepath.Join(dir, tempPrefix+randChunk(t, 7, 4).Key.String()+"-123"), []byte("partial"))
	notOurs := filepath.Join(dir, tempPrefix+"abc-123")
	writeFile(t, notOurs, []byte("someone else's"))
	s, err := New(Config{Dir: dir, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.Stats().StaleTempsRemoved != 1 {
		t.Fatalf("stale temps removed = %d", s.Stats().StaleTempsRemoved)
	}
	if _, err := os.Stat(notOurs); err != nil {
		t.Fatalf("a file not of this store's temp pattern was removed: %v", err)
	}
	os.Remove(notOurs)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 10 {
				// Goroutines write overlapping keys concurrently.
				if err := s.Put(randChunk(t, uint64(g%2*100+i), 16)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 20 {
		t.Fatalf("%d files, want 20", len(entries))
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), fileExt) || strings.HasPrefix(e.Name(), tempPrefix) {
			t.Fatalf("unexpected file %s", e.Name())
		}
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v", e.Name(), info.Mode())
		}
	}
	if st := s.Stats(); st.L2Chunks != 20 || st.L2Bytes != 20*EncodedSize(randChunk(t, 0, 16)) {
		t.Fatalf("stats %+v", st)
	}
}

func TestGetManyMixed(t *testing.T) {
	dir := t.TempDir()
	per := randChunk(t, 0, 64).Size()
	s, err := New(Config{Dir: dir, L1Bytes: 3 * per, Readers: 3})
	if err != nil {
		t.Fatal(err)
	}
	var chunks []*Chunk
	var keys []Key
	for i := range 8 {
		c := randChunk(t, uint64(i), 64)
		chunks = append(chunks, c)
		keys = append(keys, c.Key)
		if err := s.Put(c); err != nil {
			t.Fatal(err)
		}
	}
	// Keys 5,6,7 are in L1; 0..4 only in L2. Ask for all, a duplicate and an
	// unknown key.
	ask := append(append([]Key(nil), keys...), keys[6], Key{9})
	before := time.Now()
	got, ls := s.GetMany(ask)
	after := time.Now()
	// The L2 batch's own interval, inside the call.
	if ls.Start.Before(before) || ls.Start.Add(ls.Duration).After(after) {
		t.Fatalf("L2 batch [%v, +%v] outside the call [%v, %v]", ls.Start, ls.Duration, before, after)
	}
	want := LoadStats{Keys: 9, L1Hits: 3, L2Misses: 5, Chunks: 5, Bytes: 5 * EncodedSize(chunks[0]), Missing: 1}
	ls.Start, ls.Duration = time.Time{}, 0
	if ls != want {
		t.Fatalf("LoadStats %+v, want %+v", ls, want)
	}
	if len(got) != 8 {
		t.Fatalf("%d chunks", len(got))
	}
	for _, c := range chunks {
		if err := diffChunks(c, got[c.Key]); err != nil {
			t.Fatalf("chunk %s: %v", c.Key, err)
		}
	}
	// Promotion kept the bound; the last loaded three are in L1 now.
	if st := s.Stats(); st.L1Bytes > 3*per || st.L1Chunks != 3 {
		t.Fatalf("stats %+v", st)
	}
	// A corrupt file among the batch is counted, the rest still load.
	if err := os.Truncate(filepath.Join(dir, keys[0].String()+fileExt), 10); err != nil {
		t.Fatal(err)
	}
	s2, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	got, ls = s2.GetMany(keys)
	if len(got) != 7 || ls.Corrupt != 1 || ls.Chunks != 7 || ls.L2Misses != 8 || ls.Duration <= 0 {
		t.Fatalf("%d chunks, %+v", len(got), ls)
	}
	if s2.PrefixChunks(keys) != 0 || s2.PrefixChunks(keys[1:]) != 7 {
		t.Fatalf("PrefixChunks = %d, %d", s2.PrefixChunks(keys), s2.PrefixChunks(keys[1:]))
	}
}

func TestPresentChecksL2Files(t *testing.T) {
	cases := []struct {
		name   string
		remove bool
		want   bool
	}{
		{"file in place", false, true},
		{"file removed by hand", true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := New(Config{Dir: dir, L1Bytes: 1})
			if err != nil {
				t.Fatal(err)
			}
			ch := randChunk(t, 1, 32)
			if err := s.Put(ch); err != nil {
				t.Fatal(err)
			}
			if s.Contains(ch.Key) != TierL2 {
				t.Fatalf("tier %v, want L2", s.Contains(ch.Key))
			}
			if c.remove {
				if err := os.Remove(s.path(ch.Key)); err != nil {
					t.Fatal(err)
				}
			}
			if got := s.Present(ch.Key); got != c.want {
				t.Fatalf("Present %v, want %v", got, c.want)
			}
			if c.remove && s.Contains(ch.Key) != TierNone {
				t.Fatal("a vanished file stays indexed")
			}
		})
	}
}
