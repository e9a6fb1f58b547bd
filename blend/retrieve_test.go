package blend

import (
	"fmt"
	"github.com/cacheblend/cacheblend/rpc/kvsock"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

const (
	docSeq   = 1
	docLen   = 300
	promptN  = 2000
	docBlock = 0 // the document's blocks: 0..18
)

// docEnv stores a 300-token document prefilled at positions 0..299 and
// returns its tokens.
func docEnv(t testing.TB, cfg Config) (*env, *kvcache.Memory, []int32) {
	t.Helper()
	e := newEnv(t, cfg)
	mem := e.newWorker("w0", 0)
	r := rand.New(rand.NewPCG(1, 2))
	doc := tokens(r, docLen, 1000, 1000)
	bt := blocks(docBlock, (docLen+bs-1)/bs)
	e.prefill(mem, bt, docSeq, docLen)
	resp, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "store-doc", WorkerId: "w0", Tokens: doc, BlockTable: bt, Document: true, Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetStoredChunks() != 2 || resp.GetSkippedChunks() != 0 {
		t.Fatalf("store: stored %d skipped %d, want 2 and 0", resp.GetStoredChunks(), resp.GetSkippedChunks())
	}
	if want := int64(docLen) * testLayout.TokenBytes(); resp.GetBytes() != want {
		t.Fatalf("store bytes %d, want %d", resp.GetBytes(), want)
	}
	e.s.waitRegistrations(t)
	return e, mem, doc
}

// promptWith places doc at offset off of a prompt of n filler tokens.
func promptWith(n, off int, doc []int32, seed uint64) []int32 {
	p := tokens(rand.New(rand.NewPCG(seed, 7)), n, 3000, 1000)
	copy(p[off:], doc)
	return p
}

// checkSlots verifies the target memory: positions [off, off+n) of bt (at
// or after from) hold the document's token pos-off with V exact and K
// rotated to pos within 1e-4; every other slot of bt's blocks is sentinel.
func (e *env) checkSlots(mem *kvcache.Memory, bt []int32, off, n, from int) {
	e.t.Helper()
	e.checkSeqSlots(mem, bt, docSeq, off, n, from)
}

// checkSeqSlots is checkSlots for the KV of sequence seq.
func (e *env) checkSeqSlots(mem *kvcache.Memory, bt []int32, seq, off, n, from int) {
	e.t.Helper()
	bad := 0
	for b, id := range bt {
		for o := range bs {
			pos := b*bs + o
			slot := int(id)*bs + o
			for layer := range testLayout.NumLayers {
				k, v := mem.TokenK(layer, slot), mem.TokenV(layer, slot)
				if pos >= off && pos < off+n && pos >= from {
					j := pos - off
					want := e.wantK(seq, j, layer, pos)
					for f := range k {
						if math.Abs(float64(k[f]-want[f])) > 1e-4 || v[f] != rawV(seq, j, layer, f) {
							if bad++; bad < 5 {
								e.t.Errorf("pos %d layer %d f %d: K %v want %v, V %v want %v", pos, layer, f, k[f], want[f], v[f], rawV(seq, j, layer, f))
							}
						}
					}
					continue
				}
				for f := range k {
					if k[f] != sentinel || v[f] != sentinel {
						if bad++; bad < 5 {
							e.t.Errorf("pos %d (slot %d) layer %d written, outside the match", pos, slot, layer)
						}
					}
				}
			}
		}
	}
}

// targetTable is a 125-block table for a 2,000-token prompt, using blocks
// 20..144 in reverse order (disjoint from the document's).
func targetTable(n int) []int32 {
	bt := make([]int32, n)
	for i := range bt {
		bt[i] = int32(144 - i)
	}
	return bt
}

func partials(off, n int) int32 {
	p := int32(0)
	if off%bs != 0 {
		p++
	}
	if (off+n)%bs != 0 {
		p++
	}
	return p
}

func TestLookupAndRetrieveNonPrefixAnyOffset(t *testing.T) {
	e, mem, doc := docEnv(t, Config{})
	// Storing the same document again skips both chunks.
	resp, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "store-again", WorkerId: "w0", Tokens: doc, BlockTable: blocks(docBlock, 19), Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetStoredChunks() != 0 || resp.GetSkippedChunks() != 2 {
		t.Fatalf("second store: stored %d skipped %d, want 0 and 2", resp.GetStoredChunks(), resp.GetSkippedChunks())
	}
	docKeys := chunkstore.ChainKeys(testModel, 0, doc, 256)
	for _, off := range []int{700, 333, 1, 1013, 1700} {
		t.Run(fmt.Sprintf("offset%d", off), func(t *testing.T) {
			prompt := promptWith(promptN, off, doc, uint64(off))
			id := fmt.Sprintf("req-%d", off)
			res := e.lookup(&cbv1.LookupRequest{RequestId: id, Tokens: prompt, WorldSize: 1, Model: testModel})
			// Hand example: 300 reused tokens of 2,000 → 0.15.
			if res.GetRequestedTokens() != promptN || res.GetPrefixHitTokens() != 0 || res.GetNonPrefixHitTokens() != docLen ||
				res.GetHitRate() != 0.15 || res.GetPrefixChunks() != 0 || res.GetChunkSize() != 256 {
				t.Fatalf("stats: %+v", res)
			}
			if res.GetFingerprintHits() != 2 || res.GetStorageHits() != 2 || res.GetStaleChunks() != 0 || res.GetFound() != 2 || !res.GetPerRankOk() {
				t.Fatalf("chunk stats: %+v", res)
			}
			if res.GetNProbes() == 0 || res.GetTableHits() == 0 || res.GetL1Hits() != 2 || res.GetL2Misses() != 0 {
				t.Fatalf("probe stats: %+v", res)
			}
			if len(res.GetMatches()) != 1 {
				t.Fatalf("%d matches, want 1: %v", len(res.GetMatches()), res.GetMatches())
			}
			m := res.GetMatches()[0]
			if m.GetStoredSt() != 0 || m.GetStoredEd() != docLen || m.GetCurSt() != int32(off) || m.GetCurEd() != int32(off+docLen) ||
				m.GetPrefix() || m.GetFirstChunkStart() != 0 || len(m.GetChunkKeys()) != 2 ||
				string(m.GetChunkKeys()[0]) != string(docKeys[0][:]) || string(m.GetChunkKeys()[1]) != string(docKeys[1][:]) {
				t.Fatalf("match %v", m)
			}

			fillSentinel(mem)
			bt := targetTable(promptN / bs)
			rr, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: id, WorkerId: "w0", BlockTable: bt, Matches: res.GetMatches(), ChunkSize: 256})
			if err != nil {
				t.Fatal(err)
			}
			if rr.GetScatteredTokens() != docLen || rr.GetNShifted() != docLen || rr.GetNPrefix() != 0 || rr.GetDropped() != 0 ||
				len(rr.GetMissing()) != 0 || rr.GetSlotWrites() != docLen*2*int32(testLayout.NumLayers) ||
				rr.GetBytes() != docLen*testLayout.TokenBytes() || rr.GetPartialBlocks() != partials(off, docLen) {
				t.Fatalf("retrieve: %+v (want %d partial blocks)", rr, partials(off, docLen))
			}
			e.checkSlots(mem, bt, off, docLen, 0)
		})
	}
}

