package blend

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/internal/redistest"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// testFleetKey is the fleet key of the tests' fleet tiers.
var testFleetKey = []byte("blend-test-fleet-key-0123456789abcdef")

// trustCS is the chunk size of the trust tests: the 300-token document is
// 10 chunks (9 of 32 tokens, one of 12).
const trustCS = 32

// trustFleet is a Redis fleet tier holding a document node A stored: its
// server, the tier config, the document, its namespace and chunk keys, and
// A's chunks (the values every check compares with).
type trustFleet struct {
	srv    *redistest.Server
	rc     *redis.Client
	fc     fleet.Config
	doc    []int32
	ns     string
	keys   []chunkstore.Key
	chunks []*chunkstore.Chunk
}

func newTrustFleet(t *testing.T) *trustFleet {
	t.Helper()
	f := &trustFleet{srv: redistest.Start(t, redistest.Options{})}
	f.rc = redis.NewClient(&redis.Options{Addr: f.srv.Addr, Password: redistest.Password})
	t.Cleanup(func() { f.rc.Close() })
	f.fc = fleet.Config{Key: testFleetKey, URL: f.srv.URL(), CoordinatorTimeout: 2 * time.Second, OpTimeout: 5 * time.Second}
	a := newEnv(t, Config{Fleet: f.fc, ChunkSize: trustCS})
	mem := a.newWorker("w0", 0)
	f.doc = tokens(rand.New(rand.NewPCG(1, 2)), docLen, 1000, 1000)
	bt := blocks(docBlock, (docLen+bs-1)/bs)
	a.prefill(mem, bt, docSeq, docLen)
	resp, err := a.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "doc", WorkerId: "w0", Tokens: f.doc, BlockTable: bt, Document: true, Model: testModel})
	if err != nil || resp.GetStoredChunks() != 10 {
		t.Fatalf("store: %+v %v", resp, err)
	}
	a.s.waitRegistrations(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.s.chunks.fleet.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	f.ns, _, _ = a.s.fleetSpace(testModel, 1)
	f.keys = chunkstore.ChainKeys(testModel, 0, f.doc, trustCS)
	for _, k := range f.keys {
		c, _, err := a.s.chunks.store.Get(k)
		if err != nil {
			t.Fatal(err)
		}
		f.chunks = append(f.chunks, c)
	}
	return f
}

func (f *trustFleet) key(i int) string { return "cb:" + f.ns + ":c:" + f.keys[i].String() }

