package fleet

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/internal/redistest"
)

// TestSealOpen: a sealed value opens only for its kind, key name, layout
// and fleet key, and not once any byte of it changed.
func TestSealOpen(t *testing.T) {
	s := sealer{key: testKey}
	lay := chunkLayout(testLayout, 0)
	v := s.seal(kindChunk, "cb:ns:c:k", lay, []byte("body bytes"))
	if b, err := s.open(kindChunk, "cb:ns:c:k", lay, append([]byte(nil), v...)); err != nil || string(b) != "body bytes" {
		t.Fatalf("open: %q %v", b, err)
	}
	flip := func(i int) []byte { w := append([]byte(nil), v...); w[i] ^= 1; return w }
	for _, tc := range []struct {
		name      string
		kind      byte
		key       string
		layout    []byte
		value     []byte
		fleetKeyB []byte
	}{
		{"body changed", kindChunk, "cb:ns:c:k", lay, flip(0), testKey},
		{"magic changed", kindChunk, "cb:ns:c:k", lay, flip(len(v) - tagLen - 1), testKey},
		{"tag changed", kindChunk, "cb:ns:c:k", lay, flip(len(v) - 1), testKey},
		{"another key name", kindChunk, "cb:ns:c:other", lay, v, testKey},
		{"another kind", kindSequence, "cb:ns:c:k", lay, v, testKey},
		{"another layout", kindChunk, "cb:ns:c:k", chunkLayout(testLayout, 1), v, testKey},
		{"another fleet key", kindChunk, "cb:ns:c:k", lay, v, []byte("another fleet's key, 32 bytes long!")},
		{"truncated", kindChunk, "cb:ns:c:k", lay, v[:len(v)-1], testKey},
		{"too short", kindChunk, "cb:ns:c:k", lay, v[:10], testKey},
		{"unsealed (version 1)", kindChunk, "cb:ns:c:k", lay, []byte("body bytes"), testKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := (sealer{key: tc.fleetKeyB}).open(tc.kind, tc.key, tc.layout, tc.value); !errors.Is(err, errUnauthenticated) {
				t.Fatalf("err %v, want errUnauthenticated", err)
			}
		})
	}
}

// TestMaxChunkValue: the bound is exactly the sealed size of the largest
// chunk of the layout (the longest model name, maxTokens tokens).
func TestMaxChunkValue(t *testing.T) {
	for _, n := range []int{1, 17, 64, 256} {
		c, err := chunkstore.NewChunk(chunkstore.Key{1}, strings.Repeat("m", chunkstore.MaxModelLen), 0, testLayout, make([]int32, n), 0)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := MaxChunkValue(testLayout, n), chunkstore.EncodedSize(c)+int64(sealOverhead); got != want {
			t.Fatalf("%d tokens: MaxChunkValue %d, sealed encoding %d", n, got, want)
		}
	}
}

func rawClient(t *testing.T, srv *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: redistest.Password})
	t.Cleanup(func() { c.Close() })
	return c
}

// nanChunk is a copy of c with every K/V value NaN.
func nanChunk(c *chunkstore.Chunk) *chunkstore.Chunk {
	d := *c
	d.KV = make([]float32, len(c.KV))
	for i := range d.KV {
		d.KV[i] = float32(math.NaN())
	}
	return &d
}

