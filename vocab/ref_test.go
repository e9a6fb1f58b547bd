package vocab

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/internal/llamaref"
)

var (
	refOnce sync.Once
	refInst *llamaref.Ref
	refErr  error
	tmpDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if refInst != nil {
		refInst.Close()
	}
	if tmpDir != "" {
		os.RemoveAll(tmpDir)
	}
	os.Exit(code)
}

// testRef returns the shared llama.cpp reference process.
func testRef(t testing.TB) *llamaref.Ref {
	t.Helper()
	refOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		refInst, refErr = llamaref.Start(ctx)
	})
	if refErr != nil {
		t.Fatalf("start llama.cpp reference: %v (run bash scripts/deps.sh)", refErr)
	}
	return refInst
}

// refVocab is a vocabulary file compared with llama.cpp.
type refVocab struct{ name, path string }

// realVocabs are llama.cpp's vocabulary files of supported tokenizers
// (aquila and gpt-neox have no tokenizer.ggml.pre: "default").
var realVocabs = []string{"llama-spm", "phi-3", "baichuan", "llama-bpe", "qwen2", "qwen35", "gpt-2", "mpt",
	"starcoder", "refact", "command-r", "falcon", "aquila", "gpt-neox"}

// synthPre are pre-tokenizer names given to a copy of the gpt-2 vocabulary,
// so that every splitter chain is compared with llama.cpp's.
var synthPre = []string{"default", "smollm", "llama3", "llama-v3", "qwen2", "qwen35", "laguna", "glm4",
	"dbrx", "stablelm2", "falcon", "starcoder", "olmo", "trillion"}

var (
	synthOnce  sync.Once
	synthErr   error
	synthPaths map[string]string
)

// synthVocabs writes the gpt-2 vocabulary with each pre-tokenizer of
// synthPre to a temporary directory.
func synthVocabs(t testing.TB) map[string]string {
	t.Helper()
	src := vocabPath(t, "gpt-2")
	synthOnce.Do(func() {
		f, err := gguf.Open(src)
		if err != nil {
			synthErr = err
			return
		}
		defer f.Close()
		if tmpDir, err = os.MkdirTemp("", "vocab-test-"); err != nil {
			synthErr = err
			return
		}
		synthPaths = map[string]string{}
		for _, pre := range synthPre {
			kv := slices.Clone(f.KV)
			for i := range kv {
				if kv[i].Key == keyPre {
					kv[i].Value = pre
				}
			}
			b, err := gguf.Encode(kv, nil)
			if err != nil {
				synthErr = err
				return
			}
			p := filepath.Join(tmpDir, "gpt-2-pre-"+pre+".gguf")
			if err := os.WriteFile(p, b, 0o644); err != nil {
				synthErr = err
				return
			}
			synthPaths[pre] = p
		}
	})
	if synthErr != nil {
		t.Fatalf("write synthetic vocabularies: %v", synthErr)
	}
	return synthPaths
}

// allRefVocabs returns the real and synthetic vocabularies.
func allRefVocabs(t testing.TB) []refVocab {
	var out []refVocab
	for _, n := range realVocabs {
		out = append(out, refVocab{n, vocabPath(t, n)})
	}
	synth := synthVocabs(t)
	for _, pre := range synthPre {
		out = append(out, refVocab{"gpt-2/pre=" + pre, synth[pre]})
	}
	return out
}

