package blend

import (
	"context"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/internal/redistest"
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
			fc := fleet.Config{URL: url, CoordinatorTimeout: 2 * time.Second}
			a, _, doc := docEnv(t, Config{Fleet: fc})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := a.s.fleet.Flush(ctx); err != nil {
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
	e, _, doc := docEnv(t, Config{Fleet: fleet.Config{URL: url}})
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
	fc := fleet.Config{URL: srv.URL(), CoordinatorTimeout: 2 * time.Second}
	a, _, doc := docEnv(t, Config{Fleet: fc})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.s.fleet.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ns, _, _ := a.s.fleetSpace(testModel)
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
