package blend

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/internal/redistest"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// TestFleetTwoNodes: a document stored by node A's blend server is found by
// node B's (which never saw it) at another offset through the fleet
// directory (cb.coordinator_match), read from Redis (cb.l2_load
// tier=redis) and scattered into B's worker memory exactly as A's own
// reuse would; against one Redis server and a 3-master cluster.
func TestFleetTwoNodes(t *testing.T) {
	for name, url := range map[string]string{
		"single":  redistest.Start(t, redistest.Options{}).URL(),
		"cluster": redistest.StartCluster(t).URL(),
	} {
		t.Run(name, func(t *testing.T) {
			fc := fleet.Config{Key: testFleetKey, URL: url, CoordinatorTimeout: 2 * time.Second}
			a, _, doc := docEnv(t, Config{Fleet: fc})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := a.s.chunks.fleet.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			b := newEnv(t, Config{Fleet: fc})
			mem := b.newWorker("w1", 0)
			const off = 700
			prompt := promptWith(promptN, off, doc, 11)
			res := b.lookup(&cbv1.LookupRequest{RequestId: "b1", Tokens: prompt, WorldSize: 1, Model: testModel})
			if res.GetNonPrefixHitTokens() != docLen || len(res.GetMatches()) != 1 || res.GetStaleChunks() != 0 || res.GetFound() != 2 {
				t.Fatalf("node B lookup: %+v", res)
			}
			fillSentinel(mem)
			bt := targetTable(promptN / bs)
			rr, err := b.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "b1", WorkerId: "w1", BlockTable: bt, Matches: res.GetMatches(), ChunkSize: 256})
			if err != nil || rr.GetScatteredTokens() != docLen || len(rr.GetMissing()) != 0 {
				t.Fatalf("node B retrieve: %+v %v", rr, err)
			}
			b.checkSlots(mem, bt, off, docLen, 0)
			b.s.MetricsBefore()
			if hits, ok := b.value("lmcache_blend_remote_reads_total", map[string]string{"result": "hit"}), b.value("lmcache_blend_coordinator_matches_total", map[string]string{"result": "ok"}); hits != 2 || ok != 1 {
				t.Fatalf("metrics: remote hits %v, coordinator ok %v", hits, ok)
			}
			// The document at the start of a prompt on a node that holds none
			// of it (the prefix leg covers nothing, the fleet's match all of
			// it): its tokens are counted once, and no prefix hit exceeds the
			// prefix coverage.
			c := newEnv(t, Config{Fleet: fc})
			c.newWorker("w2", 0)
			res0 := c.lookup(&cbv1.LookupRequest{RequestId: "c0", Tokens: promptWith(promptN, 0, doc, 12), WorldSize: 1, Model: testModel})
			if hit := res0.GetPrefixHitTokens() + res0.GetNonPrefixHitTokens(); hit != docLen || res0.GetPrefixHitTokens() > res0.GetPrefixCoverageTokens() {
				t.Fatalf("document at offset 0 on node C: %d hit tokens (prefix %d of coverage %d), want %d", hit,
					res0.GetPrefixHitTokens(), res0.GetPrefixCoverageTokens(), docLen)
			}

			b.shutdown()
			var coord, redisLoad bool
			for _, sp := range b.exp.GetSpans() {
				attrs := map[string]any{}
				for _, kv := range sp.Attributes {
					attrs[string(kv.Key)] = kv.Value.AsInterface()
				}
				switch sp.Name {
				case spanname.CBCoordinatorMatch:
					coord = attrs["matches"].(int64) >= 1 && attrs["timed_out"] == false && attrs["round_trips"].(int64) <= 2
				case spanname.CBL2Load:
					redisLoad = redisLoad || (attrs["tier"] == "redis" && attrs["chunks"].(int64) == 2)
				case spanname.CBFingerprintMatch:
					t.Error("cb.fingerprint_match with a fleet tier (the coordinator match replaces it)")
				}
			}
			if !coord || !redisLoad {
				t.Fatalf("node B trace: coordinator match %v, redis load %v", coord, redisLoad)
			}
		})
	}
}

