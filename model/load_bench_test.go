package model

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/internal/testmodel"
	"github.com/cacheblend/cacheblend/quant"
)

// rssBytes is the process's resident set (/proc/self/statm).
func rssBytes(tb testing.TB) int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(b))
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// BenchmarkLoadFile writes a model file of Llama-3.2-1B's shape (16 layers,
// width 2048, 32/8 heads, SwiGLU 8192, Llama 3's 128,256-token vocabulary;
// random weights) at Q8_0 and F16 once, then measures gguf.Open +
// model.Load (ms per load), the resident memory the loaded model adds, and
// a 512-token prefill (tokens/s) on it.
//
//	go test ./model -run '^$' -bench LoadFile -benchtime 3x
func BenchmarkLoadFile(b *testing.B) {
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_K} {
		b.Run(typ.String(), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "llama-1b-shape.gguf")
			t0 := time.Now()
			err := testmodel.Write(path, testmodel.Spec{Arch: "llama", Layers: 16, Dim: 2048, Heads: 32, KVHeads: 8, FFNDim: 8192,
				Type: typ, OutType: quant.Q6_K, Tied: true, VocabFile: refVocab(b, "llama-bpe")})
			if err != nil {
				b.Fatal(err)
			}
			st, _ := os.Stat(path)
			b.Logf("wrote %.2f GB in %v", float64(st.Size())/1e9, time.Since(t0).Round(time.Second))
			var m *Model
			var f *gguf.File
			rss0 := rssBytes(b)
			b.ReportAllocs()
			for b.Loop() {
				if f != nil {
					f.Close()
				}
				if f, err = gguf.Open(path); err != nil {
					b.Fatal(err)
				}
				if m, err = Load(f, Config{MaxPositions: 1024}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			defer f.Close()
			kv := newKV(b, m, blocksFor(512))
			toks := make([]int32, 512)
			for i := range toks {
				toks[i] = int32(1000 + 37*i)
			}
			t1 := time.Now()
			if _, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: table(0, blocksFor(512))}); err != nil {
				b.Fatal(err)
			}
			pf := time.Since(t1)
			b.ReportMetric(float64(rssBytes(b)-rss0)/1e9, "GB-rss-after-prefill")
			b.ReportMetric(512/pf.Seconds(), "prefill-tok/s")
			b.ReportMetric(float64(st.Size())/1e9, "GB-file")
		})
	}
}
