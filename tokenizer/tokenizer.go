package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Byte-level tokenizer ids.
const (
	// BOS is the beginning-of-sequence token id.
	BOS int32 = 256
	// EOS is the end-of-sequence token id.
	EOS int32 = 257
	// Vocab is the tokenizer's vocabulary size: 256 byte ids plus BOS and
	// EOS.
	Vocab = 258
)

// Tokenizer is the byte-level tokenizer shared by cb-engine and the model:
// every UTF-8 byte of the text is one token (ids 0..255) and there are two
// special tokens, BOS and EOS, that Encode never emits. Because tokens are
// bytes, a document's tokens are identical wherever it appears in a prompt.
// The zero value is ready to use; a Tokenizer is stateless and safe for
// concurrent use.
type Tokenizer struct{}

// Vocab is the vocabulary size (the constant [Vocab]).
func (Tokenizer) Vocab() int { return Vocab }

// BOS returns the beginning-of-sequence id.
func (Tokenizer) BOS() int32 { return BOS }

// EOS returns the end-of-sequence id.
func (Tokenizer) EOS() int32 { return EOS }

// Encode returns the ids of the UTF-8 bytes of s (no special tokens). Invalid
// UTF-8 in s is encoded byte for byte, so Decode(Encode(s)) == s for valid
// UTF-8.
func (Tokenizer) Encode(s string) []int32 {
	out := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int32(s[i])
	}
	return out
}

// AppendEncode appends the ids of the bytes of s to dst and returns it.
func (Tokenizer) AppendEncode(dst []int32, s string) []int32 {
	for i := 0; i < len(s); i++ {
		dst = append(dst, int32(s[i]))
	}
	return dst
}

// Decode turns ids back into text. Special and out-of-range ids are
// skipped; byte sequences that are not valid UTF-8 become U+FFFD, so the
// result is always valid UTF-8.
func (Tokenizer) Decode(ids []int32) string {
	buf := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < 256 {
			buf = append(buf, byte(id))
		}
	}
	if utf8.Valid(buf) {
		return string(buf)
	}
	return strings.ToValidUTF8(string(buf), "\uFFFD")
}

// Incomplete reports how many trailing ids of a byte-token stream form an
// incomplete (but so far valid) UTF-8 sequence, which a streaming detokenizer
// should hold back until more tokens arrive. Special ids end any pending
// sequence.
func (Tokenizer) Incomplete(ids []int32) int {
	// A UTF-8 sequence is at most 4 bytes: look at the last 3 ids.
	for back := 1; back <= 3 && back <= len(ids); back++ {
		id := ids[len(ids)-back]
		if id < 0 || id >= 256 {
			return 0
		}
		b := byte(id)
		if b&0xC0 == 0x80 { // continuation byte: keep looking for the lead
			continue
		}
		need := 0
		switch {
		case b&0xE0 == 0xC0:
			need = 2
		case b&0xF0 == 0xE0:
			need = 3
		case b&0xF8 == 0xF0:
			need = 4
		}
		if need > back {
			return back
		}
		return 0
	}
	return 0
}
