package blend

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

func TestCorruptL2File(t *testing.T) {
	dir := t.TempDir()
	e, _, doc := docEnv(t, Config{L1Bytes: 1024, L2Dir: dir})
	keys := chunkstore.ChainKeys(testModel, 0, doc, 256)
	path := filepath.Join(dir, keys[0].String()+".chunk")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	res := e.lookup(&cbv1.LookupRequest{RequestId: "corrupt", Tokens: promptWith(promptN, 700, doc, 1), WorldSize: 1, Model: testModel})
	// Chunk 0 is a miss (never wrong KV); chunk 1 still serves its tokens.
	if res.GetStaleChunks() != 1 || res.GetFound() != 1 || res.GetNonPrefixHitTokens() != docLen-256 {
		t.Fatalf("lookup %+v", res)
	}
	m := res.GetMatches()
	if len(m) != 1 || m[0].GetStoredSt() != 256 || m[0].GetCurSt() != 956 || m[0].GetCurEd() != 1000 || m[0].GetFirstChunkStart() != 256 {
		t.Fatalf("matches %v", m)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("corrupt file still there: %v", err)
	}
	e.shutdown()
	e.s.MetricsBefore()
	if got := e.value("lmcache_blend_l2_corrupt_chunks_total", nil); got != 1 {
		t.Errorf("l2_corrupt_chunks %v, want 1", got)
	}
	if got := e.value("lmcache_blend_lookup_stale_chunks_total", nil); got != 1 {
		t.Errorf("lookup_stale_chunks %v, want 1", got)
	}
	if got := e.value("lmcache_blend_l2_read_bytes_total", nil); got <= 0 {
		t.Errorf("l2_read_bytes %v", got)
	}
}

func TestL1EvictionStaleTwoStrikes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	full, err := chunkstore.NewChunk(chunkstore.Key{}, testModel, 0, chunkstore.LayoutOf(testLayout, theta), make([]int32, 256), 0)
	if err != nil {
		t.Fatal(err)
	}
	tail, _ := chunkstore.NewChunk(chunkstore.Key{}, testModel, 0, chunkstore.LayoutOf(testLayout, theta), make([]int32, 44), 0)
	// Room for one document (a full and a tail chunk), not two.
	e, mem, docA := docEnv(t, Config{L1Bytes: full.Size() + tail.Size() + 512})
	docB := tokens(r, docLen, 5000, 1000)
	bt := blocks(20, 19)
	e.prefill(mem, bt, 2, docLen)
	if _, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "b", WorkerId: "w0", Tokens: docB, BlockTable: bt}); err != nil {
		t.Fatal(err)
	}
	e.s.waitRegistrations(t)
	st := e.s.Stats()
	if st.Store.L1Evictions != 2 || st.Store.L1Chunks != 2 {
		t.Fatalf("store %+v", st.Store)
	}
	// The eviction was the first strike; the lookup's storage miss the second.
	prompt := promptWith(promptN, 700, docA, 2)
	res := e.lookup(&cbv1.LookupRequest{RequestId: "stale", Tokens: prompt, WorldSize: 1, Model: testModel})
	if res.GetStaleChunks() != 2 || res.GetFingerprintHits() != 2 || res.GetStorageHits() != 0 || len(res.GetMatches()) != 0 ||
		res.GetHitRate() != 0 || res.GetNonPrefixHitTokens() != 0 {
		t.Fatalf("lookup %+v", res)
	}
	keysA := chunkstore.ChainKeys(testModel, 0, docA, 256)
	if tb := e.s.chunks.table(testModel, false); tb.Contains(keysA[0]) || tb.Contains(keysA[1]) {
		t.Fatal("stale chunks still registered after two strikes")
	}
	res = e.lookup(&cbv1.LookupRequest{RequestId: "stale2", Tokens: prompt, WorldSize: 1, Model: testModel})
	if res.GetTableHits() != 0 || res.GetStaleChunks() != 0 || res.GetFingerprintHits() != 0 {
		t.Fatalf("second lookup %+v", res)
	}
	// Document B is still served.
	res = e.lookup(&cbv1.LookupRequest{RequestId: "b-hit", Tokens: promptWith(promptN, 100, docB, 3), WorldSize: 1, Model: testModel})
	if res.GetNonPrefixHitTokens() != docLen {
		t.Fatalf("doc B lookup %+v", res)
	}
	e.shutdown()
	e.s.MetricsBefore()
	if got := e.value("lmcache_blend_fingerprints_unregistered_total", nil); got != 2 {
		t.Errorf("fingerprints_unregistered %v, want 2", got)
	}
	if got := e.value("lmcache_blend_chunks_evicted_total", map[string]string{"tier": "l1"}); got != 2 {
		t.Errorf("chunks_evicted{l1} %v, want 2", got)
	}
	if got := e.value("lmcache_blend_fingerprints", nil); got != 2 {
		t.Errorf("fingerprints gauge %v, want 2 (document B)", got)
	}
}

