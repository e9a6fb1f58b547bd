package vocab

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cacheblend/cacheblend/gguf"
)

// benchText returns about 8,000 bytes of English (markdown) prose, about
// 2,000 tokens: the start of llama.cpp's README and docs.
func benchText(b *testing.B) string {
	b.Helper()
	var sb strings.Builder
	src := filepath.Dir(modelsDir(b))
	for _, f := range []string{"README.md", "docs/build.md", "CONTRIBUTING.md"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			b.Fatalf("%v (run bash scripts/deps.sh)", err)
		}
		sb.Write(data)
		if sb.Len() >= 8000 {
			break
		}
	}
	s := sb.String()[:8000]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// BenchmarkTokenize tokenizes a ~2,000-token English text with each kind
// of vocabulary, with the word cache warm (as in a running server) and
// cleared before every call.
func BenchmarkTokenize(b *testing.B) {
	text := benchText(b)
	for _, name := range []string{"llama-spm", "llama-bpe", "qwen2", "gpt-2", "command-r", "aquila"} {
		v := loadVocab(b, vocabPath(b, name))
		n := len(v.Encode(text))
		for _, cold := range []bool{false, true} {
			label := name + "/warm"
			if cold {
				label = name + "/cold"
			}
			b.Run(label, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(text)))
				for b.Loop() {
					if cold {
						v.cache.mu.Lock()
						clear(v.cache.m)
						v.cache.mu.Unlock()
					}
					v.Tokenize(text, true, false)
				}
				b.ReportMetric(float64(n), "tokens/op")
			})
		}
	}
}

// BenchmarkDecode decodes the ids of the benchmark text.
func BenchmarkDecode(b *testing.B) {
	text := benchText(b)
	v := loadVocab(b, vocabPath(b, "llama-bpe"))
	ids := v.Encode(text)
	b.ReportAllocs()
	for b.Loop() {
		v.Decode(ids)
	}
}

// BenchmarkNew builds vocabularies from their specs (what loading a model
// costs on top of reading the GGUF file).
func BenchmarkNew(b *testing.B) {
	for _, name := range []string{"llama-spm", "llama-bpe", "command-r"} {
		f, err := gguf.Open(vocabPath(b, name))
		if err != nil {
			b.Fatal(err)
		}
		s, err := SpecFromGGUF(f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := New(s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