func seedOf(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// specialTexts returns the texts of up to n of v's special tokens.
func specialTexts(v *Vocab, r *rand.Rand, n int) []string {
	out := slices.Clone(genSpecial)
	for i := 0; i < n && len(v.specials) > 0; i++ {
		out = append(out, v.tokens.at(int(v.specials[r.IntN(len(v.specials))])))
	}
	return out
}

// TestTokenizeMatchesLlamaCpp compares Tokenize with llama.cpp's
// llama_tokenize on seeded random texts (many scripts, emoji, combining
// marks, digit and whitespace runs, contractions, special-token text) for
// every supported vocabulary file and every pre-tokenizer chain, with each
// combination of addSpecial and parseSpecial.
func TestTokenizeMatchesLlamaCpp(t *testing.T) {
	ref := testRef(t)
	n := 4000 // per vocabulary, 1,000 per combination of flags
	if testing.Short() || raceEnabled {
		n = 800
	}
	for _, rv := range allRefVocabs(t) {
		t.Run(rv.name, func(t *testing.T) {
			v := loadVocab(t, rv.path)
			r := rand.New(rand.NewPCG(seedOf(rv.name), 1))
			extra := specialTexts(v, r, 40)
			for _, mode := range []struct{ add, parse bool }{{false, false}, {false, true}, {true, false}, {true, true}} {
				texts := make([]string, n/4)
				for i := range texts {
					maxPieces := 24
					if i%50 == 0 {
						maxPieces = 600 // some long texts
					}
					texts[i] = genText(r, maxPieces, extra)
				}
				want, err := ref.TokenizeBatch(rv.path, texts, mode.add, mode.parse)
				if err != nil {
					t.Fatal(err)
				}
				bad := 0
				for i, text := range texts {
					got := v.Tokenize(text, mode.add, mode.parse)
					if !slices.Equal(got, want[i]) {
						bad++
						if bad <= 3 {
							t.Errorf("add=%v parse=%v text %s\n%s", mode.add, mode.parse, clip(text), idsDiff(got, want[i]))
						}
					}
				}
				if bad > 0 {
					t.Errorf("add=%v parse=%v: %d of %d texts differ", mode.add, mode.parse, bad, len(texts))
				}
			}
		})
	}
}

// TestPiecesMatchLlamaCpp compares Piece with llama.cpp's
// llama_token_to_piece for every token id of every vocabulary, with
// special false and true, and the special ids, add_bos/add_eos and the
// end-of-generation set with what llama.cpp reports.
func TestPiecesMatchLlamaCpp(t *testing.T) {
	ref := testRef(t)
	for _, rv := range allRefVocabs(t) {
		t.Run(rv.name, func(t *testing.T) {
			v := loadVocab(t, rv.path)
			ids := make([]int32, v.Size())
			for i := range ids {
				ids[i] = int32(i)
			}
			if strings.Contains(rv.name, "/pre=") {
				ids = nil // the pieces are gpt-2's, checked there
			}
			for _, special := range []bool{false, true} {
				bad := 0
				for start := 0; start < len(ids); start += 32768 {
					chunk := ids[start:min(start+32768, len(ids))]
					want, err := ref.Pieces(rv.path, chunk, special)
					if err != nil {
						t.Fatal(err)
					}
					for i, id := range chunk {
						if got := v.Piece(id, special); string(got) != string(want[i]) {
							bad++
							if bad <= 5 {
								t.Errorf("special=%v id %d (%q): got %q, want %q", special, id, v.TokenText(id), got, want[i])
							}
						}
					}
				}
				if bad > 0 {
					t.Errorf("special=%v: %d of %d pieces differ", special, bad, len(ids))
				}
			}
			info, err := ref.ModelInfo(rv.path)
			if err != nil {
				t.Fatal(err)
			}
			num := func(k string) int32 {
				f, _ := info[k].(float64)
				return int32(f)
			}
			if v.BOS() != num("bos") || v.EOS() != num("eos") || v.EOT() != num("eot") {
				t.Errorf("bos/eos/eot = %d/%d/%d, llama.cpp %d/%d/%d", v.BOS(), v.EOS(), v.EOT(), num("bos"), num("eos"), num("eot"))
			}
			if v.AddBOS() != info["add_bos"] || v.AddEOS() != info["add_eos"] {
				t.Errorf("add_bos/add_eos = %v/%v, llama.cpp %v/%v", v.AddBOS(), v.AddEOS(), info["add_bos"], info["add_eos"])
			}
			var eog []int32
			if l, ok := info["eog"].([]any); ok {
				for _, e := range l {
					f, _ := e.(float64)
					eog = append(eog, int32(f))
				}
			}
			slices.Sort(eog)
			if !slices.Equal(v.EOG(), eog) {
				t.Errorf("EOG = %v, llama.cpp %v", v.EOG(), eog)
			}
		})
	}
}

// TestDetokenizeMatchesLlamaCpp compares Detokenize with llama.cpp's
// llama_detokenize on random id sequences (tokenized random texts and
// random ids, control tokens included) with every combination of
// removeSpecial and unparseSpecial, and checks that Decode equals
// llama_detokenize(remove_special=false, unparse_special=false) on
// vocabularies without space prefix and clean-up.
func TestDetokenizeMatchesLlamaCpp(t *testing.T) {
	ref := testRef(t)
	n := 300
	if testing.Short() {
		n = 30
	}
	for _, rv := range allRefVocabs(t) {
		t.Run(rv.name, func(t *testing.T) {
			v := loadVocab(t, rv.path)
			r := rand.New(rand.NewPCG(seedOf(rv.name), 2))
			extra := specialTexts(v, r, 20)
			for i := 0; i < n; i++ {
				ids := randIDs(v, r, extra)
				rs, us := r.IntN(2) == 0, r.IntN(2) == 0
				want, err := ref.Detokenize(rv.path, ids, rs, us)
				if err != nil {
					t.Fatal(err)
				}
				if got := whatwgUTF8(v.Detokenize(ids, rs, us)); got != want {
					t.Errorf("ids %v remove=%v unparse=%v:\n got %q\nwant %q", ids, rs, us, got, want)
				}
				if !v.addSpacePrefix && !v.pre.cleanSpaces && !rs && !us {
					b := v.Detokenize(ids, false, false)
					if utf8.Valid(b) && v.Decode(ids) != want {
						t.Errorf("ids %v: Decode %q, llama_detokenize %q", ids, v.Decode(ids), want)
					}
				}
			}
		})
	}
}

// randIDs returns a random id sequence: a tokenized random text, random
// ids, or both, sometimes with BOS/EOS around.
func randIDs(v *Vocab, r *rand.Rand, extra []string) []int32 {
	var ids []int32
	if r.IntN(4) != 0 {
		ids = v.Tokenize(genText(r, 12, extra), r.IntN(2) == 0, r.IntN(2) == 0)
	}
	if r.IntN(3) == 0 || len(ids) == 0 {
		for k := 1 + r.IntN(8); k > 0; k-- {
			var id int32
			if r.IntN(4) == 0 && len(v.specials) > 0 {
				id = v.specials[r.IntN(len(v.specials))]
			} else {
				id = int32(r.IntN(v.Size()))
			}
			ids = slices.Insert(ids, r.IntN(len(ids)+1), id)
		}
	}
	if r.IntN(4) == 0 && v.ids.BOS >= 0 {
		ids = append([]int32{v.ids.BOS}, ids...)
	}
	if r.IntN(4) == 0 && v.ids.EOS >= 0 {
		ids = append(ids, v.ids.EOS)
	}
	return ids
}

// whatwgUTF8 decodes b as the WHATWG Encoding standard's UTF-8 decoder
// (as JavaScript does): each maximal invalid subpart becomes one U+FFFD.
func whatwgUTF8(b []byte) string {
	var out []rune
	cp, needed, seen := rune(0), 0, 0
	lower, upper := byte(0x80), byte(0xBF)
	for i := 0; i < len(b); {
		c := b[i]
		if needed == 0 {
			i++
			switch {
			case c <= 0x7F:
				out = append(out, rune(c))
			case c >= 0xC2 && c <= 0xDF:
				needed, cp = 1, rune(c&0x1F)
			case c >= 0xE0 && c <= 0xEF:
				if c == 0xE0 {
					lower = 0xA0
				}
				if c == 0xED {
					upper = 0x9F
				}
				needed, cp = 2, rune(c&0x0F)
			case c >= 0xF0 && c <= 0xF4:
				if c == 0xF0 {
					lower = 0x90
				}
				if c == 0xF4 {
					upper = 0x8F
				}
				needed, cp = 3, rune(c&0x07)
			default:
				out = append(out, utf8.RuneError)
			}
			continue
		}
		if c < lower || c > upper {
			cp, needed, seen = 0, 0, 0
			lower, upper = 0x80, 0xBF
			out = append(out, utf8.RuneError)
			continue // the byte is read again
		}
		lower, upper = 0x80, 0xBF
		cp = cp<<6 | rune(c&0x3F)
		seen++
		i++
		if seen == needed {
			out = append(out, cp)
			cp, needed, seen = 0, 0, 0
		}
	}
	if needed != 0 {
		out = append(out, utf8.RuneError)
	}
	return string(out)
}

// clip quotes s, cut to 200 bytes.
func clip(s string) string {
	if len(s) > 200 {
		return fmt.Sprintf("%q… (%d bytes)", s[:200], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// idsDiff shows where two id sequences first differ.
func idsDiff(got, want []int32) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := max(0, i-3)
	return fmt.Sprintf("first difference at %d (len %d vs %d):\n got …%v\nwant …%v",
		i, len(got), len(want), got[lo:min(len(got), i+8)], want[lo:min(len(want), i+8)])
}
