package vocab

//go:generate go run gen_tables.go

import (
	"iter"
	"sort"
	"sync"
)

// Codepoint flags, as llama.cpp's unicode_cpt_flags (src/unicode.h): one
// category bit, plus fWhitespace for the codepoints of \s.
const (
	fUndefined   = 0x0001
	fNumber      = 0x0002 // \p{N}
	fLetter      = 0x0004 // \p{L}
	fSeparator   = 0x0008 // \p{Z}
	fAccentMark  = 0x0010 // \p{M}
	fPunctuation = 0x0020 // \p{P}
	fSymbol      = 0x0040 // \p{S}
	fControl     = 0x0080 // \p{C}
	fCategories  = 0x00FF
	fWhitespace  = 0x0100
)

// maxCodepoint is one past the last codepoint of llama.cpp's tables.
const maxCodepoint = 0x110000

// outOfRange is what the splitters read past the end of a segment (as
// llama.cpp's OUT_OF_RANGE); its flags are 0.
const outOfRange = 0xFFFFFFFF

// bmpFlags holds the flags of every codepoint below 0x10000, built on first
// use from the generated range tables.
var bmpFlags = sync.OnceValue(func() *[0x10000]uint16 {
	t := new([0x10000]uint16)
	for i := 0; i+1 < len(cptRangeStarts); i++ {
		lo, hi := cptRangeStarts[i], min(cptRangeStarts[i+1], 0x10000)
		for c := lo; c < hi; c++ {
			t[c] = uint16(cptRangeFlags[i])
		}
	}
	for _, c := range cptWhitespace {
		if c < 0x10000 {
			t[c] |= fWhitespace
		}
	}
	return t
})

// cptFlags returns the flags of codepoint c as llama.cpp's
// unicode_cpt_flags_from_cpt: fUndefined past the tables.
func cptFlags(t *[0x10000]uint16, c uint32) uint16 {
	if c < 0x10000 {
		return t[c]
	}
	if c >= maxCodepoint {
		return fUndefined
	}
	i := sort.Search(len(cptRangeStarts), func(i int) bool { return cptRangeStarts[i] > c }) - 1
	f := uint16(cptRangeFlags[i])
	for _, w := range cptWhitespace {
		if w == c {
			f |= fWhitespace
		}
	}
	return f
}

// utf8Len is llama.cpp's unicode_len_utf8: the length of the sequence a lead
// byte announces, from its high nibble alone (1 for continuation bytes).
func utf8Len(b byte) int {
	return [16]int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4}[b>>4]
}

// chars yields the offset and length of each character of s as llama.cpp's
// tokenizers cut it: by the length its lead byte announces (utf8Len),
// clipped at the end of s.
func chars(s string) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		for off := 0; off < len(s); {
			n := min(utf8Len(s[off]), len(s)-off)
			if !yield(off, n) {
				return
			}
			off += n
		}
	}
}

// decodeCpt decodes one codepoint at s[off:] exactly as llama.cpp's
// unicode_cpts_from_utf8: overlong forms, surrogates and values past
// U+10FFFF are accepted; a malformed or truncated sequence yields U+FFFD and
// consumes one byte.
func decodeCpt(s string, off int) (uint32, int) {
	b0 := s[off]
	switch {
	case b0&0x80 == 0:
		return uint32(b0), 1
	case b0&0x40 == 0:
		return 0xFFFD, 1
	case b0&0x20 == 0:
		if off+1 >= len(s) || s[off+1]&0xC0 != 0x80 {
			return 0xFFFD, 1
		}
		return uint32(b0&0x1F)<<6 | uint32(s[off+1]&0x3F), 2
	case b0&0x10 == 0:
		if off+2 >= len(s) || s[off+1]&0xC0 != 0x80 || s[off+2]&0xC0 != 0x80 {
			return 0xFFFD, 1
		}
		return uint32(b0&0x0F)<<12 | uint32(s[off+1]&0x3F)<<6 | uint32(s[off+2]&0x3F), 3
	case b0&0x08 == 0:
		if off+3 >= len(s) || s[off+1]&0xC0 != 0x80 || s[off+2]&0xC0 != 0x80 || s[off+3]&0xC0 != 0x80 {
			return 0xFFFD, 1
		}
		return uint32(b0&0x07)<<18 | uint32(s[off+1]&0x3F)<<12 | uint32(s[off+2]&0x3F)<<6 | uint32(s[off+3]&0x3F), 4
	}
	return 0xFFFD, 1
}

// appendCpts appends the codepoints of s (decodeCpt) to dst.
func appendCpts(dst []uint32, s string) []uint32 {
	for off := 0; off < len(s); {
		c, n := decodeCpt(s, off)
		dst = append(dst, c)
		off += n
	}
	return dst
}

// appendCptUTF8 appends the UTF-8 encoding of c as llama.cpp's
// unicode_cpt_to_utf8 (surrogates are encoded like any other value). Past
// U+10FFFF, where llama.cpp throws, it appends U+FFFD.
func appendCptUTF8(dst []byte, c uint32) []byte {
	switch {
	case c <= 0x7F:
		return append(dst, byte(c))
	case c <= 0x7FF:
		return append(dst, 0xC0|byte(c>>6)&0x1F, 0x80|byte(c)&0x3F)
	case c <= 0xFFFF:
		return append(dst, 0xE0|byte(c>>12)&0x0F, 0x80|byte(c>>6)&0x3F, 0x80|byte(c)&0x3F)
	case c <= 0x10FFFF:
		return append(dst, 0xF0|byte(c>>18)&0x07, 0x80|byte(c>>12)&0x3F, 0x80|byte(c>>6)&0x3F, 0x80|byte(c)&0x3F)
	}
	return append(dst, 0xEF, 0xBF, 0xBD)
}

// asciiLower is llama.cpp's unicode_tolower restricted to what the
// splitters compare its result with (ASCII letters): its table maps no
// other codepoint to an ASCII letter.
func asciiLower(c uint32) uint32 {
	if c >= 'A' && c <= 'Z' {
		return c + 32
	}
	return c
}

// byteToUnicode is GPT-2's byte→codepoint map (llama.cpp's
// unicode_byte_to_utf8_map), as UTF-8 strings; unicodeToByte is its inverse.
var byteToUnicode, unicodeToByte = func() ([256]string, map[string]byte) {
	var enc [256]string
	dec := make(map[string]byte, 256)
	mapped := [256]bool{}
	for c := 0; c < 256; c++ {
		if (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF) {
			enc[c] = string(appendCptUTF8(nil, uint32(c)))
			mapped[c] = true
		}
	}
	n := uint32(0)
	for c := 0; c < 256; c++ {
		if !mapped[c] {
			enc[c] = string(appendCptUTF8(nil, 256+n))
			n++
		}
	}
	for c := 0; c < 256; c++ {
		dec[enc[c]] = byte(c)
	}
	return enc, dec
}()
