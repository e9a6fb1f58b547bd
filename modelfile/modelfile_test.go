package modelfile

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/chat"
	"github.com/cacheblend/cacheblend/internal/llamaref"
	"github.com/cacheblend/cacheblend/internal/testmodel"
	"github.com/cacheblend/cacheblend/vocab"
)

func refPath(t *testing.T, parts ...string) string {
	t.Helper()
	src, err := llamaref.LlamaCppSource()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(append([]string{src, "models"}, parts...)...)
}

func writeModel(t *testing.T, s testmodel.Spec) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := testmodel.Write(path, s); err != nil {
		t.Fatal(err)
	}
	return path
}

func template(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(refPath(t, "templates", name+".jinja"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestOpenChatTokens(t *testing.T) {
	msgs := []chat.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hello <|eot_id|> there"}}
	for _, tc := range []struct {
		name, vocab, tmpl string
		wantBOS           bool   // the prompt starts with BOS (exactly once)
		stop              string // an end-of-turn token that must be among Stop
	}{
		{"Llama 3.2 (template writes BOS)", "llama-bpe", "meta-llama-Llama-3.2-3B-Instruct", true, "<|eot_id|>"},
		{"Qwen2.5 (no BOS)", "qwen2", "Qwen-Qwen2.5-7B-Instruct", false, "<|im_end|>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeModel(t, testmodel.Spec{Name: "tiny", VocabFile: refPath(t, "ggml-vocab-"+tc.vocab+".gguf"), Template: template(t, tc.tmpl)})
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Name != "tiny" || !strings.HasPrefix(f.Identity, "gguf-") || f.Template == nil {
				t.Fatalf("name %q identity %q template %v", f.Name, f.Identity, f.Template != nil)
			}
			// The tokenizer's arrays were released once the vocabulary
			// was built; the chat tokens below come from its copies.
			for _, k := range vocab.GGUFArrays {
				if _, ok := f.GGUF.Get(k); ok {
					t.Fatalf("metadata %s still held", k)
				}
			}
			toks, text, err := f.ChatTokens(msgs)
			if err != nil {
				t.Fatal(err)
			}
			nBOS := 0
			for _, id := range toks {
				if id == f.BOS {
					nBOS++
				}
			}
			if tc.wantBOS && (toks[0] != f.BOS || nBOS != 1) {
				t.Fatalf("BOS: first %d, %d BOS in %v", toks[0], nBOS, toks[:8])
			}
			if !tc.wantBOS && f.AddBOS && toks[0] != f.BOS {
				t.Fatalf("vocabulary asks for BOS, prompt starts with %d", toks[0])
			}
			// The end-of-turn marker of the template is a stop token.
			if id, ok := f.Vocab.ID(tc.stop); !ok || !slices.Contains(f.Stop, id) {
				t.Fatalf("%s (%d, %v) not among the stop ids %v", tc.stop, id, ok, f.Stop)
			}
			if !strings.Contains(text, "Hello <|eot_id|> there") {
				t.Fatalf("rendering lost the content: %q", text)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.gguf")
	if err := os.WriteFile(bad, []byte("GGUF\x03\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing file", filepath.Join(dir, "nope.gguf"), "no such file"},
		{"truncated", bad, "GGUF"},
		{"broken template", writeModel(t, testmodel.Spec{VocabFile: refPath(t, "ggml-vocab-llama-spm.gguf"), Template: "{% for m in messages %}{{ m.content }"}), "chat template"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Open(tc.path)
			if err == nil {
				f.Close()
				t.Fatal("Open accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestNoTemplate(t *testing.T) {
	f, err := Open(writeModel(t, testmodel.Spec{VocabFile: refPath(t, "ggml-vocab-llama-spm.gguf")}))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, _, err := f.ChatTokens([]chat.Message{{Role: "user", Content: "x"}}); err == nil || !strings.Contains(err.Error(), "no chat template") {
		t.Fatalf("ChatTokens without a template: %v", err)
	}
}