// TestRefusedChunkValues replays the attacks on chunk values with a real
// Redis: each planted value is a counted miss, never returned, and the
// other chunks of the batch are served. The oversize values (48 MiB each)
// are refused without being read: the bytes the reader allocated stay far
// below one of them.
func TestRefusedChunkValues(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rc := rawClient(t, srv)
	ctx := context.Background()
	const cs = 64
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, a *Tier, ns string, chunks []*chunkstore.Chunk) int // returns the chunks planted
		check func(Stats) bool
	}{
		{"NaN K/V with a valid CRC, unsigned", func(t *testing.T, _ *Tier, ns string, chunks []*chunkstore.Chunk) int {
			b, err := chunkstore.EncodeChunk(nanChunk(chunks[1]))
			if err != nil {
				t.Fatal(err)
			}
			return set(t, rc, chunkKey(ns, Ref{Base: chunks[1].Key}), b)
		}, func(s Stats) bool { return s.RefusedUnauthenticated == 1 }},
		{"NaN K/V signed with the fleet key", func(t *testing.T, a *Tier, ns string, chunks []*chunkstore.Chunk) int {
			b, err := chunkstore.EncodeChunk(nanChunk(chunks[1]))
			if err != nil {
				t.Fatal(err)
			}
			k := chunkKey(ns, Ref{Base: chunks[1].Key})
			return set(t, rc, k, a.seal.seal(kindChunk, k, chunkLayout(testLayout, 0), b))
		}, func(s Stats) bool { return s.RefusedNonFinite == 1 }},
		{"signed with another fleet key", func(t *testing.T, _ *Tier, ns string, chunks []*chunkstore.Chunk) int {
			other := newTier(t, srv.URL(), Config{Key: []byte("another fleet's key of 32 bytes...")})
			other.PutChunk(ns, chunks[1].Key, chunks[1], nil)
			flush(t, other)
			return 1
		}, func(s Stats) bool { return s.RefusedUnauthenticated == 1 }},
		{"unsigned version 1 value", func(t *testing.T, _ *Tier, ns string, chunks []*chunkstore.Chunk) int {
			b, err := chunkstore.EncodeChunk(chunks[1])
			if err != nil {
				t.Fatal(err)
			}
			return set(t, rc, chunkKey(ns, Ref{Base: chunks[1].Key}), b)
		}, func(s Stats) bool { return s.RefusedUnauthenticated == 1 }},
		{"another chunk's value moved here", func(t *testing.T, _ *Tier, ns string, chunks []*chunkstore.Chunk) int {
			b, err := rc.Get(ctx, chunkKey(ns, Ref{Base: chunks[0].Key})).Bytes()
			if err != nil {
				t.Fatal(err)
			}
			return set(t, rc, chunkKey(ns, Ref{Base: chunks[1].Key}), b)
		}, func(s Stats) bool { return s.RefusedUnauthenticated == 1 }},
		{"a list under the key", func(t *testing.T, _ *Tier, ns string, chunks []*chunkstore.Chunk) int {
			k := chunkKey(ns, Ref{Base: chunks[1].Key})
			if err := rc.Del(ctx, k).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rc.RPush(ctx, k, "x").Err(); err != nil {
				t.Fatal(err)
			}
			return 1
		}, func(s Stats) bool { return s.RefusedMalformed == 1 }},
		{"48 MiB under three chunk keys", func(t *testing.T, _ *Tier, ns string, chunks []*chunkstore.Chunk) int {
			for _, c := range chunks[1:] {
				k := chunkKey(ns, Ref{Base: c.Key})
				if err := rc.SetRange(ctx, k, 48<<20-1, "x").Err(); err != nil {
					t.Fatal(err)
				}
			}
			return len(chunks) - 1
		}, func(s Stats) bool { return s.RefusedOversize == 3 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := rc.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			a := newTier(t, srv.URL(), Config{})
			b := newTier(t, srv.URL(), Config{OpTimeout: 5 * time.Second})
			doc := tokens(rand.New(rand.NewPCG(3, 4)), 4*cs)
			chunks := storeDoc(t, a, fingerprint.NewTable(fingerprint.Config{}), doc, cs)
			ns := Namespace(testModel, testLayout)
			planted := tc.plant(t, a, ns, chunks)
			keys := make([]chunkstore.Key, len(chunks))
			for i, c := range chunks {
				keys[i] = c.Key
			}
			var m0, m1 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&m0)
			got, st, err := b.GetChunks(ctx, ns, rank0Refs(keys), testLayout, cs)
			runtime.ReadMemStats(&m1)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("the read allocated %d bytes (%d refused)", m1.TotalAlloc-m0.TotalAlloc, planted)
			if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 4<<20 {
				t.Errorf("the read allocated %d bytes", alloc)
			}
			if len(got) != len(chunks)-planted || st.Corrupt != planted || st.Misses != planted {
				t.Fatalf("%d chunks served, %+v; want %d refused", len(got), st, planted)
			}
			for ref, c := range got {
				if ref.Base == chunks[1].Key || !finite(c.KV) {
					t.Fatalf("planted chunk %s served", ref.Base)
				}
			}
			if s := b.Stats(); !tc.check(s) || s.Corrupt != uint64(planted) {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

func set(t *testing.T, rc *redis.Client, key string, v []byte) int {
	t.Helper()
	if err := rc.Set(context.Background(), key, v, 0).Err(); err != nil {
		t.Fatal(err)
	}
	return 1
}

// TestForgedDirectory: a fingerprint entry that is not signed, and a
// sequence value replaced by 48 MiB, are refused; the match then finds
// nothing from them, and the oversize sequence is not read whole.
func TestForgedDirectory(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rc := rawClient(t, srv)
	ctx := context.Background()
	a := newTier(t, srv.URL(), Config{})
	b := newTier(t, srv.URL(), Config{CoordinatorTimeout: 5 * time.Second, OpTimeout: 5 * time.Second})
	tab := fingerprint.NewTable(fingerprint.Config{})
	doc := tokens(rand.New(rand.NewPCG(1, 9)), 200)
	storeDoc(t, a, tab, doc, 64)
	ns := Namespace(testModel, testLayout)
	prompt := append(tokens(rand.New(rand.NewPCG(2, 9)), 30), doc...)
	if res, _, err := b.Match(ctx, ns, tab, prompt, 0); err != nil || len(res.Matches) != 1 {
		t.Fatalf("before: %+v %v", res.Matches, err)
	}
	fps, err := rc.Keys(ctx, "cb:"+ns+":f:*").Result()
	if err != nil || len(fps) == 0 {
		t.Fatalf("fingerprint keys: %v %v", fps, err)
	}
	seqs, err := rc.Keys(ctx, "cb:"+ns+":s:*").Result()
	if err != nil || len(seqs) != 1 {
		t.Fatalf("sequence keys: %v %v", seqs, err)
	}
	id := strings.TrimPrefix(seqs[0], "cb:"+ns+":s:")

	t.Run("sequence replaced by 48 MiB", func(t *testing.T) {
		if err := rc.SetRange(ctx, seqs[0], 48<<20-1, "x").Err(); err != nil {
			t.Fatal(err)
		}
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		res, st, err := b.Match(ctx, ns, tab, prompt, 0)
		runtime.ReadMemStats(&m1)
		if err != nil || len(res.Matches) != 0 || st.Sequences != 0 {
			t.Fatalf("match: %+v %+v %v", res.Matches, st, err)
		}
		t.Logf("the match allocated %d bytes", m1.TotalAlloc-m0.TotalAlloc)
		if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 8<<20 {
			t.Errorf("the match allocated %d bytes", alloc)
		}
		if s := b.Stats(); s.RefusedOversize != 1 {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("unsigned fingerprint entries", func(t *testing.T) {
		for _, k := range fps {
			if err := rc.Set(ctx, k, id+":0", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		before := b.Stats().RefusedUnauthenticated
		res, st, err := b.Match(ctx, ns, tab, prompt, 0)
		if err != nil || len(res.Matches) != 0 || st.Sequences != 0 {
			t.Fatalf("match: %+v %+v %v", res.Matches, st, err)
		}
		if got := b.Stats().RefusedUnauthenticated - before; got != uint64(st.DirectoryHits) || got == 0 {
			t.Fatalf("%d refused of %d directory hits", got, st.DirectoryHits)
		}
	})
}

// TestNonFiniteChunkNotWritten: a local chunk with a NaN is never signed
// nor written to Redis.
func TestNonFiniteChunkNotWritten(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rc := rawClient(t, srv)
	a := newTier(t, srv.URL(), Config{})
	c, err := chunkstore.NewChunk(chunkstore.Key{7}, testModel, 0, testLayout, []int32{1, 2, 3}, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.KV[5] = float32(math.Inf(1))
	ns := Namespace(testModel, testLayout)
	a.PutChunk(ns, c.Key, c, nil)
	flush(t, a)
	if n, err := rc.Exists(context.Background(), chunkKey(ns, Ref{Base: c.Key})).Result(); err != nil || n != 0 {
		t.Fatalf("the chunk was written (%d, %v)", n, err)
	}
	if s := a.Stats(); s.WritesRefused != 1 || s.Writes != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestHealth: reachable while Redis answers; killed, unreachable with the
// last error and the writes waiting on the retry queue; restarted,
// reachable again.
func TestHealth(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	tier := newTier(t, srv.URL(), Config{OpTimeout: 100 * time.Millisecond, HealthMaxAge: 10 * time.Millisecond,
		RetryMinBackoff: time.Second, RetryMaxBackoff: time.Second})
	ctx := context.Background()
	if h := tier.Health(ctx); !h.Reachable || h.LastError != "" {
		t.Fatalf("up: %+v", h)
	}
	srv.Kill()
	c, err := chunkstore.NewChunk(chunkstore.Key{9}, testModel, 0, testLayout, []int32{1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	tier.PutChunk(Namespace(testModel, testLayout), c.Key, c, nil)
	deadline := time.Now().Add(5 * time.Second)
	var h Health
	for h = tier.Health(ctx); h.Reachable || h.RetryQueued == 0; h = tier.Health(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("killed: %+v", h)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h.LastError == "" || strings.Contains(h.LastError, redistest.Password) {
		t.Fatalf("last error %q", h.LastError)
	}
	srv.Restart()
	for h = tier.Health(ctx); !h.Reachable; h = tier.Health(ctx) {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatalf("restarted: %+v", h)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		content string
		mode    os.FileMode
		want    string
		wantErr bool
	}{
		{"trimmed", "  s3cret\n", 0o600, "s3cret", false},
		{"group readable", "s3cret", 0o640, "s3cret", false},
		{"world readable", "s3cret", 0o644, "", true},
		{"empty", "\n", 0o600, "", true},
		{"too long", strings.Repeat("x", MaxKeyFileBytes+1), 0o600, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strconv.Itoa(int(tc.mode))+tc.name)
			if err := os.WriteFile(p, []byte(tc.content), tc.mode); err != nil {
				t.Fatal(err)
			}
			got, err := ReadSecretFile(p)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %q %v", got, err)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
	if _, err := ReadSecretFile(dir); err == nil {
		t.Fatal("a directory read as a secret")
	}
}

func TestWithPassword(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"redis://127.0.0.1:6379", "redis://:pw@127.0.0.1:6379"},
		{"rediss://app@example.com:6380/2", "rediss://app:pw@example.com:6380/2"},
		{"redis://127.0.0.1:7000?cluster=true", "redis://:pw@127.0.0.1:7000?cluster=true"},
		{"redis://:old@127.0.0.1:6379", ""},
		{"http://127.0.0.1", ""},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := WithPassword(tc.in, "pw")
			if (err != nil) != (tc.want == "") || got != tc.want {
				t.Fatalf("got %q %v", got, err)
			}
			if err == nil && !URLHasPassword(got) {
				t.Fatal("no password")
			}
		})
	}
}

func TestNewNeedsAKey(t *testing.T) {
	for _, k := range [][]byte{nil, []byte("short")} {
		if _, err := New(Config{URL: "redis://127.0.0.1:1", Key: k}, nil); err == nil {
			t.Fatalf("key %q accepted", k)
		}
	}
}

// FuzzOpenValues: whatever bytes Redis holds, opening them never panics
// and never accepts a value without the fleet key's tag.
func FuzzOpenValues(f *testing.F) {
	s := sealer{key: testKey}
	c, err := chunkstore.NewChunk(chunkstore.Key{1}, testModel, 0, testLayout, []int32{1, 2}, 0)
	if err != nil {
		f.Fatal(err)
	}
	b, _ := chunkstore.EncodeChunk(c)
	f.Add(b)
	f.Add([]byte("garbage"))
	f.Add([]byte(strings.Repeat("0", 32) + ":0:100"))
	tier := &Tier{seal: sealer{key: []byte("fuzz key fuzz key fuzz key fuzz key")}}
	f.Fuzz(func(t *testing.T, v []byte) {
		if _, err := tier.openChunk("cb:ns:c:k", Ref{Base: c.Key}, testLayout, v, MaxChunkValue(testLayout, 64)); err == nil {
			t.Fatal("an unsigned chunk accepted")
		}
		if _, _, err := tier.openFP("cb:ns:f:1", v); err == nil {
			t.Fatal("an unsigned fingerprint entry accepted")
		}
		if _, err := tier.openSequence("cb:ns:s:1", "id", len(v), v); err == nil {
			t.Fatal("an unsigned sequence accepted")
		}
		_, _ = s.open(kindChunk, "k", nil, v)
	})
}

// BenchmarkOpenChunk is the CPU cost of the checks on one 256-token chunk
// of the benchmark layout (1.5 MiB) read from Redis: the HMAC-SHA256 tag,
// the decode (CRC-32C) and the finite check.
func BenchmarkOpenChunk(b *testing.B) {
	c, err := chunkstore.NewChunk(chunkstore.Key{1}, "bench", 0, benchLayout, make([]int32, 256), 0)
	if err != nil {
		b.Fatal(err)
	}
	enc, err := chunkstore.EncodeChunk(c)
	if err != nil {
		b.Fatal(err)
	}
	tier := &Tier{seal: sealer{key: testKey}}
	name := chunkKey("ns", Ref{Base: c.Key})
	v := tier.seal.seal(kindChunk, name, chunkLayout(benchLayout, 0), enc)
	buf := make([]byte, len(v))
	b.SetBytes(int64(len(v)))
	for b.Loop() {
		copy(buf, v) // open aliases its input
		if _, err := tier.openChunk(name, Ref{Base: c.Key}, benchLayout, buf, MaxChunkValue(benchLayout, 256)); err != nil {
			b.Fatal(err)
		}
	}
}
