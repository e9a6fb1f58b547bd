package llamaref

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
)

var (
	sharedOnce sync.Once
	sharedRef  *Ref
	sharedErr  error
)

// testRef returns one reference process shared by the package's tests (started once; the
// process dies with the test binary).
func testRef(t testing.TB) *Ref {
	t.Helper()
	sharedOnce.Do(func() { sharedRef, sharedErr = Start(context.Background()) })
	if sharedErr != nil {
		t.Fatalf("start reference (run bash scripts/deps.sh): %v", sharedErr)
	}
	return sharedRef
}

func vocabFile(t testing.TB, name string) string {
	t.Helper()
	src, err := LlamaCppSource()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return filepath.Join(src, "models", "ggml-vocab-"+name+".gguf")
}

// readVectors is ReadVectors, failing t on an error.
func readVectors(t testing.TB, gguf string) []Vector {
	t.Helper()
	vs, err := ReadVectors(gguf)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTokenizerVectors reproduces every expected output of llama.cpp's tokenizer test vectors
// (tests/test-tokenizer-0.cpp: add_special=false, parse_special=false) through the driver.
func TestTokenizerVectors(t *testing.T) {
	ref := testRef(t)
	for _, name := range []string{"llama-spm", "llama-bpe", "qwen2", "gpt-2", "phi-3", "deepseek-llm", "deepseek-coder", "falcon", "mpt", "starcoder", "command-r", "refact", "bert-bge", "qwen35", "gemma-4"} {
		t.Run(name, func(t *testing.T) {
			f := vocabFile(t, name)
			vs := readVectors(t, f)
			texts := make([]string, len(vs))
			for i := range vs {
				texts[i] = vs[i].Text
			}
			got, err := ref.TokenizeBatch(f, texts, false, false)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range vs {
				if !equalIDs(got[i], v.IDs) {
					t.Errorf("text %q: got %v, want %v", v.Text, got[i], v.IDs)
				}
			}
		})
	}
}
