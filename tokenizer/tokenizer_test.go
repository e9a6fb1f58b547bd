package tokenizer

import (
	"slices"
	"testing"
	"unicode/utf8"
)

func TestTokenizerRoundTrip(t *testing.T) {
	var tok Tokenizer
	tests := []struct {
		name string
		text string
	}{
		{"empty", ""},
		{"ascii", "Hello, world!"},
		{"multibyte", "naïve café — 東京 🚀"},
		{"newlines", "a\nb\r\n\tc"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ids := tok.Encode(tc.text)
			if len(ids) != len(tc.text) {
				t.Fatalf("Encode gave %d ids for %d bytes", len(ids), len(tc.text))
			}
			for _, id := range ids {
				if id < 0 || id > 255 {
					t.Fatalf("Encode emitted id %d", id)
				}
			}
			if got := tok.Decode(ids); got != tc.text {
				t.Fatalf("Decode(Encode(%q)) = %q", tc.text, got)
			}
			if got := tok.AppendEncode([]int32{BOS}, tc.text); !slices.Equal(got[1:], ids) || got[0] != BOS {
				t.Fatalf("AppendEncode = %v", got)
			}
		})
	}
}

func TestTokenizerSpecialsAndInvalid(t *testing.T) {
	var tok Tokenizer
	if tok.Vocab() != 258 || tok.BOS() != 256 || tok.EOS() != 257 {
		t.Fatalf("vocab %d BOS %d EOS %d", tok.Vocab(), tok.BOS(), tok.EOS())
	}
	ids := append([]int32{BOS}, tok.Encode("hi")...)
	ids = append(ids, EOS, -5, 1000)
	if got := tok.Decode(ids); got != "hi" {
		t.Fatalf("specials not skipped: %q", got)
	}
	// A lone continuation byte and a truncated sequence become U+FFFD.
	got := tok.Decode([]int32{'a', 0x80, 'b', 0xE6, 0x9D})
	if !utf8.ValidString(got) || got != "a\uFFFDb\uFFFD" {
		t.Fatalf("invalid UTF-8 decoded as %q", got)
	}
}

// A document's tokens are identical wherever it appears in a prompt.
func TestTokenizerPositionIndependent(t *testing.T) {
	var tok Tokenizer
	doc := "Paris is the capital of France."
	alone := tok.Encode(doc)
	prompt := tok.Encode("Context: " + doc + " Question?")
	if !slices.Equal(prompt[len("Context: "):len("Context: ")+len(doc)], alone) {
		t.Fatal("document tokens depend on their position")
	}
}

func TestTokenizerIncomplete(t *testing.T) {
	var tok Tokenizer
	full := tok.Encode("é🚀")
	tests := []struct {
		name string
		ids  []int32
		want int
	}{
		{"empty", nil, 0},
		{"ascii", tok.Encode("ab"), 0},
		{"complete", full, 0},
		{"lead of 2-byte", full[:1], 1},
		{"lead of 4-byte", full[:3], 1},
		{"two of 4", full[:4], 2},
		{"three of 4", full[:5], 3},
		{"special ends", []int32{0xE6, EOS}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tok.Incomplete(tc.ids); got != tc.want {
				t.Fatalf("Incomplete = %d, want %d", got, tc.want)
			}
		})
	}
}

func FuzzTokenizer(f *testing.F) {
	for _, s := range []string{"", "hello", "naïve 東京 🚀", "\xff\xfe", "a\x80b"} {
		f.Add(s)
	}
	var tok Tokenizer
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		if len(ids) != len(s) {
			t.Fatalf("%d ids for %d bytes", len(ids), len(s))
		}
		got := tok.Decode(ids)
		if !utf8.ValidString(got) {
			t.Fatalf("Decode produced invalid UTF-8 %q", got)
		}
		if utf8.ValidString(s) && got != s {
			t.Fatalf("round trip %q -> %q", s, got)
		}
		if n := tok.Incomplete(ids); n < 0 || n > 3 || n > len(ids) {
			t.Fatalf("Incomplete = %d", n)
		}
	})
}

// FuzzDecodeIDs feeds arbitrary id streams (specials, out-of-range ids) to
// Decode and Incomplete.
func FuzzDecodeIDs(f *testing.F) {
	f.Add([]byte{0, 1, 2})
	f.Add([]byte{0xE6, 0x9D, 0xB1})
	var tok Tokenizer
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids := make([]int32, len(raw))
		for i, b := range raw {
			ids[i] = int32(b) + int32(i%3)*200 - 100 // negatives, bytes, specials, beyond
		}
		if got := tok.Decode(ids); !utf8.ValidString(got) {
			t.Fatalf("invalid UTF-8 %q", got)
		}
		if n := tok.Incomplete(ids); n < 0 || n > 3 {
			t.Fatalf("Incomplete = %d", n)
		}
	})
}