func TestGRPCErrors(t *testing.T) {
	e := newEnv(t, Config{})
	e.newWorker("w0", 0)
	ctx := ctxT(t)
	someToken := make([]byte, TokenBytes) // well formed, nobody's
	bt := blocks(0, 10)
	for _, tc := range []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"lookup/no id", func() error {
			_, err := e.c.Lookup(ctx, &cbv1.LookupRequest{Tokens: []int32{1}})
			return err
		}, codes.InvalidArgument},
		{"lookup/no tokens", func() error {
			_, err := e.c.Lookup(ctx, &cbv1.LookupRequest{RequestId: "x"})
			return err
		}, codes.InvalidArgument},
		{"lookup/bad world size", func() error {
			_, err := e.c.Lookup(ctx, &cbv1.LookupRequest{RequestId: "x", Tokens: []int32{1}, WorldSize: -1})
			return err
		}, codes.InvalidArgument},
		{"lookup/too many pending stores", func() error {
			_, err := e.c.Lookup(ctx, &cbv1.LookupRequest{RequestId: "x", Tokens: []int32{1}, PendingStoreIds: make([]string, defaults.MaxPendingStores+1)})
			return err
		}, codes.InvalidArgument},
		{"lookup/empty pending store id", func() error {
			_, err := e.c.Lookup(ctx, &cbv1.LookupRequest{RequestId: "x", Tokens: []int32{1}, PendingStoreIds: []string{"a", ""}})
			return err
		}, codes.InvalidArgument},
		{"lookup/pending store id too long", func() error {
			_, err := e.c.Lookup(ctx, &cbv1.LookupRequest{RequestId: "x", Tokens: []int32{1}, PendingStoreIds: []string{strings.Repeat("a", maxRequestID+1)}})
			return err
		}, codes.InvalidArgument},
		{"retrieve/unknown worker", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "ghost", BlockTable: bt, RegistrationToken: someToken})
			return err
		}, codes.FailedPrecondition},
		{"retrieve/unknown rank", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", Rank: 3, BlockTable: bt, RegistrationToken: someToken})
			return err
		}, codes.FailedPrecondition},
		{"retrieve/block outside memory", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: []int32{0, 160}})
			return err
		}, codes.InvalidArgument},
		{"retrieve/negative block", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: []int32{0, -1}})
			return err
		}, codes.InvalidArgument},
		{"retrieve/block table longer than the memory", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: make([]int32, 161)})
			return err
		}, codes.InvalidArgument},
		{"retrieve/block twice", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: []int32{3, 4, 3}})
			return err
		}, codes.InvalidArgument},
		{"retrieve/from_token beyond any prompt", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: bt, FromToken: MaxTokens + 1})
			return err
		}, codes.InvalidArgument},
		{"retrieve/too many matches", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: bt, Matches: make([]*cbv1.Match, MaxMatches+1)})
			return err
		}, codes.InvalidArgument},
		{"retrieve/matches spanning more than a prompt", func() error {
			keys := make([][]byte, MaxTokens/256)
			for i := range keys {
				keys[i] = make([]byte, 32)
			}
			m := &cbv1.Match{StoredSt: 0, StoredEd: MaxTokens, CurSt: 0, CurEd: MaxTokens, ChunkKeys: keys}
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: bt, Matches: []*cbv1.Match{m, m}})
			return err
		}, codes.InvalidArgument},
		{"retrieve/bad rank", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", Rank: -1, BlockTable: bt})
			return err
		}, codes.InvalidArgument},
		{"retrieve/bad match", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: bt,
				Matches: []*cbv1.Match{{StoredSt: 0, StoredEd: 10, CurSt: 5, CurEd: 20, ChunkKeys: [][]byte{make([]byte, 32)}}}})
			return err
		}, codes.InvalidArgument},
		{"retrieve/too few keys", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: bt,
				Matches: []*cbv1.Match{{StoredSt: 0, StoredEd: 300, CurSt: 5, CurEd: 305, ChunkKeys: [][]byte{make([]byte, 32)}}}})
			return err
		}, codes.InvalidArgument},
		{"retrieve/short key", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: bt,
				Matches: []*cbv1.Match{{StoredSt: 0, StoredEd: 10, CurSt: 5, CurEd: 15, ChunkKeys: [][]byte{{1, 2}}}}})
			return err
		}, codes.InvalidArgument},
		{"retrieve/chunk size", func() error {
			_, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: bt, ChunkSize: 128})
			return err
		}, codes.InvalidArgument},
		{"store/unknown worker", func() error {
			_, err := e.c.Store(ctx, &cbv1.StoreRequest{RequestId: "s", WorkerId: "ghost", Tokens: []int32{1}, BlockTable: bt, RegistrationToken: someToken})
			return err
		}, codes.FailedPrecondition},
		{"store/short block table", func() error {
			_, err := e.c.Store(ctx, &cbv1.StoreRequest{RequestId: "s", WorkerId: "w0", Tokens: make([]int32, 200), BlockTable: bt})
			return err
		}, codes.InvalidArgument},
		{"store/other model", func() error {
			_, err := e.c.Store(ctx, &cbv1.StoreRequest{RequestId: "s", WorkerId: "w0", Tokens: []int32{1}, BlockTable: bt, Model: "other"})
			return err
		}, codes.InvalidArgument},
		{"store/block outside memory", func() error {
			_, err := e.c.Store(ctx, &cbv1.StoreRequest{RequestId: "s", WorkerId: "w0", Tokens: []int32{1}, BlockTable: []int32{160}})
			return err
		}, codes.InvalidArgument},
		{"store/block table of the whole pool and more", func() error {
			_, err := e.c.Store(ctx, &cbv1.StoreRequest{RequestId: "s", WorkerId: "w0", Tokens: []int32{1}, BlockTable: blocks(0, 161)})
			return err
		}, codes.InvalidArgument},
		{"store/block twice", func() error {
			_, err := e.c.Store(ctx, &cbv1.StoreRequest{RequestId: "s", WorkerId: "w0", Tokens: make([]int32, 40), BlockTable: []int32{7, 8, 7}})
			return err
		}, codes.InvalidArgument},
		{"store/too many tokens", func() error {
			_, err := e.c.Store(ctx, &cbv1.StoreRequest{RequestId: "s", WorkerId: "w0", Tokens: make([]int32, MaxTokens+1), BlockTable: bt})
			return err
		}, codes.InvalidArgument},
		{"store/no tokens", func() error {
			_, err := e.c.Store(ctx, &cbv1.StoreRequest{RequestId: "s", WorkerId: "w0", BlockTable: bt})
			return err
		}, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(tc.call()); got != tc.want {
				t.Fatalf("code %v, want %v", got, tc.want)
			}
		})
	}
	if n := e.s.Stats().Workers; n != 1 {
		t.Fatalf("%d workers registered after bad requests, want 1", n)
	}
}

