package vocab

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/internal/llamaref"
)

// modelsDir returns llama.cpp's models directory of the reference checkout.
func modelsDir(t testing.TB) string {
	t.Helper()
	src, err := llamaref.LlamaCppSource()
	if err != nil {
		t.Fatalf("%v (run bash scripts/deps.sh)", err)
	}
	return filepath.Join(src, "models")
}

// vocabPath returns the path of models/ggml-vocab-<name>.gguf.
func vocabPath(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(modelsDir(t), "ggml-vocab-"+name+".gguf")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%v (run bash scripts/deps.sh)", err)
	}
	return p
}

var (
	loadMu sync.Mutex
	loaded = map[string]*Vocab{}
)

// loadVocab returns the Vocab of the GGUF file at path (cached across tests).
func loadVocab(t testing.TB, path string) *Vocab {
	t.Helper()
	loadMu.Lock()
	defer loadMu.Unlock()
	if v, ok := loaded[path]; ok {
		return v
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	v, err := FromGGUF(f)
	if err != nil {
		t.Fatalf("vocab of %s: %v", path, err)
	}
	loaded[path] = v
	return v
}

// readVectors reads the .inp/.out test vectors of a vocab file as
// tests/test-tokenizer-0.cpp does (llamaref.ReadVectors).
func readVectors(t testing.TB, path string) (texts []string, ids [][]int32) {
	t.Helper()
	vs, err := llamaref.ReadVectors(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		texts, ids = append(texts, v.Text), append(ids, v.IDs)
	}
	return texts, ids
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