// TestFleetRedisDown: with the fleet tier's Redis gone, lookups are still
// answered from the local tiers (the coordinator match fails fast and the
// local table is used).
func TestFleetRedisDown(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	url := srv.URL()
	srv.Kill()
	e, _, doc := docEnv(t, Config{Fleet: fleet.Config{Key: testFleetKey, URL: url}})
	t0 := time.Now()
	res := e.lookup(&cbv1.LookupRequest{RequestId: "down", Tokens: promptWith(promptN, 333, doc, 3), WorldSize: 1, Model: testModel})
	if res.GetNonPrefixHitTokens() != docLen || time.Since(t0) > 2*time.Second {
		t.Fatalf("lookup with Redis down: %+v after %v", res, time.Since(t0))
	}
}

// TestFleetEvictedChunkIsStale: a directory entry whose chunk Redis evicted
// (here deleted, deterministically; and under a real maxmemory) is stale in
// cb.classify and nothing is reused from it; nothing wrong is ever served.
func TestFleetEvictedChunkIsStale(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	fc := fleet.Config{Key: testFleetKey, URL: srv.URL(), CoordinatorTimeout: 2 * time.Second}
	a, _, doc := docEnv(t, Config{Fleet: fc})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.s.chunks.fleet.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ns, _, _ := a.s.fleetSpace(testModel, 1)
	keys := chunkstore.ChainKeys(testModel, 0, doc, 256)
	if _, err := srv.Command("DEL", "cb:"+ns+":c:"+keys[1].String()); err != nil {
		t.Fatal(err)
	}
	b := newEnv(t, Config{Fleet: fc})
	b.newWorker("w1", 0)
	res := b.lookup(&cbv1.LookupRequest{RequestId: "ev", Tokens: promptWith(promptN, 500, doc, 5), WorldSize: 1, Model: testModel})
	// Chunk 0 (256 tokens) is still served; chunk 1 is stale and cut out.
	if res.GetStaleChunks() != 1 || res.GetFound() != 1 || res.GetNonPrefixHitTokens() != 256 {
		t.Fatalf("lookup after eviction: %+v", res)
	}
}