// A restarted worker registers the same (worker, rank) again: the new
// memory replaces the old mapping, the old connection is closed and its
// token stops working.
func TestReregistrationReplaces(t *testing.T) {
	e, _, doc := docEnv(t, Config{})
	ctx := ctxT(t)
	old, err := e.s.regs.acquire("test", "w0", 0, e.tokens[workerKey{"w0", 0}])
	if err != nil {
		t.Fatal(err)
	}
	e.s.regs.release(old)
	oldToken := e.tokens[workerKey{"w0", 0}]
	mem := newMem(t)
	c, tok := e.register("w0", 0, mem)
	if string(tok) == string(oldToken) {
		t.Fatal("the new registration has the old token")
	}
	if n := e.s.Stats().Workers; n != 1 {
		t.Fatalf("%d registrations, want 1", n)
	}
	// The old connection was closed by the server.
	waitFor(t, "the replaced connection closed", func() bool { return e.s.Stats().KVConnections == 1 })
	if _, err := e.raw.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "old", WorkerId: "w0", BlockTable: blocks(0, 1), RegistrationToken: oldToken}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("retrieve with the replaced token: %v", err)
	}
	res := e.lookup(&cbv1.LookupRequest{RequestId: "re", Tokens: promptWith(promptN, 64, doc, 5), WorldSize: 1, Model: testModel})
	bt := targetTable(promptN / bs)
	if _, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "re", WorkerId: "w0", BlockTable: bt, Matches: res.GetMatches()}); err != nil {
		t.Fatal(err)
	}
	e.checkSlots(mem, bt, 64, docLen, 0) // written into the new memory
	c.Close()
	waitFor(t, "the registration released", func() bool { return e.s.Stats().Workers == 0 })
}

