package chunkstore

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkL2Load compares the coalesced parallel L2 load of GetMany (cold
// L1: the store's L1 budget admits nothing) with a plain sequential
// os.ReadFile of the same files, in the same run. Both read warm page-cache
// files (dropping the page cache needs root), so this measures the read,
// checksum and decode path, not the disk.
func BenchmarkL2Load(b *testing.B) {
	const nChunks = 32
	layout := Layout{NumLayers: 4, KVHeads: 4, HeadDim: 64, RoPETheta: 10000} // 2 MiB per 256-token chunk
	dir := b.TempDir()
	w, err := New(Config{Dir: dir, L1Bytes: 1})
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	keys := ChainKeys("bench", 0, randTokens(r, nChunks*256), 256)
	var paths []string
	for i, k := range keys {
		c, err := NewChunk(k, "bench", 0, layout, randTokens(r, 256), i*256)
		if err != nil {
			b.Fatal(err)
		}
		for j := range c.KV {
			c.KV[j] = r.Float32()
		}
		if err := w.Put(c); err != nil {
			b.Fatal(err)
		}
		paths = append(paths, filepath.Join(dir, k.String()+fileExt))
	}
	s, err := New(Config{Dir: dir, L1Bytes: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var tMany, tRead time.Duration
	var bytes int64
	for b.Loop() {
		t0 := time.Now()
		got, ls := s.GetMany(keys)
		tMany += time.Since(t0)
		if len(got) != nChunks || ls.Chunks != nChunks {
			b.Fatalf("loaded %d chunks: %+v", len(got), ls)
		}
		bytes = ls.Bytes
		t0 = time.Now()
		var n int64
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				b.Fatal(err)
			}
			n += int64(len(data))
		}
		tRead += time.Since(t0)
		if n != bytes {
			b.Fatalf("read %d bytes, GetMany %d", n, bytes)
		}
	}
	gb := float64(bytes) * float64(b.N) / 1e9
	b.ReportMetric(gb/tMany.Seconds(), "getmany_GB/s")
	b.ReportMetric(gb/tRead.Seconds(), "readfile_GB/s")
	b.ReportMetric(tRead.Seconds()/tMany.Seconds(), "ratio")
	b.SetBytes(bytes)
}

func randTokens(r *rand.Rand, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = r.Int32N(32000)
	}
	return t
}
