package vocab

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// streamDecode decodes ids as the engine's text stream does: one id at a
// time, decoding the ids before Incomplete's hold-back, then the rest.
func streamDecode(v *Vocab, ids []int32) string {
	var b strings.Builder
	done := 0
	for k := 1; k <= len(ids); k++ {
		stable := k - v.Incomplete(ids[:k])
		if stable > done {
			b.WriteString(v.Decode(ids[done:stable]))
			done = stable
		}
	}
	b.WriteString(v.Decode(ids[done:]))
	return b.String()
}

// TestStreamingDecode checks, for every supported vocabulary file and
// random id sequences (tokenized random texts with byte-fallback and random
// ids mixed in), that decoding in increments cut where Incomplete allows
// concatenates to Decode of all, and that Incomplete holds nothing back
// when the bytes so far are complete UTF-8.
func TestStreamingDecode(t *testing.T) {
	for _, name := range realVocabs {
		t.Run(name, func(t *testing.T) {
			v := loadVocab(t, vocabPath(t, name))
			r := rand.New(rand.NewPCG(seedOf(name), 3))
			extra := specialTexts(v, r, 10)
			var byteIDs []int32
			for _, id := range v.byteTok {
				if id >= 0 {
					byteIDs = append(byteIDs, id)
				}
			}
			n := 400
			if testing.Short() {
				n = 50
			}
			for i := 0; i < n; i++ {
				ids := randIDs(v, r, extra)
				for k := r.IntN(4); k > 0 && len(byteIDs) > 0; k-- {
					ids = slices.Insert(ids, r.IntN(len(ids)+1), byteIDs[r.IntN(len(byteIDs))])
				}
				if got, want := streamDecode(v, ids), v.Decode(ids); got != want {
					t.Fatalf("ids %v: streamed %q, Decode %q", ids, got, want)
				}
				var b []byte
				for k, id := range ids {
					b = append(b, v.Piece(id, false)...)
					if utf8.Valid(b) && v.Incomplete(ids[:k+1]) != 0 {
						t.Fatalf("ids %v: Incomplete = %d on complete text %q", ids[:k+1], v.Incomplete(ids[:k+1]), b)
					}
				}
			}
		})
	}
}

// TestIncomplete checks Incomplete on byte-fallback runs of llama-spm.
func TestIncomplete(t *testing.T) {
	v := loadVocab(t, vocabPath(t, "llama-spm"))
	b := func(c byte) int32 { return v.byteTok[c] }
	hello, _ := v.ID("▁Hello")
	cases := []struct {
		name string
		ids  []int32
		want int
	}{
		{"empty", nil, 0},
		{"word", []int32{hello}, 0},
		{"lead of 3", []int32{hello, b(0xE2)}, 1},
		{"2 of 3", []int32{hello, b(0xE2), b(0x82)}, 2},
		{"3 of 3", []int32{b(0xE2), b(0x82), b(0xAC)}, 0},
		{"3 of 4", []int32{b(0xF0), b(0x9F), b(0xA6)}, 3},
		{"4 of 4", []int32{b(0xF0), b(0x9F), b(0xA6), b(0x99)}, 0},
		{"control after lead", []int32{b(0xE2), v.BOS()}, 2},
		{"lone continuation", []int32{b(0x82)}, 0},
		{"invalid second byte", []int32{b(0xE2), b(0x41)}, 0},
		{"overlong lead", []int32{b(0xC0)}, 0},
		{"surrogate prefix", []int32{b(0xED), b(0xA0)}, 0},
		{"out of range id", []int32{b(0xE2), -5}, 2},
		{"lead after an invalid lead", []int32{b(0xE2), b(0xE2)}, 1},
		{"lead after an invalid pair", []int32{b(0xE2), b(0x82), b(0xE2)}, 1},
		{"completed then lead", []int32{b(0xE2), b(0x82), b(0xAC), b(0xE2)}, 1},
		{"chain of partial pieces", []int32{hello, b(0xE2), b(0x82)}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := v.Incomplete(c.ids); got != c.want {
				t.Errorf("Incomplete(%v) = %d, want %d", c.ids, got, c.want)
			}
		})
	}
	if got := v.Decode([]int32{hello, b(0xE2), b(0x82), b(0xAC)}); got != " Hello€" {
		t.Errorf("Decode = %q, want %q", got, " Hello€")
	}
	if got := v.Decode([]int32{b(0xE2), b(0x41)}); got != "\uFFFDA" {
		t.Errorf("Decode of an invalid sequence = %q, want %q", got, "\uFFFDA")
	}
}

// TestConcurrentTokenize tokenizes from several goroutines at once (run
// with -race) and requires the sequential results.
func TestConcurrentTokenize(t *testing.T) {
	for _, name := range []string{"llama-spm", "qwen2"} {
		v := loadVocab(t, vocabPath(t, name))
		r := rand.New(rand.NewPCG(1, 2))
		texts := make([]string, 200)
		want := make([][]int32, len(texts))
		for i := range texts {
			texts[i] = genText(r, 30, genSpecial)
			want[i] = v.Tokenize(texts[i], true, i%2 == 0)
		}
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 3; k++ {
					for i, text := range texts {
						if got := v.Tokenize(text, true, i%2 == 0); !slices.Equal(got, want[i]) {
							t.Errorf("%s: concurrent Tokenize(%q) = %v, want %v", name, text, got, want[i])
							return
						}
					}
				}
			}()
		}
		wg.Wait()
	}
}

// TestInvalidUTF8 checks llama.cpp's reading of invalid UTF-8 (checked
// once against llama.cpp's unicode_regex_split on 20,000 corrupted texts):
// gpt2 pre-tokenizers read each bad byte as U+FFFD, and accept overlong
// forms and surrogates as the codepoints they spell; llama models write
// the bytes with byte fallback.
func TestInvalidUTF8(t *testing.T) {
	bpe := loadVocab(t, vocabPath(t, "llama-bpe"))
	cases := []struct{ bad, same string }{
		{"a\xffb", "a\uFFFDb"},
		{"x\xe2\x82 y", "x\uFFFD\uFFFD y"},
		{"\xc0\x80z", "\x00z"},
	}
	for _, c := range cases {
		if got, want := bpe.Encode(c.bad), bpe.Encode(c.same); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want Encode(%q) = %v", c.bad, got, c.same, want)
		}
	}
	if got := string(bpe.Detokenize(bpe.Encode("\xed\xa0\x80"), false, false)); got != "\xed\xa0\x80" {
		t.Errorf("a surrogate's bytes come back as %q", got)
	}
	spm := loadVocab(t, vocabPath(t, "llama-spm"))
	got := spm.Encode("\xff")
	want := []int32{spm.byteTok[0xE2], spm.byteTok[0x96], spm.byteTok[0x81], spm.byteTok[0xFF]}
	if id, ok := spm.ID("▁"); ok {
		want = []int32{id, spm.byteTok[0xFF]}
	}
	if !slices.Equal(got, want) {
		t.Errorf("llama-spm Encode(\\xff) = %v, want %v", got, want)
	}
}
