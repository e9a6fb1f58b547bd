package llamaref

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestAddSpecial checks add_special=true against what llama.cpp adds per vocabulary: BOS for
// SPM/BPE vocabularies with add_bos, nothing without, [CLS] … [SEP] for WPM.
func TestAddSpecial(t *testing.T) {
	ref := testRef(t)
	cases := []struct {
		vocab, text    string
		parse          bool
		without, with_ []int32
	}{
		{"llama-spm", "Hello world", false, []int32{15043, 3186}, []int32{1, 15043, 3186}},
		{"llama-spm", "", false, []int32{}, []int32{1}},
		{"llama-spm", "Hello world<s></s>", true, []int32{15043, 3186, 1, 2}, []int32{1, 15043, 3186, 1, 2}},
		{"llama-bpe", "Hello world", false, []int32{9906, 1917}, []int32{128000, 9906, 1917}},
		{"llama-bpe", "", false, []int32{}, []int32{128000}},
		{"qwen2", "Hello world", false, []int32{9707, 1879}, []int32{9707, 1879}},
		{"qwen2", "<|im_start|>user", true, []int32{151644, 872}, []int32{151644, 872}},
		{"gpt-2", "Hello world", false, []int32{15496, 995}, []int32{15496, 995}},
		{"gpt-2", "<|endoftext|>", true, []int32{50256}, []int32{50256}},
		{"bert-bge", "Hello world", false, []int32{7592, 2088}, []int32{101, 7592, 2088, 102}},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%q/parse=%v", c.vocab, c.text, c.parse), func(t *testing.T) {
			f := vocabFile(t, c.vocab)
			got, err := ref.Tokenize(f, c.text, false, c.parse)
			if err != nil {
				t.Fatal(err)
			}
			if !equalIDs(got, c.without) {
				t.Errorf("add_special=false: got %v, want %v", got, c.without)
			}
			got, err = ref.Tokenize(f, c.text, true, c.parse)
			if err != nil {
				t.Fatal(err)
			}
			if !equalIDs(got, c.with_) {
				t.Errorf("add_special=true: got %v, want %v", got, c.with_)
			}
		})
	}
}

