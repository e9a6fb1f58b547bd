package llamaref

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

type vector struct {
	text string
	ids  []int32
}

// readVectors parses a .inp/.out pair the way tests/test-tokenizer-0.cpp does.
func readVectors(t testing.TB, gguf string) []vector {
	t.Helper()
	inp, err := os.ReadFile(gguf + ".inp")
	if err != nil {
		t.Fatal(err)
	}
	outb, err := os.ReadFile(gguf + ".out")
	if err != nil {
		t.Fatal(err)
	}
	// Same split as read_tests: a trailing separator does not start another input.
	const sep = "\n__ggml_vocab_test__\n"
	var texts []string
	for raw := string(inp); raw != ""; {
		i := strings.Index(raw, sep)
		if i < 0 {
			texts = append(texts, raw)
			break
		}
		texts = append(texts, raw[:i])
		raw = raw[i+len(sep):]
	}
	lines := strings.Split(string(outb), "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(texts) != len(lines) {
		t.Fatalf("%s: %d inputs, %d outputs", gguf, len(texts), len(lines))
	}
	vs := make([]vector, len(texts))
	for i := range texts {
		vs[i].text = texts[i]
		vs[i].ids = []int32{}
		for _, f := range strings.Fields(lines[i]) {
			n, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				t.Fatalf("%s line %d: %v", gguf, i+1, err)
			}
			vs[i].ids = append(vs[i].ids, int32(n))
		}
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
				texts[i] = vs[i].text
			}
			got, err := ref.TokenizeBatch(f, texts, false, false)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range vs {
				if !equalIDs(got[i], v.ids) {
					t.Errorf("text %q: got %v, want %v", v.text, got[i], v.ids)
				}
			}
		})
	}
}
