package fleet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/internal/redistest"
	"github.com/cacheblend/cacheblend/reuseplan"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testLayout = chunkstore.Layout{NumLayers: 2, KVHeads: 2, HeadDim: 8, RoPETheta: 10000}

const testModel = "cb-test"

// testKey is the fleet key of the tests' tiers.
var testKey = []byte("0123456789abcdef0123456789abcdef-test-fleet")

func newTier(t *testing.T, url string, cfg Config) *Tier {
	t.Helper()
	cfg.URL = url
	if cfg.Key == nil {
		cfg.Key = testKey
	}
	tier, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tier.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tier.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return tier
}

func flush(t *testing.T, tier *Tier) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tier.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func tokens(r *rand.Rand, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = r.Int32N(50000)
	}
	return out
}

// storeDoc makes the chunks of a document and writes them and its directory
// entry through tier.
func storeDoc(t *testing.T, tier *Tier, tab *fingerprint.Table, doc []int32, cs int) []*chunkstore.Chunk {
	t.Helper()
	ns := Namespace(testModel, testLayout)
	keys := chunkstore.ChainKeys(testModel, 0, doc, cs)
	var chunks []*chunkstore.Chunk
	for i, k := range keys {
		lo, hi := i*cs, min((i+1)*cs, len(doc))
		c, err := chunkstore.NewChunk(k, testModel, 0, testLayout, doc[lo:hi], lo)
		if err != nil {
			t.Fatal(err)
		}
		for j := range c.KV {
			c.KV[j] = float32(i*1000 + j)
		}
		if !tier.PutChunk(ns, c.Key, c, nil) {
			t.Fatal("write dropped")
		}
		chunks = append(chunks, c)
	}
	if !tier.RegisterSequence(ns, tab, fingerprint.Sequence{Keys: keys, Tokens: doc, ChunkSize: cs}, nil) {
		t.Fatal("directory write dropped")
	}
	flush(t, tier)
	return chunks
}

func servers(t *testing.T) map[string]string {
	return map[string]string{
		"single":  redistest.Start(t, redistest.Options{}).URL(),
		"cluster": redistest.StartCluster(t).URL(),
	}
}

// TestSharedChunksAndCoordinatorMatch: a document stored through one tier
// (node A) is found by another tier (node B) at any offset of a prompt, in
// at most two round trips, its chunks read back byte for byte; against a
// single server and a 3-master cluster.
func TestSharedChunksAndCoordinatorMatch(t *testing.T) {
	for name, url := range servers(t) {
		t.Run(name, func(t *testing.T) {
			a := newTier(t, url, Config{})
			b := newTier(t, url, Config{CoordinatorTimeout: 2 * time.Second})
			tab := fingerprint.NewTable(fingerprint.Config{})
			r := rand.New(rand.NewPCG(1, 2))
			const cs = 64
			doc := tokens(r, 200)
			chunks := storeDoc(t, a, tab, doc, cs)
			ns := Namespace(testModel, testLayout)

			for _, off := range []int{0, 7, 333} {
				prompt := append(append(tokens(r, off), doc...), tokens(r, 40)...)
				res, st, err := b.Match(context.Background(), ns, tab, prompt, 0)
				if err != nil {
					t.Fatal(err)
				}
				if st.RoundTrips > 2 || st.Probes != len(prompt)-tab.Window()+1 {
					t.Fatalf("offset %d: stats %+v", off, st)
				}
				if len(res.Matches) != 1 || res.Matches[0].Cur != (reuseplan.Range{Start: off, End: off + len(doc)}) ||
					res.Matches[0].StoredStart != 0 || len(res.Matches[0].Keys) != len(chunks) {
					t.Fatalf("offset %d: matches %+v", off, res.Matches)
				}
			}
			keys := make([]chunkstore.Key, len(chunks))
			for i, c := range chunks {
				keys[i] = c.Key
			}
			got, st, err := b.GetChunks(context.Background(), ns, rank0Refs(keys), testLayout, 256)
			if err != nil || st.Hits != len(chunks) {
				t.Fatalf("GetChunks: %+v %v", st, err)
			}
			for _, c := range chunks {
				g := got[Ref{Base: c.Key}]
				if g == nil || fmt.Sprint(g.KV) != fmt.Sprint(c.KV) || fmt.Sprint(g.Tokens) != fmt.Sprint(c.Tokens) {
					t.Fatalf("chunk %s differs", c.Key)
				}
			}
			// Another layout's namespace never sees them.
			other := testLayout
			other.HeadDim = 16
			if got, _, _ := b.GetChunks(context.Background(), Namespace(testModel, other), rank0Refs(keys), other, 256); len(got) != 0 {
				t.Fatal("chunks visible under another layout")
			}
		})
	}
}

