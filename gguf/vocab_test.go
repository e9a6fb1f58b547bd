package gguf

import (
	"os"
	"path/filepath"
	"testing"
)

// refDir is the reference directory, by the rule of scripts/deps.sh:
// $CB_REF_DIR, else $XDG_CACHE_HOME/cacheblend/ref, else
// ~/.cache/cacheblend/ref.
func refDir() string {
	if d := os.Getenv("CB_REF_DIR"); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "cacheblend", "ref")
}

// vocabPath returns llama.cpp's models/ggml-vocab-<name>.gguf, failing the
// test when the reference checkout is missing.
func vocabPath(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(refDir(), "llama.cpp", "models", "ggml-vocab-"+name+".gguf")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%v: run bash scripts/deps.sh", err)
	}
	return p
}

// TestRealVocabFiles opens llama.cpp's vocabulary-only GGUF files and
// checks the tokenizer metadata against values read with an independent
// parser (the counts, first/last entries and ids below).
func TestRealVocabFiles(t *testing.T) {
	for _, tc := range []struct {
		name, arch, model, pre string
		tokens, merges         int
		lastToken, lastMerge   string
		bos                    uint64
		nKV                    int
	}{
		{"llama-bpe", "llama", "gpt2", "llama-bpe", 128256, 280147, "<|reserved_special_token_250|>", "éĶ ¦", 128000, 20},
		{"llama-spm", "llama", "llama", "default", 32000, 0, "给", "", 1, 22},
		{"qwen2", "qwen2", "gpt2", "qwen2", 151936, 151387, "[PAD151935]", "â½ Ĺ", 151643, 20},
		{"gpt-2", "gpt2", "gpt2", "gpt-2", 50257, 50000, "<|endoftext|>", "Ġg azed", 50256, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Open(vocabPath(t, tc.name))
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer f.Close()
			if f.Version != 3 || len(f.Tensors) != 0 || len(f.KV) != tc.nKV {
				t.Errorf("version %d, %d tensors, %d keys; want 3, 0, %d", f.Version, len(f.Tensors), len(f.KV), tc.nKV)
			}
			if f.Architecture() != tc.arch {
				t.Errorf("architecture %q, want %q", f.Architecture(), tc.arch)
			}
			if m, err := f.String("tokenizer.ggml.model"); err != nil || m != tc.model {
				t.Errorf("tokenizer.ggml.model = %q, %v; want %q", m, err, tc.model)
			}
			if p, err := f.String("tokenizer.ggml.pre"); err != nil || p != tc.pre {
				t.Errorf("tokenizer.ggml.pre = %q, %v; want %q", p, err, tc.pre)
			}
			toks, err := f.Strings("tokenizer.ggml.tokens")
			if err != nil || len(toks) != tc.tokens || toks[0] == "" || toks[len(toks)-1] != tc.lastToken {
				t.Fatalf("tokens: %d, %v; want %d ending %q", len(toks), err, tc.tokens, tc.lastToken)
			}
			types, err := f.Int32s("tokenizer.ggml.token_type")
			if err != nil || len(types) != tc.tokens {
				t.Errorf("token_type: %d, %v", len(types), err)
			}
			if bos, err := f.Uint("tokenizer.ggml.bos_token_id"); err != nil || bos != tc.bos {
				t.Errorf("bos = %d, %v; want %d", bos, err, tc.bos)
			}
			merges, err := f.Strings("tokenizer.ggml.merges")
			if tc.merges == 0 {
				if err == nil {
					t.Errorf("unexpected merges")
				}
				scores, err := f.Float32s("tokenizer.ggml.scores")
				if err != nil || len(scores) != tc.tokens || scores[len(scores)-1] != -31740 {
					t.Errorf("scores: %d, %v", len(scores), err)
				}
				if add, err := f.Bool("tokenizer.ggml.add_bos_token"); err != nil || !add {
					t.Errorf("add_bos_token = %v, %v", add, err)
				}
			} else if err != nil || len(merges) != tc.merges || merges[len(merges)-1] != tc.lastMerge {
				t.Errorf("merges: %d, %v; want %d ending %q", len(merges), err, tc.merges, tc.lastMerge)
			}
			if f.DataOffset < f.Size-int64(f.Alignment) || f.Identity() == "" {
				t.Errorf("DataOffset %d, Size %d", f.DataOffset, f.Size)
			}
		})
	}
}
