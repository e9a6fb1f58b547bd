package scatter

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rope"
)

// BenchmarkScatter scatters one 256-token chunk (4 layers, 4 KV heads of 64:
// 2 MiB of K and V) into 16 scattered blocks of a paged memory, and in the
// same run copy()s the same number of bytes between two flat buffers, the
// memory-bandwidth ceiling. "prefix" copies as stored; "shifted" also
// re-RoPEs every K row (bound by rope.RoPE's arithmetic); "shifted-2workers"
// splits the layers over two goroutines (ScatterParallel).
func BenchmarkScatter(b *testing.B) {
	l := kvcache.Layout{NumLayers: 4, NumBlocks: 64, BlockSize: 16, KVHeads: 4, HeadDim: 64}
	r := rand.New(rand.NewPCG(1, 1))
	rope := rope.New(l.HeadDim, theta)
	c := newChunk(b, r, l, 256, 0)
	m, err := kvcache.Create(b.TempDir(), l)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	perm := r.Perm(l.NumBlocks)
	bt := make([]int32, 16)
	for i := range bt {
		bt[i] = int32(perm[i])
	}
	flatDst := make([]float32, len(c.KV))
	for _, bc := range []struct {
		name    string
		shift   bool
		workers int
	}{{"prefix", false, 1}, {"shifted", true, 1}, {"shifted-2workers", true, 2}} {
		b.Run(bc.name, func(b *testing.B) {
			cp := rawCopy(m, bt, rope, 0, seg{c, 0, 256, 0, bc.shift})
			if bc.shift {
				// Stored at 1000..1255, reused at 0..255.
				for i := range c.Positions {
					c.Positions[i] = int32(1000 + i)
				}
				defer func() {
					for i := range c.Positions {
						c.Positions[i] = int32(i)
					}
				}()
			}
			b.ReportAllocs()
			var tScatter, tCopy time.Duration
			var bytes int64
			for b.Loop() {
				t0 := time.Now()
				st, err := ScatterParallel(cp, bc.workers)
				tScatter += time.Since(t0)
				if err != nil || st.ScatteredTokens != 256 {
					b.Fatalf("%+v %v", st, err)
				}
				bytes = st.Bytes
				t0 = time.Now()
				copy(flatDst, c.KV)
				tCopy += time.Since(t0)
			}
			gb := float64(bytes) * float64(b.N) / 1e9
			b.SetBytes(bytes)
			b.ReportMetric(gb/tScatter.Seconds(), "scatter_GB/s")
			b.ReportMetric(gb/tCopy.Seconds(), "copy_GB/s")
			b.ReportMetric(tCopy.Seconds()/tScatter.Seconds(), "ratio")
		})
	}
}
