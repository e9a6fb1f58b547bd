package vocab

import (
	"unicode/utf8"
)

// piece returns llama_token_to_piece(id, lstrip 0, special) without
// copying: "" for ids out of range, and for control and unknown tokens
// unless special.
func (v *Vocab) piece(id int32, special bool) string {
	if !v.valid(id) {
		return ""
	}
	if !special && v.attrs[id]&attrSpecial != 0 {
		return ""
	}
	return v.pieces.at(int(id))
}

// Piece is llama_token_to_piece(id, lstrip 0, special): the bytes id stands
// for (a byte-fallback token's single byte, "▁" of a llama model as a
// space, a gpt2 model's byte-level text decoded). Control and unknown
// tokens give their text only when special is set; user-defined tokens
// always do. Nil for ids out of range. The slice is the caller's.
func (v *Vocab) Piece(id int32, special bool) []byte {
	p := v.piece(id, special)
	if p == "" {
		return nil
	}
	return []byte(p)
}

// Decode returns the text of ids: the concatenation of their pieces
// (Piece(id, false), so control and unknown tokens are skipped), each
// byte that is not part of valid UTF-8 replaced by U+FFFD.
//
// This is how llama.cpp's server streams generated text (token_to_piece per
// token). It differs from llama_detokenize (see Detokenize) in two ways, so
// that decoding consecutive runs of ids, cut where Incomplete allows,
// concatenates to Decode of all of them: a llama model's leading space
// (from the space prefix) is kept, and gpt2 models' clean-up of spaces
// before punctuation is not applied. For vocabularies with neither (e.g.
// qwen2, smollm, command-r), Decode(ids) is llama_detokenize(ids,
// remove_special=false, unparse_special=false) with invalid UTF-8 replaced.
func (v *Vocab) Decode(ids []int32) string {
	var buf []byte
	for _, id := range ids {
		buf = append(buf, v.piece(id, false)...)
	}
	return validUTF8(buf)
}

// validUTF8 returns b as a string with each byte that does not belong to a
// valid UTF-8 sequence replaced by U+FFFD.
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = append(out, "\uFFFD"...)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return string(out)
}

// Incomplete reports how many trailing ids a streaming detokenizer must
// hold back: the fewest such that the bytes of the ids before them do not
// end inside a character that the bytes after them could still complete —
// a byte-fallback <0xNN> run, or a byte-level token ending inside a
// character. Tokens with empty pieces are held back with the bytes around
// them. Decoding ids[:len(ids)-Incomplete(ids)] and later the rest (what
// follows included) concatenates to Decode of all.
func (v *Vocab) Incomplete(ids []int32) int {
	for c := len(ids); c > 0; c-- {
		if v.safeCut(ids, c) {
			return len(ids) - c
		}
	}
	return len(ids)
}

// safeCut reports whether Decode(ids[:c]) + Decode(ids[c:]...) equals
// Decode of the whole whatever follows ids: the bytes before the cut do not
// end in a proper prefix of a UTF-8 sequence, or the bytes after it
// already make that sequence invalid.
func (v *Vocab) safeCut(ids []int32, c int) bool {
	var before [3]byte // the last bytes before the cut, in order, right-aligned
	k := 0
	for i := c - 1; i >= 0 && k < 3; i-- {
		p := v.piece(ids[i], false)
		for j := len(p) - 1; j >= 0 && k < 3; j-- {
			before[2-k] = p[j]
			k++
		}
	}
	var t []byte
	for m := 1; m <= k; m++ {
		if !utf8.FullRune(before[3-m:]) {
			t = before[3-m:]
			break
		}
	}
	if t == nil {
		return true
	}
	u := append([]byte(nil), t...)
	for i := c; i < len(ids) && len(u) < utf8.UTFMax; i++ {
		u = append(u, v.piece(ids[i], false)...)
	}
	if !utf8.FullRune(u) {
		return false
	}
	r, n := utf8.DecodeRune(u)
	return r == utf8.RuneError && n == 1
}

// Detokenize is llama_detokenize(ids, removeSpecial, unparseSpecial): the
// concatenated pieces, with a llama model's leading space dropped, and
// for gpt2 pre-tokenizers that ask for it (all but a few, e.g. qwen2,
// smollm, command-r) llama.cpp's clean-up of " ?", " !", " .", " ,", " ' "
// and " 's"-like contractions. With removeSpecial a leading BOS and a
// trailing EOS are dropped when the vocabulary adds them. The bytes are
// returned as they are (invalid UTF-8 included).
func (v *Vocab) Detokenize(ids []int32, removeSpecial, unparseSpecial bool) []byte {
	removeSpace := v.addSpacePrefix
	if removeSpecial && v.addBOS && len(ids) > 0 && ids[0] == v.ids.BOS {
		removeSpace = false
		ids = ids[1:]
	}
	if removeSpecial && v.addEOS && len(ids) > 0 && ids[len(ids)-1] == v.ids.EOS {
		ids = ids[:len(ids)-1]
	}
	text := []byte{}
	for _, id := range ids {
		p := v.piece(id, unparseSpecial)
		if removeSpace && len(p) > 0 && p[0] == ' ' {
			p = p[1:]
		}
		removeSpace = false
		text = append(text, p...)
	}
	if !v.pre.cleanSpaces {
		return text
	}
	return cleanSpaces(text)
}

// cleanSpaces is the clean_spaces part of llama_vocab::impl::detokenize,
// in place, as llama.cpp does it.
func cleanSpaces(text []byte) []byte {
	// first pass: " ?", " !", " .", " ,"
	total1 := len(text)
	total := min(total1, 1)
	for i := 1; i < total1; i++ {
		x := text[i]
		if text[i-1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',') {
			total--
		}
		text[total] = x
		total++
	}
	// second pass: a single apostrophe between spaces
	total2 := total
	total = min(total2, 1)
	for i := 1; i < total2; i++ {
		x := text[i]
		if x == '\'' && i+1 < total2 && text[i-1] == ' ' && text[i+1] == ' ' {
			total--
			i++
			text[i] = 0
		}
		text[total] = x
		total++
	}
	// third pass: contractions " 's", " 'm", " 're", " 've"
	total3 := total
	total = min(total3, 1)
	for i := 1; i < total3; i++ {
		x := text[i]
		if text[i-1] == ' ' && x == '\'' && i+1 < total3 {
			x1 := text[i+1]
			if x1 == 't' || x1 == 'd' {
				// kept
			} else if x1 == 's' || x1 == 'm' {
				total--
			} else if i+2 < total3 {
				x2 := text[i+2]
				if (x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e') {
					total--
				}
			}
		}
		text[total] = x
		total++
	}
	return text[:total]
}