// A registration ends when its connection closes (a dead worker) or when
// it is unregistered; its token no longer works.
func TestRegistrationEndsWithItsConnection(t *testing.T) {
	e := newEnv(t, Config{})
	c, tok := e.register("w0", 0, newMem(t))
	c.Close()
	waitFor(t, "the registration released", func() bool { return e.s.Stats().Workers == 0 })
	_, err := e.raw.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "r", WorkerId: "w0", BlockTable: blocks(0, 1), RegistrationToken: tok})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("retrieve after the connection closed: %v", err)
	}

	c, tok = e.register("w1", 0, newMem(t))
	if _, err := e.raw.UnregisterKV(ctxT(t), &cbv1.UnregisterKVRequest{WorkerId: "w1", RegistrationToken: make([]byte, TokenBytes)}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("unregister with a wrong token: %v", err)
	}
	if _, err := e.raw.UnregisterKV(ctxT(t), &cbv1.UnregisterKVRequest{WorkerId: "w1", RegistrationToken: tok}); err != nil {
		t.Fatal(err)
	}
	if st := e.s.Stats(); st.Workers != 0 || st.KVRegistrationsReleased != 2 {
		t.Fatalf("stats %+v", st)
	}
	// The server closed the connection.
	if err := c.WaitClosed(); err == nil {
		t.Fatal("connection still open after unregistering")
	}
	waitFor(t, "the connections closed", func() bool { return e.s.Stats().KVConnections == 0 })
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLookupEmptyStore(t *testing.T) {
	e := newEnv(t, Config{})
	res := e.lookup(&cbv1.LookupRequest{RequestId: "once", Tokens: make([]int32, 100), WorldSize: 1})
	if res.GetRequestedTokens() != 100 || res.GetHitRate() != 0 || len(res.GetMatches()) != 0 {
		t.Fatalf("empty-store lookup %+v", res)
	}
	// The same request id again is simply another lookup: nothing is kept.
	if res := e.lookup(&cbv1.LookupRequest{RequestId: "once", Tokens: make([]int32, 50), WorldSize: 1}); res.GetRequestedTokens() != 50 {
		t.Fatalf("second lookup %+v", res)
	}
	if st := e.s.Stats(); st.LookupsDone != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// blockQueue occupies the goroutine(s) of q with a job that waits for
// release; it returns once the job runs.
func blockQueue(t *testing.T, q chan func(), release <-chan struct{}) {
	t.Helper()
	entered := make(chan struct{})
	q <- func() { close(entered); <-release }
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("queue not served")
	}
}