// TestCorruptValuesAreMisses: a value overwritten with garbage or truncated
// is a counted miss, never served; a corrupt directory sequence is skipped.
func TestCorruptValuesAreMisses(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	tier := newTier(t, srv.URL(), Config{CoordinatorTimeout: 2 * time.Second})
	tab := fingerprint.NewTable(fingerprint.Config{})
	r := rand.New(rand.NewPCG(5, 6))
	doc := tokens(r, 100)
	chunks := storeDoc(t, tier, tab, doc, 64)
	ns := Namespace(testModel, testLayout)
	if _, err := srv.Command("SET", chunkKey(ns, Ref{Base: chunks[0].Key}), "garbage"); err != nil {
		t.Fatal(err)
	}
	good, err := chunkstore.EncodeChunk(chunks[1])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Command("SET", chunkKey(ns, Ref{Base: chunks[1].Key}), string(good[:len(good)/2])); err != nil {
		t.Fatal(err)
	}
	got, st, err := tier.GetChunks(context.Background(), ns, rank0Refs([]chunkstore.Key{chunks[0].Key, chunks[1].Key}), testLayout, 256)
	if err != nil || len(got) != 0 || st.Corrupt != 2 || tier.Stats().Corrupt != 2 {
		t.Fatalf("corrupt values served: %d chunks, %+v, %v", len(got), st, err)
	}
}

// TestRedisDownSlowAndBack: with Redis killed every call fails fast and is
// counted; paused (SIGSTOP) a match is bounded by the coordinator timeout;
// restarted, the tier works again by itself.
func TestRedisDownSlowAndBack(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	tier := newTier(t, srv.URL(), Config{OpTimeout: 100 * time.Millisecond, CoordinatorTimeout: 30 * time.Millisecond})
	tab := fingerprint.NewTable(fingerprint.Config{})
	ns := Namespace(testModel, testLayout)
	prompt := tokens(rand.New(rand.NewPCG(7, 8)), 4096)

	srv.Pause()
	t0 := time.Now()
	_, _, err := tier.Match(context.Background(), ns, tab, prompt, 0)
	if took := time.Since(t0); !errors.Is(err, ErrTimeout) || took > time.Second {
		t.Fatalf("paused Redis: match err %v after %v, want a timeout near 30 ms", err, took)
	}
	srv.Resume()

	srv.Kill()
	t0 = time.Now()
	if _, _, err := tier.GetChunks(context.Background(), ns, []Ref{{Base: chunkstore.Key{1}}}, testLayout, 256); err == nil || time.Since(t0) > 2*time.Second {
		t.Fatalf("Redis down: %v after %v", err, time.Since(t0))
	}
	if st := tier.Stats(); st.ReadErrors == 0 || st.MatchTimeouts != 1 {
		t.Fatalf("stats %+v", st)
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for tier.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the tier did not reconnect")
		}
		time.Sleep(20 * time.Millisecond)
	}
	doc := tokens(rand.New(rand.NewPCG(9, 9)), 100)
	storeDoc(t, tier, tab, doc, 64)
	res, _, err := tier.Match(context.Background(), ns, tab, append(tokens(rand.New(rand.NewPCG(1, 1)), 10), doc...), 0)
	if err != nil || len(res.Matches) != 1 {
		t.Fatalf("after restart: %+v %v", res.Matches, err)
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url     string
		cluster bool
		ok      bool
	}{
		{"redis://:pw@127.0.0.1:6379", false, true},
		{"rediss://user:pw@example.com:6380/2", false, true},
		{"redis://:pw@127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", true, true},
		{"redis://127.0.0.1:7000?cluster=true", true, true},
		{"http://127.0.0.1:6379", false, false},
		{"127.0.0.1:6379", false, false},
		{"redis://", false, false},
	} {
		t.Run(tc.url, func(t *testing.T) {
			o, err := parseURL(tc.url)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v", err)
			}
			if err == nil && o.IsClusterMode != tc.cluster {
				t.Fatalf("cluster %v", o.IsClusterMode)
			}
		})
	}
}

