package vocab

import (
	"math/rand/v2"
	"strings"
)

// Pieces random test texts are made of: many scripts, emoji (ZWJ
// sequences, skin tones, flags, variation selectors), combining marks,
// digit runs (ASCII and other scripts), whitespace runs, contractions and
// punctuation.
var genPieces = []string{
	"Hello", "world", "the", "The", "quick", "brown", "fox", "don't", "I'm", "you're", "we've", "she'll", "he'd",
	"it's", "IT'S", "You'RE", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'", "''", "'x",
	"3", "33", "333", "3333", "12345678", "3.14159", "1,000,000", "٣٤٥", "３４５", "²", "Ⅻ", "½", "🔟",
	" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n ", "\t\t", "\u00a0", "\u3000", "\u2009", "\u0085", "\u2028", "\v", "\f",
	"нещо", "на", "Български", "Ελληνικά", "العربية", "עברית", "हिन्दी", "नमस्ते", "ไทย", "ภาษาไทย",
	"中文", "我想在apple工作", "日本語", "ひらがな", "カタカナ", "한국어", "안녕하세요", "ក្រមុំ", "ខ្មែរ", "ქართული", "Հայերեն",
	"🦙", "🚀", "😶\u200d🌫️", "👍🏽", "🇺🇸", "❤️", "✅", "👨\u200d👩\u200d👧", "🙂🙃", "☕",
	"e\u0301", "a\u0308\u0323", "\u0301", "n\u0303", "Å", "ﬁ", "ß", "İ", "Σς",
	".", ",", "!", "?", "...", "…", "—", "–", "-", "(", ")", "[", "]", "{", "}", "<", ">", "\"", "“", "”", "«", "»",
	"¿", "¡", "$", "€", "£", "¥", "©", "®", "™", "±", "×", "÷", "@", "#", "%", "^", "&", "*", "_", "=", "+", "|", "\\", "/", "~", "`",
	"::", "->", "=>", "!=", "==", "<=", ">=", "&&", "||", "/*", "*/", "//", "#include", "func()", "x[i]", "a.b",
	"http://example.com/a?b=c", "foo@bar.com", "snake_case", "camelCase", "UPPER", "MiXeD",
	"\u200b", "\ufeff", "\u00ad", "\x00", "\x01", "\x7f", "\ufffd", "\U0001F600", "\U00010348", "\U0002A6D6",
}

// genSpecial are special-token texts of common vocabularies.
var genSpecial = []string{
	"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
	"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<|user|>", "<|end|>", "<|assistant|>",
	"<|fim_prefix|>", "<|fim_middle|>", "<|file_sep|>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
	"<|im_start", "im_end|>", "<", "<|",
}

// genText returns a random text: 1..maxPieces pieces (from genPieces,
// extra, random codepoints and random ASCII), sometimes space-separated.
func genText(r *rand.Rand, maxPieces int, extra []string) string {
	var b strings.Builder
	n := 1 + r.IntN(maxPieces)
	sep := r.IntN(3) == 0
	for i := 0; i < n; i++ {
		if sep && i > 0 {
			b.WriteByte(' ')
		}
		switch k := r.IntN(20); {
		case k < 12:
			b.WriteString(genPieces[r.IntN(len(genPieces))])
		case k < 14 && len(extra) > 0:
			b.WriteString(extra[r.IntN(len(extra))])
		case k < 16:
			for j := r.IntN(6); j >= 0; j-- {
				b.WriteByte(byte(0x20 + r.IntN(0x5F)))
			}
		case k < 18:
			b.WriteRune(randRune(r))
		default:
			for j := r.IntN(4); j >= 0; j-- {
				b.WriteString([]string{" ", "\t", "\n", "\r", "\u00a0"}[r.IntN(5)])
			}
		}
	}
	return b.String()
}

// randRune returns a random valid codepoint (no surrogates), often in the
// BMP, sometimes unassigned.
func randRune(r *rand.Rand) rune {
	for {
		var c rune
		switch r.IntN(4) {
		case 0:
			c = rune(0x80 + r.IntN(0x780))
		case 1, 2:
			c = rune(r.IntN(0x10000))
		default:
			c = rune(0x10000 + r.IntN(0x100000))
		}
		if c >= 0xD800 && c <= 0xDFFF {
			continue
		}
		return c
	}
}