// TestFleetTensorParallel: with tensor parallelism (world size 2) and the
// fleet tier, a document stored by node A's two ranks is found by node B
// (whose two ranks never saw it) through the fleet directory
// (cb.coordinator_match), every rank's chunk is read from Redis, and B's
// retrieve fills each rank's memory with that rank's KV from A.
func TestFleetTensorParallel(t *testing.T) {
	fc := fleet.Config{Key: testFleetKey, URL: redistest.Start(t, redistest.Options{}).URL(), CoordinatorTimeout: 2 * time.Second}
	a := newEnv(t, Config{Fleet: fc})
	doc := tokens(rand.New(rand.NewPCG(1, 2)), docLen, 1000, 1000)
	bt := blocks(docBlock, (docLen+bs-1)/bs)
	for rank := range 2 {
		mem := newMem(t)
		a.registerRank("tp", rank, 2, mem)
		a.prefill(mem, bt, docSeq+rank, docLen) // each rank holds its own KV
		resp, err := a.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "store-doc", WorkerId: "tp", Rank: int32(rank), Tokens: doc, BlockTable: bt, Document: true, Model: testModel})
		if err != nil || resp.GetStoredChunks() != 2 {
			t.Fatalf("rank %d store: %+v %v", rank, resp, err)
		}
	}
	a.s.waitRegistrations(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.s.chunks.fleet.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	b := newEnv(t, Config{Fleet: fc})
	mems := []*kvcache.Memory{newMem(t), newMem(t)}
	for rank, mem := range mems {
		b.registerRank("tp", rank, 2, mem)
	}
	const off = 700
	prompt := promptWith(promptN, off, doc, 11)
	// A whole-model lookup finds nothing: the group's chunks are its own.
	if res := b.lookup(&cbv1.LookupRequest{RequestId: "whole", Tokens: prompt, WorldSize: 1, Model: testModel}); len(res.GetMatches()) != 0 {
		t.Fatalf("whole-model lookup found the group's chunks: %+v", res)
	}
	res := b.lookup(&cbv1.LookupRequest{RequestId: "b-tp", Tokens: prompt, WorldSize: 2, Model: testModel})
	if res.GetNonPrefixHitTokens() != docLen || len(res.GetMatches()) != 1 || !res.GetPerRankOk() || res.GetFound() != 2 || res.GetStaleChunks() != 0 {
		t.Fatalf("node B lookup: %+v", res)
	}
	tbt := targetTable(promptN / bs)
	for rank, mem := range mems {
		rr, err := b.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "b-tp", WorkerId: "tp", Rank: int32(rank), BlockTable: tbt, Matches: res.GetMatches(), ChunkSize: 256})
		if err != nil || rr.GetScatteredTokens() != docLen || len(rr.GetMissing()) != 0 {
			t.Fatalf("node B rank %d retrieve: %+v %v", rank, rr, err)
		}
		b.checkSeqSlots(mem, tbt, docSeq+rank, off, docLen, 0)
	}
	b.s.MetricsBefore()
	if hits := b.value("lmcache_blend_remote_reads_total", map[string]string{"result": "hit"}); hits != 4 {
		t.Fatalf("remote hits %v, want 4 (2 chunks × 2 ranks)", hits)
	}

	b.shutdown()
	var coord, redisLoad bool
	for _, sp := range spansNamed(b.exp.GetSpans(), spanname.CBCoordinatorMatch) {
		if v, _ := attr(sp, "matches"); v.AsInt64() == 1 && sp.Parent.IsValid() {
			coord = true
		}
	}
	for _, sp := range spansNamed(b.exp.GetSpans(), spanname.CBL2Load) {
		tier, _ := attr(sp, "tier")
		chunks, _ := attr(sp, "chunks")
		redisLoad = redisLoad || (tier.AsString() == "redis" && chunks.AsInt64() == 4)
	}
	if !coord || !redisLoad {
		t.Fatalf("node B trace: coordinator match %v, redis load of both ranks' chunks %v", coord, redisLoad)
	}
}

// fleetStatus asks server c for the fleet state of the documents ids, as the
// engine does before it answers an ingest (BlendService.FleetStatus).
func fleetStatus(t *testing.T, c cbv1.BlendServiceClient, ids ...string) map[string]string {
	t.Helper()
	resp, err := c.FleetStatus(ctxT(t), &cbv1.FleetStatusRequest{RequestIds: ids})
	if err != nil {
		t.Fatalf("fleet status query: %v", err)
	}
	out := map[string]string{}
	if !resp.GetFleet() {
		return out
	}
	if len(resp.GetStates()) != len(ids) {
		t.Fatalf("fleet status: %d states for %d ids", len(resp.GetStates()), len(ids))
	}
	for i, id := range ids {
		out[id] = resp.GetStates()[i]
	}
	return out
}