// TestParseSpecial checks that special-token text is split only with parse_special.
func TestParseSpecial(t *testing.T) {
	ref := testRef(t)
	f := vocabFile(t, "llama-bpe")
	on, err := ref.Tokenize(f, "<|eot_id|>", false, true)
	if err != nil {
		t.Fatal(err)
	}
	if !equalIDs(on, []int32{128009}) {
		t.Errorf("parse_special=true: got %v, want [128009]", on)
	}
	off, err := ref.Tokenize(f, "<|eot_id|>", false, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(off) < 2 {
		t.Errorf("parse_special=false: got %v, want the text split into ordinary tokens", off)
	}
}

// TestPiecesConcatenate proves Piece gives llama_token_to_piece's raw bytes: the pieces of every
// test-vector tokenization concatenate back to the input (byte-level BPE: exactly; SPM: after
// the space llama.cpp prefixes), including byte-fallback pieces that are partial UTF-8.
func TestPiecesConcatenate(t *testing.T) {
	ref := testRef(t)
	for _, c := range []struct {
		vocab, prefix string
	}{{"llama-bpe", ""}, {"qwen2", ""}, {"gpt-2", ""}, {"llama-spm", " "}} {
		t.Run(c.vocab, func(t *testing.T) {
			f := vocabFile(t, c.vocab)
			partial := 0
			for _, v := range readVectors(t, f) {
				ps, err := ref.Pieces(f, v.IDs, false)
				if err != nil {
					t.Fatal(err)
				}
				var b []byte
				for _, p := range ps {
					if !utf8.Valid(p) {
						partial++
					}
					b = append(b, p...)
				}
				if want := c.prefix + v.Text; string(b) != want && !(c.prefix != "" && v.Text == "" && len(b) == 0) {
					t.Errorf("pieces of %q concatenate to %q", v.Text, b)
				}
			}
			if c.vocab != "gpt-2" && c.vocab != "llama-spm" && partial == 0 {
				t.Errorf("no piece was partial UTF-8; the vectors should contain some")
			}
			t.Logf("%d partial-UTF-8 pieces", partial)
		})
	}
}

// TestPieceSpecial checks special=false hides control tokens and special=true shows them, and a
// byte token's piece is its one raw byte.
func TestPieceSpecial(t *testing.T) {
	ref := testRef(t)
	spm := vocabFile(t, "llama-spm")
	cases := []struct {
		name    string
		file    string
		id      int32
		special bool
		want    []byte
	}{
		{"bos hidden", spm, 1, false, []byte{}},
		{"bos shown", spm, 1, true, []byte("<s>")},
		{"byte 0x80", spm, 3 + 0x80, false, []byte{0x80}},
		{"byte 0x00", spm, 3, false, []byte{0}},
		{"word", spm, 15043, false, []byte(" Hello")},
		{"bpe byte-level", vocabFile(t, "gpt-2"), 220, false, []byte(" ")},
		{"bpe partial utf8", vocabFile(t, "gpt-2"), 447, false, []byte{0xe2, 0x80}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ref.Piece(c.file, c.id, c.special)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// TestPiecesWholeVocab runs the ported token_to_piece over every token of several vocabularies;
// the driver checks each against llama_detokenize and fails on any difference.
func TestPiecesWholeVocab(t *testing.T) {
	ref := testRef(t)
	for _, name := range []string{"llama-spm", "llama-bpe", "gpt-2", "bert-bge"} {
		t.Run(name, func(t *testing.T) {
			f := vocabFile(t, name)
			info, err := ref.ModelInfo(f)
			if err != nil {
				t.Fatal(err)
			}
			n := int(info["n_vocab"].(float64))
			ids := make([]int32, n)
			for i := range ids {
				ids[i] = int32(i)
			}
			for _, special := range []bool{false, true} {
				if _, err := ref.Pieces(f, ids, special); err != nil {
					t.Fatalf("special=%v: %v", special, err)
				}
			}
		})
	}
}

// TestDetokenize checks llama_detokenize's remove_special and unparse_special handling.
func TestDetokenize(t *testing.T) {
	ref := testRef(t)
	spm := vocabFile(t, "llama-spm")
	bpe := vocabFile(t, "llama-bpe")
	cases := []struct {
		name            string
		file            string
		ids             []int32
		remove, unparse bool
		want            string
	}{
		{"spm plain strips prefix space", spm, []int32{15043, 3186}, false, false, "Hello world"},
		{"spm bos hidden", spm, []int32{1, 15043, 3186}, false, false, " Hello world"},
		{"spm bos shown", spm, []int32{1, 15043, 3186}, false, true, "<s> Hello world"},
		{"spm bos removed keeps space", spm, []int32{1, 15043, 3186}, true, true, " Hello world"},
		{"spm eos kept (no add_eos)", spm, []int32{15043, 2}, true, true, "Hello</s>"},
		{"bpe bos removed", bpe, []int32{128000, 9906, 1917}, true, true, "Hello world"},
		{"bpe eot shown", bpe, []int32{9906, 128009}, false, true, "Hello<|eot_id|>"},
		{"bpe eot hidden", bpe, []int32{9906, 128009}, false, false, "Hello"},
		{"bpe partial utf8 replaced", bpe, []int32{9468}, false, false, "\uFFFD"},
		{"empty", bpe, []int32{}, false, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ref.Detokenize(c.file, c.ids, c.remove, c.unparse)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// TestBadInput checks that bad arguments give clear errors and leave the process usable.
func TestBadInput(t *testing.T) {
	ref := testRef(t)
	f := vocabFile(t, "llama-spm")
	var re *RefError
	if _, err := ref.Tokenize(f, "a\xffb", false, false); !errors.Is(err, ErrInvalidUTF8) {
		t.Errorf("invalid UTF-8: err = %v, want ErrInvalidUTF8", err)
	}
	if _, err := ref.Tokenize(f+".missing", "a", false, false); !errors.As(err, &re) || !strings.Contains(re.Msg, "not found") {
		t.Errorf("missing model: err = %v", err)
	}
	if _, err := ref.Detokenize(f, []int32{32000}, false, false); !errors.As(err, &re) || !strings.Contains(re.Msg, "out of range") {
		t.Errorf("id out of range: err = %v", err)
	}
	if _, err := ref.Piece(f, -1, false); !errors.As(err, &re) {
		t.Errorf("negative id: err = %v", err)
	}
	if _, err := ref.Tokenize("", "a", false, false); err == nil {
		t.Error("empty model path: no error")
	}
	if err := ref.call("nope", map[string]any{}, nil); !errors.As(err, &re) || !strings.Contains(re.Msg, "unknown op") {
		t.Errorf("unknown op: err = %v", err)
	}
	notGGUF := filepath.Join(t.TempDir(), "not.gguf")
	if err := os.WriteFile(notGGUF, []byte("this is not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ref.Tokenize(notGGUF, "a", false, false); !errors.As(err, &re) {
		t.Errorf("not a GGUF file: err = %v", err)
	}
	got, err := ref.Tokenize(f, "ok \x00 nul", false, false)
	if err != nil || len(got) == 0 {
		t.Errorf("after errors: %v, %v", got, err)
	}
}

// TestConcurrentCalls issues calls from many goroutines at once; every answer must match its
// own question.
func TestConcurrentCalls(t *testing.T) {
	ref := testRef(t)
	f := vocabFile(t, "gpt-2")
	want, err := ref.Tokenize(f, "Hello world 0", false, false)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 16)
	for g := range 16 {
		go func() {
			for i := range 20 {
				text := fmt.Sprintf("Hello world %d", (g*20+i)%10)
				ids, err := ref.Tokenize(f, text, false, false)
				if err == nil {
					var back string
					back, err = ref.Detokenize(f, ids, false, false)
					if err == nil && back != text {
						err = fmt.Errorf("round trip %q -> %v -> %q", text, ids, back)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if len(want) != 3 {
		t.Errorf("tokenize %q = %v", "Hello world 0", want)
	}
}

// TestStartClose checks start-up time, Close, and that calls after Close fail with ErrClosed.
func TestStartClose(t *testing.T) {
	t0 := time.Now()
	r, err := Start(context.Background())
	if err != nil {
		t.Fatalf("start (run bash scripts/deps.sh): %v", err)
	}
	t.Logf("node start-up: %v", time.Since(t0))
	f := vocabFile(t, "llama-spm")
	t1 := time.Now()
	if _, err := r.Tokenize(f, "x", false, false); err != nil {
		t.Fatal(err)
	}
	t.Logf("first tokenize (vocab load): %v", time.Since(t1))
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Tokenize(f, "x", false, false); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: err = %v, want ErrClosed", err)
	}
}

// TestTokenizeBatchTiming tokenizes 1000 short random strings in one round trip and checks the
// batch agrees with single calls.
func TestTokenizeBatchTiming(t *testing.T) {
	ref := testRef(t)
	f := vocabFile(t, "llama-bpe")
	if _, err := ref.Tokenize(f, "warm", false, false); err != nil {
		t.Fatal(err)
	}
	texts := randomTexts(rand.New(rand.NewPCG(1, 2)), 1000)
	t0 := time.Now()
	got, err := ref.TokenizeBatch(f, texts, false, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TokenizeBatch of %d short strings: %v", len(texts), time.Since(t0))
	t0 = time.Now()
	for i := range 50 {
		one, err := ref.Tokenize(f, texts[i], false, true)
		if err != nil {
			t.Fatal(err)
		}
		if !equalIDs(one, got[i]) {
			t.Errorf("text %q: batch %v, single %v", texts[i], got[i], one)
		}
	}
	t.Logf("single Tokenize round trip: %v", time.Since(t0)/50)
}

func randomTexts(rng *rand.Rand, n int) []string {
	alphabet := []string{"a", "b", "Z", " ", "  ", "\n", "\t", "1", "23", "é", "ß", "中", "文", "🦙", "'s", "'", "<", ">", "|", "<|eot_id|>", ".", ",", "!", "\u0301", "\u00a0"}
	out := make([]string, n)
	for i := range out {
		var sb strings.Builder
		for range rng.IntN(16) {
			sb.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		out[i] = sb.String()
	}
	return out
}

// FuzzTokenizePieces feeds arbitrary text through the reference tokenizer (gpt-2's byte-level
// BPE) and checks the pieces concatenate back to the text: any loss in the driver's transport
// (JSON, JavaScript strings, base64 pieces) shows up as a difference.
func FuzzTokenizePieces(f *testing.F) {
	for _, s := range []string{"", "Hello world", " \n\t", "🦙.cpp", "\x00", "<|endoftext|>", "ÿ\u0080", "a\u0301"} {
		f.Add(s)
	}
	ref := testRef(f)
	file := vocabFile(f, "gpt-2")
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := ref.Tokenize(file, s, false, false)
		if !utf8.ValidString(s) {
			if !errors.Is(err, ErrInvalidUTF8) {
				t.Fatalf("invalid UTF-8 %q: err = %v", s, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		ps, err := ref.Pieces(file, ids, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(bytes.Join(ps, nil)); got != s {
			t.Fatalf("%q -> %v -> %q", s, ids, got)
		}
	})
}

func BenchmarkTokenizeBatch(b *testing.B) {
	ref := testRef(b)
	f := vocabFile(b, "llama-bpe")
	texts := randomTexts(rand.New(rand.NewPCG(3, 4)), 1000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ref.TokenizeBatch(f, texts, false, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTokenize(b *testing.B) {
	ref := testRef(b)
	f := vocabFile(b, "llama-bpe")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ref.Tokenize(f, "Hello world, this is a test.", false, false); err != nil {
			b.Fatal(err)
		}
	}
}