func TestRetrieveTwoPasses(t *testing.T) {
	e, mem, doc := docEnv(t, Config{})
	const off = 700
	prompt := promptWith(promptN, off, doc, 9)
	res := e.lookup(&cbv1.LookupRequest{RequestId: "two", Tokens: prompt, WorldSize: 1, Model: testModel})
	fillSentinel(mem)
	full := targetTable(promptN / bs)
	short := full[:50] // 800 tokens: the match's first 100 tokens fit

	r1, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "two", WorkerId: "w0", BlockTable: short, Matches: res.GetMatches()})
	if err != nil {
		t.Fatal(err)
	}
	if r1.GetScatteredTokens() != 100 || r1.GetDropped() != 200 || len(r1.GetMissing()) != 0 {
		t.Fatalf("first pass: %+v", r1)
	}
	e.checkSlots(mem, full, off, 100, 0)
	// Mark the slots the first pass wrote; the second pass must not touch them.
	const marker = float32(42)
	for pos := off; pos < 800; pos++ {
		slot := int(full[pos/bs])*bs + pos%bs
		for layer := range testLayout.NumLayers {
			for _, p := range [][]float32{mem.TokenK(layer, slot), mem.TokenV(layer, slot)} {
				for i := range p {
					p[i] = marker
				}
			}
		}
	}
	r2, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "two", WorkerId: "w0", BlockTable: full, Matches: res.GetMatches(), FromToken: 800})
	if err != nil {
		t.Fatal(err)
	}
	if r2.GetScatteredTokens() != 200 || r2.GetDropped() != 0 || r1.GetScatteredTokens()+r2.GetScatteredTokens() != docLen {
		t.Fatalf("second pass: %+v", r2)
	}
	for pos := off; pos < 800; pos++ {
		slot := int(full[pos/bs])*bs + pos%bs
		if mem.TokenK(0, slot)[0] != marker || mem.TokenV(1, slot)[3] != marker {
			t.Fatalf("position %d rewritten by the second pass", pos)
		}
	}
	// Restore what the first pass wrote and check everything.
	fillSentinel(mem)
	if _, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "two", WorkerId: "w0", BlockTable: full, Matches: res.GetMatches(), FromToken: 800}); err != nil {
		t.Fatal(err)
	}
	e.checkSlots(mem, full, off, docLen, 800)
}