// TestFleetWriteDuringRedisPause: a document stored on node A while Redis is
// paused (SIGSTOP) is reported pending (not shared yet), its failed fleet
// writes wait on the retry queue, and once Redis continues they are written:
// node B, which never saw the document, then finds and loads all of it; the
// status is shared. The retry and document counters say what happened.
func TestFleetWriteDuringRedisPause(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	fc := fleet.Config{Key: testFleetKey, URL: srv.URL(), CoordinatorTimeout: 2 * time.Second, RetryMaxBackoff: 500 * time.Millisecond}
	a := newEnv(t, Config{Fleet: fc})
	mem := a.newWorker("w0", 0)
	doc := tokens(rand.New(rand.NewPCG(1, 2)), docLen, 1000, 1000)
	bt := blocks(docBlock, (docLen+bs-1)/bs)
	a.prefill(mem, bt, docSeq, docLen)

	srv.Pause()
	paused := true
	defer func() {
		if paused {
			srv.Resume()
		}
	}()
	t0 := time.Now()
	if _, err := a.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "doc-paused", WorkerId: "w0", Tokens: doc, BlockTable: bt, Document: true, Model: testModel}); err != nil {
		t.Fatal(err)
	}
	a.s.waitRegistrations(t)
	if st := fleetStatus(t, a.c, "doc-paused", "doc-never"); st["doc-paused"] != "pending" || st["doc-never"] != "not_shared" {
		t.Fatalf("during the pause: %v, want doc-paused pending, doc-never not_shared", st)
	}
	time.Sleep(2 * time.Second)
	srv.Resume()
	paused = false
	pause := time.Since(t0)
	var st map[string]string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if st = fleetStatus(t, a.c, "doc-paused"); st["doc-paused"] == "shared" {
			break
		}
	}
	shared := time.Since(t0)
	if st["doc-paused"] != "shared" {
		t.Fatalf("after the pause: %v, want shared", st)
	}

	b := newEnv(t, Config{Fleet: fc})
	bmem := b.newWorker("w1", 0)
	const off = 700
	res := b.lookup(&cbv1.LookupRequest{RequestId: "b1", Tokens: promptWith(promptN, off, doc, 11), WorldSize: 1, Model: testModel})
	fillSentinel(bmem)
	tbt := targetTable(promptN / bs)
	rr, err := b.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "b1", WorkerId: "w1", BlockTable: tbt, Matches: res.GetMatches(), ChunkSize: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("paused %v; shared %v after the store; node B reused %d of %d tokens (%d stale chunks)",
		pause.Round(time.Millisecond), shared.Round(time.Millisecond), rr.GetScatteredTokens(), docLen, res.GetStaleChunks())
	if got := float64(rr.GetScatteredTokens()) / docLen; got < 0.95 || res.GetStaleChunks() != 0 {
		t.Fatalf("node B reused %d of %d tokens of the document written during the pause (%+v)", rr.GetScatteredTokens(), docLen, res)
	}
	b.checkSlots(bmem, tbt, off, docLen, 0)
	a.s.MetricsBefore()
	for _, c := range []struct {
		name, key, value string
		min              float64
	}{
		{"lmcache_blend_remote_write_retries_total", "result", "queued", 3}, // 2 chunks and the directory entry
		{"lmcache_blend_remote_write_retries_total", "result", "ok", 3},
		{"lmcache_blend_remote_write_retries_total", "result", "failed", 1},
		{"lmcache_blend_remote_documents_total", "state", "pending", 1},
		{"lmcache_blend_remote_documents_total", "state", "shared", 1},
		{"lmcache_blend_remote_documents_total", "state", "not_shared", 1},
	} {
		if v := a.value(c.name, map[string]string{c.key: c.value}); v < c.min {
			t.Errorf("%s{%s=%q} = %v, want >= %v", c.name, c.key, c.value, v, c.min)
		}
	}
	if v := a.value("lmcache_blend_remote_write_retries_total", map[string]string{"result": "dropped"}); v != 0 {
		t.Errorf("dropped retries %v, want 0", v)
	}
	if v := a.value("lmcache_blend_remote_retry_queue", nil); v != 0 {
		t.Errorf("retry queue %v, want 0", v)
	}
}

// TestFleetStatusQuery: the query's bounds, and a server without a fleet
// tier, which answers no state.
func TestFleetStatusQuery(t *testing.T) {
	e := newEnv(t, Config{})
	if st := fleetStatus(t, e.c, "doc-1"); len(st) != 0 {
		t.Fatalf("without a fleet tier: %v, want no state", st)
	}
	for _, tc := range []struct {
		name string
		ids  []string
	}{
		{"no id", nil},
		{"empty id", []string{""}},
		{"too many", strings.Split(strings.Repeat("d,", MaxFleetStatusIDs), ",")},
		{"id too long", []string{strings.Repeat("x", maxRequestID+1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.c.FleetStatus(ctxT(t), &cbv1.FleetStatusRequest{RequestIds: tc.ids})
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
		})
	}
}
