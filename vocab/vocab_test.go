package vocab

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/gguf"
)

// tinySPM is a small SentencePiece vocabulary: <unk> <s> </s>, the 256
// byte tokens, and a few pieces with scores.
func tinySPM() Spec {
	s := DefaultSpec("llama", "")
	s.Tokens = []string{"<unk>", "<s>", "</s>"}
	s.Types = []int32{TypeUnknown, TypeControl, TypeControl}
	s.Scores = []float32{0, 0, 0}
	for b := 0; b < 256; b++ {
		s.Tokens = append(s.Tokens, "<0x"+strings.ToUpper(hex2(byte(b)))+">")
		s.Types = append(s.Types, TypeByte)
		s.Scores = append(s.Scores, 0)
	}
	for _, p := range []struct {
		text  string
		score float32
	}{{"▁", -1}, {"h", -2}, {"e", -2}, {"l", -2}, {"o", -2}, {"he", -3}, {"ll", -3}, {"▁he", -4}, {"llo", -5}, {"▁hello", -6}, {"<|user|>", 0}} {
		s.Tokens = append(s.Tokens, p.text)
		s.Scores = append(s.Scores, p.score)
		typ := TypeNormal
		if p.text == "<|user|>" {
			typ = TypeUserDefined
		}
		s.Types = append(s.Types, typ)
	}
	return s
}

func hex2(b byte) string {
	const d = "0123456789abcdef"
	return string([]byte{d[b>>4], d[b&15]})
}

// tinyBPE is a small byte-level BPE vocabulary with the GPT-2 pre-tokenizer.
func tinyBPE() Spec {
	s := DefaultSpec("gpt2", "gpt-2")
	for b := 0; b < 256; b++ {
		s.Tokens = append(s.Tokens, byteToUnicode[b])
	}
	s.Tokens = append(s.Tokens, "Ġh", "Ġhe", "ll", "Ġhell", "Ġhello", "<|endoftext|>", "<|im_start|>")
	s.Types = make([]int32, len(s.Tokens))
	for i := range s.Types {
		s.Types[i] = TypeNormal
	}
	s.Types[len(s.Types)-2] = TypeControl
	s.Types[len(s.Types)-1] = TypeControl
	s.Merges = []string{"Ġ h", "Ġh e", "l l", "Ġhe ll", "Ġhell o"}
	s.BOS, s.EOS = int32(len(s.Tokens)-2), int32(len(s.Tokens)-2)
	return s
}

// TestTinyVocabularies checks tokenization, pieces and decoding on small
// hand-made vocabularies of both kinds.
func TestTinyVocabularies(t *testing.T) {
	spm, err := New(tinySPM())
	if err != nil {
		t.Fatal(err)
	}
	bpe, err := New(tinyBPE())
	if err != nil {
		t.Fatal(err)
	}
	id := func(v *Vocab, text string) int32 {
		i, ok := v.ID(text)
		if !ok {
			t.Fatalf("no token %q", text)
		}
		return i
	}
	cases := []struct {
		name        string
		v           *Vocab
		text        string
		add, parse  bool
		want        []int32
		wantDecoded string
	}{
		{"spm merges by score", spm, "hello", false, false, []int32{id(spm, "▁hello")}, " hello"},
		{"spm add bos", spm, "hello", true, false, []int32{1, id(spm, "▁hello")}, " hello"},
		{"spm byte fallback", spm, "hé", false, false, []int32{id(spm, "▁"), id(spm, "h"), id(spm, "<0xC3>"), id(spm, "<0xA9>")}, " hé"},
		{"spm user-defined split, prefix again", spm, "he<|user|>he", false, false,
			[]int32{id(spm, "▁he"), id(spm, "<|user|>"), id(spm, "▁he")}, " he<|user|> he"},
		{"spm control text is plain without parse", spm, "</s>", false, false, nil, " </s>"},
		{"spm control parsed", spm, "</s>", false, true, []int32{2}, ""},
		{"spm empty with bos", spm, "", true, false, []int32{1}, ""},
		{"bpe merges by rank", bpe, " hello", false, false, []int32{id(bpe, "Ġhello")}, " hello"},
		{"bpe words", bpe, "hello hello", false, false, []int32{'h' - 0, 'e', id(bpe, "ll"), 'o', id(bpe, "Ġhello")}, "hello hello"},
		{"bpe control parsed", bpe, "a<|im_start|>", false, true, []int32{'a', id(bpe, "<|im_start|>")}, "a"},
		{"bpe control as text", bpe, "<|im_start|>", false, false, nil, "<|im_start|>"},
	}
	// The byte tokens of tinyBPE are at the index of their byte.
	for i := range cases {
		if cases[i].name == "bpe words" {
			cases[i].want[0], cases[i].want[1], cases[i].want[3] = int32('h'), int32('e'), int32('o')
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.v.Tokenize(c.text, c.add, c.parse)
			if c.want != nil && !slices.Equal(got, c.want) {
				t.Errorf("Tokenize(%q) = %v, want %v", c.text, got, c.want)
			}
			if d := c.v.Decode(got); d != c.wantDecoded {
				t.Errorf("Decode(%v) = %q, want %q", got, d, c.wantDecoded)
			}
		})
	}
	if got := string(spm.Piece(1, true)); got != "<s>" {
		t.Errorf("Piece(<s>, special) = %q", got)
	}
	if got := spm.Piece(1, false); got != nil {
		t.Errorf("Piece(<s>) = %q, want nil", got)
	}
	if got := string(spm.Detokenize([]int32{id(spm, "▁hello")}, false, false)); got != "hello" {
		t.Errorf("Detokenize drops the prefix space: got %q", got)
	}
	if !spm.IsSpecial(id(spm, "<|user|>")) || spm.IsSpecial(id(spm, "h")) || spm.IsSpecial(-1) {
		t.Error("IsSpecial wrong")
	}
	if spm.TokenText(99999) != "" || spm.Piece(-3, true) != nil {
		t.Error("out-of-range ids must give empty results")
	}
	if !slices.Equal(spm.EOG(), []int32{2}) || !bpe.IsEOG(bpe.EOS()) {
		t.Errorf("EOG = %v / %v", spm.EOG(), bpe.EOG())
	}
}