// set plants v under chunk i's key.
func (f *trustFleet) set(t *testing.T, i int, v []byte) {
	t.Helper()
	if err := f.rc.Set(context.Background(), f.key(i), v, 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// checkFleet reads every chunk back through a fresh tier with the fleet
// key: each must be there, authenticated, finite and A's chunk exactly.
func (f *trustFleet) checkFleet(t *testing.T) {
	t.Helper()
	tier, err := fleet.New(f.fc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Shutdown(context.Background())
	refs := make([]fleet.Ref, len(f.keys))
	for i, k := range f.keys {
		refs[i] = fleet.Ref{Base: k}
	}
	got, st, err := tier.GetChunks(context.Background(), f.ns, refs, f.chunks[0].Layout, trustCS)
	if err != nil || len(got) != len(f.keys) {
		t.Fatalf("the fleet holds %d of %d valid chunks (%+v, %v)", len(got), len(f.keys), st, err)
	}
	for i, k := range f.keys {
		c := got[fleet.Ref{Base: k}]
		for j, x := range c.KV {
			if x != f.chunks[i].KV[j] {
				t.Fatalf("chunk %d in Redis differs from A's at %d: %v, want %v", i, j, x, f.chunks[i].KV[j])
			}
		}
	}
}

// nodeB is a fresh node (it never saw the document): it looks the document
// up at offset off of a prompt and retrieves what the lookup matched into
// a sentinel-filled memory.
func (f *trustFleet) nodeB(t *testing.T, id string) (*env, *kvcache.Memory, *cbv1.LookupResult, []int32) {
	t.Helper()
	b := newEnv(t, Config{Fleet: f.fc, ChunkSize: trustCS})
	mem := b.newWorker("w1", 0)
	res := b.lookup(&cbv1.LookupRequest{RequestId: id, Tokens: promptWith(promptN, trustOff, f.doc, 11), WorldSize: 1, Model: testModel})
	fillSentinel(mem)
	tbt := targetTable(promptN / bs)
	if len(res.GetMatches()) > 0 {
		rr, err := b.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: id, WorkerId: "w1", BlockTable: tbt, Matches: res.GetMatches(), ChunkSize: trustCS})
		if err != nil {
			t.Fatal(err)
		}
		if int(rr.GetScatteredTokens()) != int(res.GetNonPrefixHitTokens()) {
			t.Fatalf("retrieve scattered %d tokens, lookup hit %d", rr.GetScatteredTokens(), res.GetNonPrefixHitTokens())
		}
	}
	return b, mem, res, tbt
}

const trustOff = 704 // a block boundary: every chunk of 32 tokens fills whole blocks

// checkChunks verifies B's memory: the document's chunks in valid hold A's
// KV at their prompt positions (K rotated there), every other slot is
// untouched (sentinel: nothing of a refused chunk, no NaN).
func (e *env) checkChunks(mem *kvcache.Memory, bt []int32, valid map[int]bool) {
	e.t.Helper()
	bad := 0
	for b, id := range bt {
		for o := range bs {
			pos := b*bs + o
			slot := int(id)*bs + o
			j := pos - trustOff
			in := j >= 0 && j < docLen && valid[j/trustCS]
			for layer := range testLayout.NumLayers {
				k, v := mem.TokenK(layer, slot), mem.TokenV(layer, slot)
				for fi := range k {
					var ok bool
					if in {
						ok = math.Abs(float64(k[fi]-e.wantK(docSeq, j, layer, pos)[fi])) <= 1e-4 && v[fi] == rawV(docSeq, j, layer, fi)
					} else {
						ok = k[fi] == sentinel && v[fi] == sentinel
					}
					if !ok {
						if bad++; bad < 5 {
							e.t.Errorf("pos %d (doc token %d, valid %v) layer %d f %d: K %v V %v", pos, j, in, layer, fi, k[fi], v[fi])
						}
					}
				}
			}
		}
	}
}

// TestFleetRefusesForgedChunks replays the Redis attacks on a chunk value
// (issue 27): rewritten with NaN K/V and a valid CRC, signed with another
// fleet's key, or of the old unsigned format. Node B refuses it (a counted
// miss), reuses the other chunks exactly and nothing of the forged one
// (its slots untouched), never keeps it in its own tiers, and storing the
// document again after the value was restored writes only valid values
// back to Redis.
func TestFleetRefusesForgedChunks(t *testing.T) {
	const victim = 4
	for _, tc := range []struct {
		name   string
		plant  func(t *testing.T, f *trustFleet)
		reason string
	}{
		{"NaN K/V, valid CRC", func(t *testing.T, f *trustFleet) {
			c := *f.chunks[victim]
			c.KV = make([]float32, len(c.KV))
			for i := range c.KV {
				c.KV[i] = float32(math.NaN())
			}
			b, err := chunkstore.EncodeChunk(&c)
			if err != nil {
				t.Fatal(err)
			}
			f.set(t, victim, b)
		}, "unauthenticated"},
		{"another fleet key", func(t *testing.T, f *trustFleet) {
			fc := f.fc
			fc.Key = []byte("another fleet's key, thirty-two bytes")
			other, err := fleet.New(fc, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := other.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			c := *f.chunks[victim]
			c.KV = make([]float32, len(c.KV)) // well-formed, finite, wrong
			other.PutChunk(f.ns, c.Key, &c, nil)
			if err := other.Shutdown(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		}, "unauthenticated"},
		{"unsigned version 1", func(t *testing.T, f *trustFleet) {
			b, err := chunkstore.EncodeChunk(f.chunks[victim])
			if err != nil {
				t.Fatal(err)
			}
			f.set(t, victim, b)
		}, "unauthenticated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTrustFleet(t)
			orig, err := f.rc.Get(context.Background(), f.key(victim)).Bytes()
			if err != nil {
				t.Fatal(err)
			}
			tc.plant(t, f)
			b, mem, res, tbt := f.nodeB(t, "b1")
			valid := map[int]bool{}
			for i := range f.keys {
				valid[i] = i != victim
			}
			if res.GetStaleChunks() != 1 || int(res.GetNonPrefixHitTokens()) != docLen-trustCS {
				t.Fatalf("lookup: %+v, want the forged chunk stale and the other %d tokens hit", res, docLen-trustCS)
			}
			b.checkChunks(mem, tbt, valid)
			if tier := b.s.chunks.store.Contains(f.keys[victim]); tier != chunkstore.TierNone {
				t.Fatalf("node B keeps the forged chunk in %v", tier)
			}
			st, _ := b.s.FleetTrustTotals()
			if got := map[string]uint64{"unauthenticated": st.Unauthenticated, "non_finite": st.NonFinite}[tc.reason]; got != 1 {
				t.Fatalf("refused %+v, want one %s", st, tc.reason)
			}
			b.s.MetricsBefore()
			if v := b.value("lmcache_blend_remote_reads_total", map[string]string{"result": "corrupt"}); v != 1 {
				t.Fatalf("corrupt reads %v, want 1", v)
			}

			// The value restored, B stores the document itself: what it
			// writes back (the chunks it loaded and the one it computes) is
			// exactly A's.
			f.set(t, victim, orig)
			b.prefill(mem, blocks(docBlock, (docLen+bs-1)/bs), docSeq, docLen)
			if _, err := b.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "b-doc", WorkerId: "w1", Tokens: f.doc,
				BlockTable: blocks(docBlock, (docLen+bs-1)/bs), Document: true, Model: testModel}); err != nil {
				t.Fatal(err)
			}
			b.s.waitRegistrations(t)
			if err := b.s.chunks.fleet.Flush(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			f.checkFleet(t)
		})
	}
}

// TestFleetRefusesOversizeValues replays the memory attack (issue 27):
// eight 48 MiB values under eight of the document's ten chunk keys. Node B
// refuses them without reading them (the lookup allocates a few MiB, not
// 8 × 48 MiB), and reuses the two valid chunks exactly.
func TestFleetRefusesOversizeValues(t *testing.T) {
	f := newTrustFleet(t)
	for i := 2; i < 10; i++ {
		if err := f.rc.SetRange(context.Background(), f.key(i), 48<<20-1, "x").Err(); err != nil {
			t.Fatal(err)
		}
	}
	b := newEnv(t, Config{Fleet: f.fc, ChunkSize: trustCS})
	mem := b.newWorker("w1", 0)
	prompt := promptWith(promptN, trustOff, f.doc, 11)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	t0 := time.Now()
	res := b.lookup(&cbv1.LookupRequest{RequestId: "big", Tokens: prompt, WorldSize: 1, Model: testModel})
	took := time.Since(t0)
	runtime.ReadMemStats(&m1)
	alloc := m1.TotalAlloc - m0.TotalAlloc
	t.Logf("lookup against 8 × 48 MiB values: %v, %d bytes allocated (heap in use %+d)", took.Round(time.Millisecond), alloc, int64(m1.HeapAlloc)-int64(m0.HeapAlloc))
	if alloc > 16<<20 {
		t.Fatalf("the lookup allocated %d bytes: the oversize values were read", alloc)
	}
	if res.GetStaleChunks() != 8 || res.GetNonPrefixHitTokens() != 2*trustCS {
		t.Fatalf("lookup: %+v, want 8 stale chunks and the 2 valid ones hit", res)
	}
	fillSentinel(mem)
	tbt := targetTable(promptN / bs)
	rr, err := b.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "big", WorkerId: "w1", BlockTable: tbt, Matches: res.GetMatches(), ChunkSize: trustCS})
	if err != nil || rr.GetScatteredTokens() != 2*trustCS {
		t.Fatalf("retrieve: %+v %v", rr, err)
	}
	b.checkChunks(mem, tbt, map[int]bool{0: true, 1: true})
	if st, _ := b.s.FleetTrustTotals(); st.Oversize != 8 {
		t.Fatalf("refused %+v, want 8 oversize", st)
	}
}

