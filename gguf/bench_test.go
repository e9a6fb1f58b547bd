package gguf

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/quant"
)

// writeBigFile writes a ~200 MB model-like file: a 32k-token vocabulary and
// 50 Q8_0 tensors of 4 MiB (all sharing one data buffer).
func writeBigFile(b *testing.B) string {
	b.Helper()
	toks := make([]string, 32000)
	for i := range toks {
		toks[i] = "tok" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676%26))
	}
	kv := []KV{{KeyArchitecture, "llama"}, {"tokenizer.ggml.tokens", toks}}
	const cols, rows = 4096, 960 // Q8_0: 4352 bytes a row, ~4.2 MB a tensor
	size, err := tensorSize([]uint64{cols, rows}, quant.Q8_0)
	if err != nil {
		b.Fatal(err)
	}
	buf := randomBytes(1, int(size))
	ts := make([]WriteTensor, 50)
	for i := range ts {
		ts[i] = WriteTensor{Name: "blk." + itoa(i) + ".w", Dims: []uint64{cols, rows}, Type: quant.Q8_0, Data: buf}
	}
	path := filepath.Join(b.TempDir(), "big.gguf")
	w, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := Write(w, kv, ts); err != nil {
		b.Fatal(err)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// BenchmarkOpen opens (mmap + parse + validate + Identity) and closes a
// ~200 MB file; the time and allocations are those of the metadata only,
// since tensor data is never read or copied.
func BenchmarkOpen(b *testing.B) {
	path := writeBigFile(b)
	st, _ := os.Stat(path)
	b.ReportAllocs()
	b.SetBytes(st.Size())
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		_ = f.Identity()
		if len(f.Data(&f.Tensors[49])) == 0 {
			b.Fatal("no data")
		}
		f.Close()
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/open")
	b.ReportMetric(float64(st.Size())/1e6, "MB-file")
}

// BenchmarkParseVocab parses llama.cpp's Llama 3 vocabulary file (128k
// tokens, 280k merges) from memory.
func BenchmarkParseVocab(b *testing.B) {
	data, err := os.ReadFile(vocabPath(b, "llama-bpe"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