// TestNewErrors checks that New rejects inconsistent specs with clear
// errors and never panics.
func TestNewErrors(t *testing.T) {
	mod := func(base func() Spec, f func(*Spec)) Spec {
		s := base()
		f(&s)
		return s
	}
	cases := []struct {
		name string
		spec Spec
		is   error
		msg  string
	}{
		{"unknown model", mod(tinySPM, func(s *Spec) { s.Model = "t5" }), ErrUnsupported, `unsupported tokenizer model "t5"`},
		{"unknown pre", mod(tinyBPE, func(s *Spec) { s.Pre = "deepseek-llm" }), ErrUnsupported, `unsupported pre-tokenizer "deepseek-llm"; supported: `},
		{"no tokens", mod(tinySPM, func(s *Spec) { s.Tokens, s.Scores, s.Types = nil, nil, nil }), ErrInvalidSpec, "no tokens"},
		{"short scores", mod(tinySPM, func(s *Spec) { s.Scores = s.Scores[:5] }), ErrInvalidSpec, "5 scores for"},
		{"long types", mod(tinySPM, func(s *Spec) { s.Types = append(s.Types, 1) }), ErrInvalidSpec, "token types for"},
		{"duplicate token", mod(tinySPM, func(s *Spec) { s.Tokens[5] = s.Tokens[4] }), ErrInvalidSpec, "repeats token"},
		{"merge without space", mod(tinyBPE, func(s *Spec) { s.Merges = append(s.Merges, "abc") }), ErrInvalidSpec, `merge 5 "abc"`},
		{"merge of a space only", mod(tinyBPE, func(s *Spec) { s.Merges = append(s.Merges, " ") }), ErrInvalidSpec, "merge 5"},
		{"bos out of range", mod(tinySPM, func(s *Spec) { s.BOS = 100000 }), ErrInvalidSpec, "BOS token id 100000 out of range"},
		{"eos negative", mod(tinySPM, func(s *Spec) { s.EOS = -7 }), ErrInvalidSpec, "EOS token id -7"},
		{"add bos without bos", mod(tinySPM, func(s *Spec) { s.BOS = -1 }), ErrInvalidSpec, "add_bos set but no BOS"},
		{"add eos without eos", mod(tinyBPE, func(s *Spec) { s.AddEOS, s.EOS = true, -1 }), ErrInvalidSpec, "add_eos set but no EOS"},
		{"fim out of range", mod(tinyBPE, func(s *Spec) { s.FIMSep = 1 << 30 }), ErrInvalidSpec, "FIM sep token id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := New(c.spec)
			if err == nil || v != nil {
				t.Fatalf("New = %v, %v; want an error", v, err)
			}
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q: want %v containing %q", err, c.is, c.msg)
			}
		})
	}
}

