package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/internal/redistest"
)

// benchLayout is the KV layout of the 12-layer model that was the default
// when the README's fleet-tier figures were measured (12 layers, 2 KV heads
// of 32): a 256-token chunk is 1.5 MiB. The default model now has 16 layers
// (2 MiB chunks).
var benchLayout = chunkstore.Layout{NumLayers: 12, KVHeads: 2, HeadDim: 32, RoPETheta: 10000}

// BenchmarkFleetRead reads 16 chunks of 256 tokens through the fleet tier
// (pipelined GETs, decode, CRC and layout checks) and, as the reference,
// as raw pipelined GETs of the same values from the same server; the
// ratio of their throughputs is reported in the README.
func BenchmarkFleetRead(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	tier, err := New(Config{URL: srv.URL(), Key: testKey, OpTimeout: 5 * time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := tier.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer tier.Shutdown(context.Background())
	ns := Namespace("bench", benchLayout)
	r := rand.New(rand.NewPCG(1, 1))
	var keys []chunkstore.Key
	var size int64
	for i := range 16 {
		toks := make([]int32, 256)
		for j := range toks {
			toks[j] = r.Int32N(50000)
		}
		var k chunkstore.Key
		k[0], k[1] = byte(i), 7
		c, err := chunkstore.NewChunk(k, "bench", 0, benchLayout, toks, i*256)
		if err != nil {
			b.Fatal(err)
		}
		tier.PutChunk(ns, c.Key, c, nil)
		keys = append(keys, k)
		size += chunkstore.EncodedSize(c)
	}
	if err := tier.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: redistest.Password})
	defer raw.Close()
	ctx := context.Background()
	b.Run("fleet", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(size)
		for b.Loop() {
			got, _, err := tier.GetChunks(ctx, ns, rank0Refs(keys), benchLayout, 256)
			if err != nil || len(got) != len(keys) {
				b.Fatalf("%d chunks, %v", len(got), err)
			}
		}
	})
	b.Run("raw_pipelined_get", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(size)
		for b.Loop() {
			pipe := raw.Pipeline()
			cmds := make([]*redis.StringCmd, len(keys))
			for i, k := range keys {
				cmds[i] = pipe.Get(ctx, chunkKey(ns, Ref{Base: k}))
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
			for _, c := range cmds {
				if v, _ := c.Bytes(); len(v) == 0 {
					b.Fatal("empty value")
				}
			}
		}
	})
}

// BenchmarkCoordinatorMatch matches a 4,096-token prompt holding one stored
// document against a directory of 10,000 registered chunks; it reports
// the round trips (2 at most) and the probes.
func BenchmarkCoordinatorMatch(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	tier, err := New(Config{URL: srv.URL(), Key: testKey, OpTimeout: 10 * time.Second, CoordinatorTimeout: 10 * time.Second, WriteQueue: 1 << 14}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := tier.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer tier.Shutdown(context.Background())
	tab := fingerprint.NewTable(fingerprint.Config{})
	ns := Namespace("bench", benchLayout)
	r := rand.New(rand.NewPCG(2, 2))
	const cs, perSeq = 256, 10
	var doc []int32
	for s := range 10_000 / perSeq {
		toks := make([]int32, cs*perSeq)
		for j := range toks {
			toks[j] = r.Int32N(50000)
		}
		keys := chunkstore.ChainKeys(fmt.Sprint("bench", s), 0, toks, cs)
		tier.RegisterSequence(ns, tab, fingerprint.Sequence{Keys: keys, Tokens: toks, ChunkSize: cs}, nil)
		if s == 500 {
			doc = toks[:600]
		}
	}
	if err := tier.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	prompt := make([]int32, 4096)
	for j := range prompt {
		prompt[j] = r.Int32N(50000)
	}
	copy(prompt[1500:], doc)
	ctx := context.Background()
	var st MatchStats
	b.ReportAllocs()
	for b.Loop() {
		var res fingerprint.Result
		res, st, err = tier.Match(ctx, ns, tab, prompt, 0)
		if err != nil || len(res.Matches) != 1 || res.Matches[0].Len() != len(doc) {
			b.Fatalf("match: %+v %v", res.Matches, err)
		}
	}
	b.ReportMetric(float64(st.RoundTrips), "round_trips/op")
	b.ReportMetric(float64(st.Probes), "probes/op")
}