func TestPrefixLeg(t *testing.T) {
	e := newEnv(t, Config{})
	mem := e.newWorker("w0", 0)
	r := rand.New(rand.NewPCG(5, 6))
	stored := tokens(r, 600, 1000, 1000)
	bt := blocks(0, 600/bs+1)
	e.prefill(mem, bt, docSeq, 600)
	if _, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "p", WorkerId: "w0", Tokens: stored, BlockTable: bt}); err != nil {
		t.Fatal(err)
	}
	e.s.waitRegistrations(t)
	prompt := append(slices.Clone(stored), tokens(r, 300, 3000, 1000)...)
	res := e.lookup(&cbv1.LookupRequest{RequestId: "pre", Tokens: prompt, WorldSize: 1, Model: testModel})
	// Chunks [0,256) and [256,512) are full chunks of both: the prefix leg.
	// The stored tail [512,600) is a non-prefix match at the same offsets.
	if res.GetPrefixChunks() != 2 || res.GetPrefixHitTokens() != 512 || res.GetNonPrefixHitTokens() != 88 {
		t.Fatalf("stats %+v", res)
	}
	if want := 600.0 / 900.0; res.GetHitRate() != want {
		t.Fatalf("hit rate %v, want %v", res.GetHitRate(), want)
	}
	if len(res.GetMatches()) != 2 {
		t.Fatalf("matches %v", res.GetMatches())
	}
	p, np := res.GetMatches()[0], res.GetMatches()[1]
	if !p.GetPrefix() || p.GetCurSt() != 0 || p.GetCurEd() != 512 || p.GetStoredEd() != 512 || len(p.GetChunkKeys()) != 2 {
		t.Fatalf("prefix match %v", p)
	}
	if np.GetPrefix() || np.GetCurSt() < p.GetCurEd() || np.GetCurSt() != 512 || np.GetCurEd() != 600 ||
		np.GetStoredSt() != 512 || np.GetFirstChunkStart() != 512 || len(np.GetChunkKeys()) != 1 {
		t.Fatalf("non-prefix match %v (must start at or after the prefix coverage)", np)
	}
	fillSentinel(mem)
	tbt := targetTable(900/bs + 1)
	rr, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "pre", WorkerId: "w0", BlockTable: tbt, Matches: res.GetMatches()})
	if err != nil {
		t.Fatal(err)
	}
	if rr.GetNPrefix() != 512 || rr.GetNShifted() != 88 || rr.GetScatteredTokens() != 600 {
		t.Fatalf("retrieve %+v", rr)
	}
	e.checkSlots(mem, tbt, 0, 600, 0)
}