// TestSpecFromGGUF checks the defaults and errors of SpecFromGGUF on
// small GGUF files.
func TestSpecFromGGUF(t *testing.T) {
	tokens := []string{"<unk>", "<s>", "</s>", "a", "b"}
	parse := func(kv []gguf.KV) (*gguf.File, error) {
		b, err := gguf.Encode(kv, nil)
		if err != nil {
			t.Fatal(err)
		}
		return gguf.Parse(b)
	}
	cases := []struct {
		name   string
		kv     []gguf.KV
		errMsg string
		check  func(t *testing.T, s Spec)
	}{
		{"llama defaults", []gguf.KV{{Key: keyModel, Value: "llama"}, {Key: keyTokens, Value: tokens}}, "", func(t *testing.T, s Spec) {
			if s.BOS != 1 || s.EOS != 2 || s.UNK != 0 || !s.AddBOS || s.AddEOS || !s.AddSpacePrefix || s.EOT != -1 {
				t.Errorf("defaults: %+v", s)
			}
		}},
		{"keys override", []gguf.KV{{Key: keyModel, Value: "llama"}, {Key: keyTokens, Value: tokens},
			{Key: "tokenizer.ggml.bos_token_id", Value: uint32(3)}, {Key: "tokenizer.ggml.eos_token_id", Value: uint32(99)},
			{Key: keyAddBOS, Value: false}, {Key: keyAddPrefix, Value: false}, {Key: keyScores, Value: []int32{1, 2, 3, 4, 5, 6}}},
			"", func(t *testing.T, s Spec) {
				if s.BOS != 3 || s.EOS != 2 || s.AddBOS || s.AddSpacePrefix || len(s.Scores) != 5 || s.Scores[4] != 5 {
					t.Errorf("overrides (out-of-range EOS keeps the default): %+v", s)
				}
			}},
		{"gpt2 defaults out of range", []gguf.KV{{Key: keyModel, Value: "gpt2"}, {Key: keyPre, Value: "llama-bpe"},
			{Key: keyTokens, Value: tokens}, {Key: keyMerges, Value: []string{"a b"}}}, "", func(t *testing.T, s Spec) {
			if s.BOS != -1 || s.EOS != -1 || !s.AddBOS {
				t.Errorf("gpt2 defaults: %+v", s)
			}
		}},
		{"no model", []gguf.KV{{Key: keyTokens, Value: tokens}}, "tokenizer.ggml.model", nil},
		{"no tokens", []gguf.KV{{Key: keyModel, Value: "llama"}}, "tokenizer.ggml.tokens", nil},
		{"gpt2 without merges", []gguf.KV{{Key: keyModel, Value: "gpt2"}, {Key: keyTokens, Value: tokens}}, "tokenizer.ggml.merges", nil},
		{"short scores", []gguf.KV{{Key: keyModel, Value: "llama"}, {Key: keyTokens, Value: tokens}, {Key: keyScores, Value: []float32{1}}}, "1 scores for 5 tokens", nil},
		{"scores of strings", []gguf.KV{{Key: keyModel, Value: "llama"}, {Key: keyTokens, Value: tokens}, {Key: keyScores, Value: tokens}}, "want a float32 or int32 array", nil},
		{"bool of wrong type", []gguf.KV{{Key: keyModel, Value: "llama"}, {Key: keyTokens, Value: tokens}, {Key: keyAddBOS, Value: "yes"}}, keyAddBOS, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := parse(c.kv)
			if err != nil {
				t.Fatal(err)
			}
			s, err := SpecFromGGUF(f)
			if c.errMsg != "" {
				if err == nil || !strings.Contains(err.Error(), c.errMsg) {
					t.Fatalf("error %v, want one containing %q", err, c.errMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, s)
		})
	}
}

// TestSupportedPre checks the names the brief requires, with llama.cpp's
// aliases.
func TestSupportedPre(t *testing.T) {
	have := SupportedPre()
	for _, n := range []string{"default", "llama-bpe", "llama3", "llama-v3", "qwen2", "gpt-2", "smollm"} {
		if !slices.Contains(have, n) {
			t.Errorf("%q not supported", n)
		}
	}
}

// TestStdHash pins stdHash to libstdc++'s std::hash<std::string> (values
// printed by a C++ program built with GCC 12); stdMapOrder built on it was
// checked to give the same iteration order as libstdc++ on llama.cpp's
// vocabulary files, and TestPiecesMatchLlamaCpp compares the EOT llama.cpp
// picks among several candidates.
func TestStdHash(t *testing.T) {
	for s, want := range map[string]uint64{
		"":           6142509188972423790,
		"a":          4993892634952068459,
		"ab":         5498234120169091963,
		"abcdefgh":   8664279048047335611,
		"abcdefghi":  13036955925923793583,
		"<|eot_id|>": 16025401802141084834,
		"▁the":       16230366170308768533,
	} {
		if got := stdHash(s); got != want {
			t.Errorf("stdHash(%q) = %d, want %d", s, got, want)
		}
	}
	// Iteration order of a small map: inserting "0".."29" (the bucket count
	// grows 13 → 29 → 59), as libstdc++ iterates it.
	var toks []string
	for i := 0; i < 30; i++ {
		toks = append(toks, strconv.Itoa(i))
	}
	want := []int32{29, 12, 11, 18, 9, 1, 22, 8, 0, 17, 28, 19, 4, 5, 6, 3, 16, 7, 10, 27, 13, 15, 14, 26, 20, 21, 23, 24, 2, 25}
	tt, ok := newTexts(toks)
	if !ok {
		t.Fatal("newTexts refused")
	}
	if got := stdMapOrder(tt); !slices.Equal(got, want) {
		t.Errorf("stdMapOrder = %v, libstdc++ %v", got, want)
	}
}