func FuzzDecodeSequence(f *testing.F) {
	f.Add(encodeSequence(fingerprint.Sequence{Keys: make([]chunkstore.Key, 2), Tokens: make([]int32, 100)}, 64))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeSequence(b)
		if err != nil {
			return
		}
		if len(s.Keys) != (len(s.Tokens)+s.ChunkSize-1)/s.ChunkSize {
			t.Fatalf("inconsistent sequence %d keys %d tokens cs %d", len(s.Keys), len(s.Tokens), s.ChunkSize)
		}
	})
}

// TestMaxMemoryEvicts: a Redis whose maxmemory is far below what the tier
// writes evicts (LRU); every chunk read back afterwards is either the very
// chunk written or a counted miss, never another one.
func TestMaxMemoryEvicts(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{MaxMemory: "2mb"})
	tier := newTier(t, srv.URL(), Config{})
	ns := Namespace(testModel, testLayout)
	r := rand.New(rand.NewPCG(11, 12))
	var written []*chunkstore.Chunk
	for i := range 64 { // 64 chunks of 200 tokens, ~26 KiB each: ~1.7 MB of KV, plus the directory
		toks := tokens(r, 200)
		var k chunkstore.Key
		k[0], k[1] = byte(i), 42
		c, err := chunkstore.NewChunk(k, testModel, 0, testLayout, toks, 0)
		if err != nil {
			t.Fatal(err)
		}
		for j := range c.KV {
			c.KV[j] = float32(i*7919 + j)
		}
		written = append(written, c)
		if !tier.PutChunk(ns, c.Key, c, nil) {
			t.Fatal("write dropped")
		}
		flush(t, tier)
	}
	for i := range 64 { // push more than maxmemory holds
		var k chunkstore.Key
		k[0], k[1] = byte(i), 43
		c, _ := chunkstore.NewChunk(k, testModel, 0, testLayout, tokens(r, 200), 0)
		tier.PutChunk(ns, c.Key, c, nil)
	}
	flush(t, tier)
	info, err := exec.Command("redis-cli", "-a", redistest.Password, "--no-auth-warning", "-p", fmt.Sprint(srv.Port), "info", "stats").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`evicted_keys:[1-9]`).Match(info) {
		t.Fatalf("Redis evicted nothing:\n%s", info)
	}
	keys := make([]chunkstore.Key, len(written))
	for i, c := range written {
		keys[i] = c.Key
	}
	got, st, err := tier.GetChunks(context.Background(), ns, rank0Refs(keys), testLayout, 256)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range written {
		if g := got[Ref{Base: c.Key}]; g != nil && (fmt.Sprint(g.KV) != fmt.Sprint(c.KV) || fmt.Sprint(g.Tokens) != fmt.Sprint(c.Tokens)) {
			t.Fatalf("chunk %s served with other content after eviction", c.Key)
		}
	}
	if st.Misses == 0 || st.Hits+st.Misses != len(keys) || st.Corrupt != 0 {
		t.Fatalf("after eviction: %+v", st)
	}
	t.Logf("after eviction: %d of %d chunks still served, %d misses", st.Hits, len(keys), st.Misses)
}

