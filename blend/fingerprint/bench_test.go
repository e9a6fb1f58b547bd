package fingerprint

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
)

// benchTable registers 10,000 stored chunks: 2,500 sequences of 4 chunks of
// 256 tokens.
func benchTable(b *testing.B, r *rand.Rand) (*Table, [][]int32) {
	tab := NewTable(Config{})
	var seqs [][]int32
	for i := range 2500 {
		toks := randTokens(r, 1024)
		seqs = append(seqs, toks)
		keys := chunkstore.ChainKeys(fmt.Sprint(i), 0, toks, 256)
		if _, err := tab.Register(Sequence{Keys: keys, Tokens: toks, ChunkSize: 256}); err != nil {
			b.Fatal(err)
		}
	}
	if st := tab.Stats(); st.Fingerprints != 10000 {
		b.Fatalf("stats %+v", st)
	}
	return tab, seqs
}

// BenchmarkMatch measures fingerprint matching throughput of a 4,096-token
// prompt against 10,000 stored chunks on one goroutine. "miss" is a random
// prompt (a probe at all 4,081 offsets, the worst case); "rag" embeds three
// stored documents at unaligned offsets.
func BenchmarkMatch(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 9))
	tab, seqs := benchTable(b, r)
	miss := randTokens(r, 4096)
	rag := slices.Clone(miss)
	copy(rag[37:], seqs[10][:700])
	copy(rag[1501:], seqs[2000][256:1024])
	copy(rag[3001:], seqs[77][:900])
	for _, bc := range []struct {
		name   string
		prompt []int32
		hits   int
	}{{"miss", miss, 0}, {"rag", rag, 700 + 768 + 900}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0, cpuOK := threadCPU()
			start := time.Now()
			for b.Loop() {
				res := tab.Match(bc.prompt, 0)
				if res.Stats.HitTokens != bc.hits {
					b.Fatalf("hit %d tokens, want %d", res.Stats.HitTokens, bc.hits)
				}
			}
			tokens := float64(len(bc.prompt)) * float64(b.N)
			b.ReportMetric(tokens/time.Since(start).Seconds()/1e6, "Mtokens/s")
			// Per core: tokens per second of this thread's CPU time, robust
			// to other load on the machine.
			if cpu1, ok := threadCPU(); ok && cpuOK && cpu1 > cpu0 {
				b.ReportMetric(tokens/(cpu1-cpu0).Seconds()/1e6, "Mtokens/cpu-s")
			}
		})
	}
}