func TestLookupQueueFullAndDeadline(t *testing.T) {
	e := newEnv(t, Config{LookupWorkers: 1, LookupQueue: 1})
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	blockQueue(t, e.s.lookups.queue, release)

	// "b" waits in the queue; its caller's deadline passes first. (Called
	// in process so that the server sees the caller's own context.)
	bctx, cancel := context.WithTimeout(ctxT(t), 200*time.Millisecond)
	defer cancel()
	berr := make(chan error, 1)
	go func() {
		_, err := e.s.Service().Lookup(bctx, &cbv1.LookupRequest{RequestId: "b", Tokens: []int32{1, 2, 3}})
		berr <- err
	}()
	for len(e.s.lookups.queue) == 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := e.c.Lookup(ctxT(t), &cbv1.LookupRequest{RequestId: "c", Tokens: []int32{1, 2, 3}}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("lookup with a full queue: %v, want ResourceExhausted", err)
	}
	if err := <-berr; status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("queued lookup past its deadline: %v, want DeadlineExceeded", err)
	}
	free()
	// The worker skips "b" (its caller is gone) and serves the next one.
	if res := e.lookup(&cbv1.LookupRequest{RequestId: "d", Tokens: []int32{1, 2, 3}}); res.GetRequestedTokens() != 3 {
		t.Fatalf("lookup after release: %+v", res)
	}
	if st := e.s.Stats(); st.LookupsRejected != 1 || st.LookupsAbandoned != 1 || st.LookupsDone != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestNotRunning(t *testing.T) {
	s, err := New(Config{}, component.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if s.Addr() != "" {
		t.Fatal("listening before Start")
	}
	if _, err := s.Service().Lookup(ctx, &cbv1.LookupRequest{RequestId: "x", Tokens: []int32{1}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("before Start: %v", err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err == nil {
		t.Fatal("second Start succeeded")
	}
	if s.Addr() == "" {
		t.Fatal("no bound address after Start")
	}
	// A busy address fails Start with nothing left running (goleak).
	busy, err := New(Config{Addr: s.Addr()}, component.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := busy.Start(ctx); err == nil {
		t.Fatal("Start on a busy address succeeded")
	}
	if err := busy.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Service().Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "x"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("after Shutdown: %v", err)
	}
	if err := s.Start(ctx); err == nil {
		t.Fatal("Start after Shutdown succeeded")
	}
	// Shutdown without Start.
	s2, err := New(Config{}, component.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{ChunkSize: chunkstore.MaxChunkTokens + 1}, component.Deps{}); err == nil {
		t.Fatal("oversized chunk size accepted")
	}
}

func TestMetricsExposed(t *testing.T) {
	e, _, doc := docEnv(t, Config{})
	res := e.lookup(&cbv1.LookupRequest{RequestId: "m", Tokens: promptWith(promptN, 700, doc, 8), WorldSize: 1, Model: testModel})
	if _, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "m", WorkerId: "w0", BlockTable: targetTable(promptN / bs), Matches: res.GetMatches()}); err != nil {
		t.Fatal(err)
	}
	e.shutdown()
	e.s.MetricsBefore()
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"lmcache_blend_lookup_requests_total", nil, 1},
		{"lmcache_blend_lookup_hit_tokens_total", map[string]string{"leg": "non_prefix"}, docLen},
		{"lmcache_blend_lookup_hit_tokens_total", map[string]string{"leg": "prefix"}, 0},
		{"lmcache_blend_lookup_requested_tokens_total", nil, promptN},
		{"lmcache_blend_lookup_fingerprint_hits_total", nil, 2},
		{"lmcache_blend_lookup_storage_hits_total", nil, 2},
		{"lmcache_blend_retrieve_requests_total", nil, 1},
		{"lmcache_blend_retrieve_failures_total", nil, 0},
		{"lmcache_blend_scattered_tokens_total", nil, docLen},
		{"lmcache_blend_store_requests_total", nil, 1},
		{"lmcache_blend_stored_chunks_total", nil, 2},
		{"lmcache_blend_l1_chunks", nil, 2},
		{"lmcache_blend_fingerprints", nil, 2},
		{"lmcache_blend_lookup_duration_seconds", nil, 1},
		{"lmcache_blend_fingerprint_match_duration_seconds", nil, 1},
		{"lmcache_blend_sparse_prefetch_duration_seconds", nil, 1},
		{"lmcache_blend_retrieve_duration_seconds", nil, 1},
		{"lmcache_blend_scatter_duration_seconds", nil, 1},
		{"lmcache_blend_event_bus_dropped_total", nil, 0},
	} {
		if got := e.value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got, st := e.value("lmcache_blend_event_bus_published_total", nil), e.s.Stats(); got != float64(st.EventsPublished) || got != 16 {
		t.Errorf("event_bus_published %v, bus says %d, want 16 (store 2, lookup 10, retrieve 4)", got, st.EventsPublished)
	}
	if got := e.value("lmcache_blend_l1_bytes", nil); got <= 0 {
		t.Errorf("l1_bytes %v", got)
	}
}

func TestRegistrationQueueFullDrops(t *testing.T) {
	e := newEnv(t, Config{RegisterQueue: 1})
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	blockQueue(t, e.s.chunks.regQ, release) // the registration goroutine is busy
	mem := e.newWorker("w0", 0)
	bt := blocks(0, 2)
	e.prefill(mem, bt, 3, 20)
	r := rand.New(rand.NewPCG(9, 9))
	store := func() {
		t.Helper()
		resp, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "q", WorkerId: "w0", Tokens: tokens(r, 20, 0, 50000), BlockTable: bt})
		if err != nil || resp.GetStoredChunks() != 1 {
			t.Fatalf("store: %v %v", resp, err)
		}
	}
	store() // queued
	store() // dropped: the queue holds one
	free()
	e.s.waitRegistrations(t)
	if st := e.s.Stats(); st.Registrations != 1 || st.RegistrationsDropped != 1 || st.Fingerprints != 1 {
		t.Fatalf("stats %+v", st)
	}
}
