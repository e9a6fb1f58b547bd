package vocab

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/gguf"
)

// TestVectors tokenizes every text of llama.cpp's tokenizer test vectors
// (models/ggml-vocab-*.gguf.inp/.out, add_special and parse_special false
// as tests/test-tokenizer-0.cpp) and requires exactly the expected ids.
// Vocabularies this package does not implement must fail with
// ErrUnsupported, and only the ones listed here may.
func TestVectors(t *testing.T) {
	unsupported := map[string]string{
		"bert-bge":       "tokenizer model \"bert\" (WordPiece)",
		"deepseek-coder": "pre-tokenizer \"deepseek-coder\"",
		"deepseek-llm":   "pre-tokenizer \"deepseek-llm\"",
		"gemma-4":        "tokenizer model \"gemma4\"",
	}
	paths, err := filepath.Glob(filepath.Join(modelsDir(t), "ggml-vocab-*.gguf"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no vocab files (run bash scripts/deps.sh): %v", err)
	}
	tested := 0
	for _, p := range paths {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "ggml-vocab-"), ".gguf")
		if !fileExists(p + ".inp") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			f, err := gguf.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			v, err := FromGGUF(f)
			if why, ok := unsupported[name]; ok {
				if !errors.Is(err, ErrUnsupported) {
					t.Fatalf("want ErrUnsupported (%s), got %v", why, err)
				}
				t.Logf("unsupported as expected: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tested++
			texts, want := readVectors(t, p)
			bad := 0
			for i, text := range texts {
				got := v.Tokenize(text, false, false)
				if !slices.Equal(got, want[i]) {
					bad++
					if bad <= 5 {
						t.Errorf("text %q:\n got %v\nwant %v", text, got, want[i])
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d texts differ", bad, len(texts))
			}
		})
	}
	if tested < 10 {
		t.Errorf("only %d vocabularies tested", tested)
	}
}