// rank0Refs are the rank-0 refs of keys.
func rank0Refs(keys []chunkstore.Key) []Ref {
	out := make([]Ref, len(keys))
	for i, k := range keys {
		out[i] = Ref{Base: k}
	}
	return out
}

// TestRetryAfterPause: writes made while Redis is paused (SIGSTOP) fail, wait
// on the retry queue and are written when it continues: every chunk and the
// directory entry are readable afterwards; the group goes pending, then
// shared. A retry queue too small drops (counted) and the group is not shared.
func TestRetryAfterPause(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryQueue int
		want       GroupState
	}{
		{"retried", 0, Shared},
		{"retry queue full", 1, NotShared},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.Options{})
			tier := newTier(t, srv.URL(), Config{OpTimeout: 100 * time.Millisecond, RetryQueue: tc.retryQueue,
				RetryMaxBackoff: 400 * time.Millisecond, CoordinatorTimeout: 2 * time.Second})
			ns := Namespace(testModel, testLayout)
			tab := fingerprint.NewTable(fingerprint.Config{})
			const cs = 64
			doc := tokens(rand.New(rand.NewPCG(5, 6)), 10*cs)
			keys := chunkstore.ChainKeys(testModel, 0, doc, cs)
			g := NewGroup()
			srv.Pause()
			paused := true
			defer func() {
				if paused {
					srv.Resume()
				}
			}()
			for i, k := range keys {
				c, err := chunkstore.NewChunk(k, testModel, 0, testLayout, doc[i*cs:(i+1)*cs], i*cs)
				if err != nil {
					t.Fatal(err)
				}
				if !tier.PutChunk(ns, c.Key, c, g) {
					t.Fatal("write dropped from the write queue")
				}
			}
			tier.RegisterSequence(ns, tab, fingerprint.Sequence{Keys: keys, Tokens: doc, ChunkSize: cs}, g)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st := g.Wait(ctx)
			if want := map[bool]GroupState{true: Pending, false: NotShared}[tc.retryQueue == 0]; st != want {
				t.Fatalf("state during the pause %s, want %s", st, want)
			}
			time.Sleep(time.Second) // a few retries fail and back off
			srv.Resume()
			paused = false
			deadline := time.Now().Add(10 * time.Second)
			for g.State() == Pending && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			stats := tier.Stats()
			got, ls, err := tier.GetChunks(ctx, ns, rank0Refs(keys), testLayout, 256)
			if err != nil {
				t.Fatal(err)
			}
			res, _, err := tier.Match(ctx, ns, tab, doc, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("state %s; %d of %d chunks readable; directory matches %d; stats %+v", g.State(), len(got), len(keys), len(res.Matches), stats)
			if g.State() != tc.want {
				t.Fatalf("state after the pause %s, want %s", g.State(), tc.want)
			}
			switch tc.want {
			case Shared:
				if ls.Hits != len(keys) || len(res.Matches) != 1 || stats.RetriesOK != uint64(len(keys)+1) ||
					stats.RetriesQueued != uint64(len(keys)+1) || stats.RetriesFailed == 0 || stats.RetriesDropped != 0 || stats.RetryQueued != 0 {
					t.Fatalf("after the pause: %d of %d chunks, %d matches, stats %+v", ls.Hits, len(keys), len(res.Matches), stats)
				}
			case NotShared:
				if stats.RetriesDropped != uint64(len(keys)) || stats.RetriesQueued != 1 {
					t.Fatalf("a retry queue of 1: stats %+v", stats)
				}
			}
		})
	}
}

// TestGroupWithoutWrites: a group nothing was written for is shared; Wait
// returns at once.
func TestGroupWithoutWrites(t *testing.T) {
	g := NewGroup()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if st := g.Wait(ctx); st != Shared || ctx.Err() != nil {
		t.Fatalf("empty group: %s (ctx %v)", st, ctx.Err())
	}
}