// TestFleetHealthDegraded: /health's fleet line says reachable while Redis
// answers and degraded (unreachable, the last error, the retry queue) when
// it is killed, while the server stays healthy and answers lookups from
// its own tiers; restarted, reachable again.
func TestFleetHealthDegraded(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	fc := fleet.Config{Key: testFleetKey, URL: srv.URL(), OpTimeout: 200 * time.Millisecond, HealthMaxAge: 10 * time.Millisecond,
		RetryMinBackoff: time.Second, RetryMaxBackoff: time.Second}
	e, _, doc := docEnv(t, Config{Fleet: fc})
	if h := e.s.FleetHealth(); !strings.HasPrefix(h, "reachable; retry queue 0; refused values 0") {
		t.Fatalf("up: %q", h)
	}
	srv.Kill()
	mem := e.newWorker("w9", 0)
	e.prefill(mem, blocks(docBlock, (docLen+bs-1)/bs), docSeq+1, docLen)
	other := tokens(rand.New(rand.NewPCG(5, 5)), docLen, 1000, 1000)
	if _, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "down-doc", WorkerId: "w9", Tokens: other,
		BlockTable: blocks(docBlock, (docLen+bs-1)/bs), Document: true, Model: testModel}); err != nil {
		t.Fatal(err)
	}
	var h string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		h = e.s.FleetHealth()
		if strings.HasPrefix(h, "degraded: Redis unreachable") && !strings.Contains(h, "retry queue 0;") && strings.Contains(h, "last error") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis killed: %q", h)
		}
	}
	t.Logf("fleet health with Redis killed: %s", h)
	if strings.Contains(h, redistest.Password) {
		t.Fatalf("the health line shows the password: %q", h)
	}
	if err := e.s.Health(); err != nil {
		t.Fatalf("the server is unhealthy with Redis down: %v", err)
	}
	if res := e.lookup(&cbv1.LookupRequest{RequestId: "down", Tokens: promptWith(promptN, 333, doc, 3), WorldSize: 1, Model: testModel}); res.GetNonPrefixHitTokens() != docLen {
		t.Fatalf("lookup with Redis down: %+v", res)
	}
	srv.Restart()
	for deadline := time.Now().Add(10 * time.Second); !strings.HasPrefix(e.s.FleetHealth(), "reachable"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Redis restarted: %q", e.s.FleetHealth())
		}
	}
	if st, ok := e.s.FleetTrustTotals(); !ok || !st.Reachable {
		t.Fatalf("trust totals %+v %v", st, ok)
	}
}