func TestTensorParallelRanks(t *testing.T) {
	// A whole-model worker stored the document (docEnv); ranks 0 and 1 of a
	// group of two register their own memories.
	e, _, doc := docEnv(t, Config{})
	mem0, mem1 := newMem(t), newMem(t)
	e.registerRank("tp", 0, 2, mem0)
	e.registerRank("tp", 1, 2, mem1)
	prompt := promptWith(promptN, 500, doc, 3)
	// Chunks are keyed by world size: the whole model's are not a group's.
	res := e.lookup(&cbv1.LookupRequest{RequestId: "tp-none", Tokens: prompt, WorldSize: 2, Model: testModel})
	if len(res.GetMatches()) != 0 || res.GetFound() != 0 {
		t.Fatalf("a group found the whole model's chunks: %+v", res)
	}
	bt := blocks(docBlock, 19)
	for _, mem := range []*kvcache.Memory{mem0, mem1} {
		e.prefill(mem, bt, docSeq, docLen)
	}
	if _, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "s0", WorkerId: "tp", Rank: 0, Tokens: doc, BlockTable: bt, Document: true}); err != nil {
		t.Fatal(err)
	}
	e.s.waitRegistrations(t)
	// Rank 1 has not stored the document: not usable on every rank.
	res = e.lookup(&cbv1.LookupRequest{RequestId: "tp0", Tokens: prompt, WorldSize: 2, Model: testModel})
	if res.GetPerRankOk() || len(res.GetMatches()) != 0 || res.GetFound() != 2 || res.GetHitRate() != 0 {
		t.Fatalf("before rank 1 stored: %+v", res)
	}
	if _, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "s1", WorkerId: "tp", Rank: 1, Tokens: doc, BlockTable: bt, Document: true}); err != nil {
		t.Fatal(err)
	}
	res = e.lookup(&cbv1.LookupRequest{RequestId: "tp1", Tokens: prompt, WorldSize: 2, Model: testModel})
	if !res.GetPerRankOk() || len(res.GetMatches()) != 1 || res.GetNonPrefixHitTokens() != docLen {
		t.Fatalf("after rank 1 stored: %+v", res)
	}
	fillSentinel(mem0)
	fillSentinel(mem1)
	tbt := targetTable(promptN / bs)
	for rank, mem := range []*kvcache.Memory{mem0, mem1} {
		rr, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "tp1", WorkerId: "tp", Rank: int32(rank), BlockTable: tbt, Matches: res.GetMatches()})
		if err != nil {
			t.Fatal(err)
		}
		if rr.GetScatteredTokens() != docLen {
			t.Fatalf("rank %d retrieve %+v", rank, rr)
		}
		e.checkSlots(mem, tbt, 500, docLen, 0)
	}
	// The whole model's lookup still finds its own chunks only.
	res = e.lookup(&cbv1.LookupRequest{RequestId: "whole", Tokens: prompt, WorldSize: 1, Model: testModel})
	if !res.GetPerRankOk() || res.GetNonPrefixHitTokens() != docLen || res.GetFound() != 2 {
		t.Fatalf("whole-model lookup: %+v", res)
	}
}

func TestRegistrationWorldSize(t *testing.T) {
	cases := []struct {
		name        string
		rank, world int
		ok          bool
	}{
		{"whole model", 0, 0, true},
		{"rank 1 of 2", 1, 2, true},
		{"rank beyond the world", 2, 2, false},
		{"rank 1 without a world", 1, 0, false},
		{"negative world", 0, -1, false},
		{"world too large", 0, MaxWorldSize + 1, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, Config{})
			mem := newMem(t)
			reg := registration("w", c.rank, mem.Layout())
			reg.WorldSize = int32(c.world)
			conn, _, err := kvsock.Register(ctxT(t), e.s.KVSocket(), reg, mem.File())
			if conn != nil {
				defer conn.Close()
			}
			if (err == nil) != c.ok {
				t.Fatalf("register: %v, want ok %v", err, c.ok)
			}
		})
	}
}

func TestRetrieveMissingChunk(t *testing.T) {
	e, mem, doc := docEnv(t, Config{})
	prompt := promptWith(promptN, 700, doc, 4)
	res := e.lookup(&cbv1.LookupRequest{RequestId: "miss", Tokens: prompt, WorldSize: 1, Model: testModel})
	m := res.GetMatches()[0]
	// A match naming a chunk that does not exist: reported missing.
	bogus := make([]byte, 32)
	m.ChunkKeys[1] = bogus
	fillSentinel(mem)
	bt := targetTable(promptN / bs)
	rr, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "miss", WorkerId: "w0", BlockTable: bt, Matches: []*cbv1.Match{m}})
	if err != nil {
		t.Fatal(err)
	}
	if rr.GetScatteredTokens() != 256 || len(rr.GetMissing()) != 1 || rr.GetMissing()[0].GetStart() != 956 || rr.GetMissing()[0].GetEnd() != 1000 {
		t.Fatalf("retrieve %+v", rr)
	}
	e.checkSlots(mem, bt, 700, 256, 0)
	// Every chunk gone: a failed retrieve.
	m.ChunkKeys[0] = bogus
	rr, err = e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "miss2", WorkerId: "w0", BlockTable: bt, Matches: []*cbv1.Match{m}})
	if err != nil {
		t.Fatal(err)
	}
	if rr.GetScatteredTokens() != 0 || len(rr.GetMissing()) != 1 || rr.GetMissing()[0].GetStart() != 700 {
		t.Fatalf("retrieve %+v", rr)
	}
	e.shutdown()
	if got := e.value("lmcache_blend_retrieve_requests_total", nil); got != 2 {
		t.Errorf("retrieve_requests %v, want 2", got)
	}
	if got := e.value("lmcache_blend_retrieve_failures_total", nil); got != 1 {
		t.Errorf("retrieve_failures %v, want 1 (only the retrieve where everything failed)", got)
	}
}
