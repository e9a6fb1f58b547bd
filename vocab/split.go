package vocab

import "slices"

// The pre-tokenizers: each splits a text (as codepoints) into words, the way
// llama.cpp's unicode_regex_split does with the regexes of a pre-tokenizer
// type. A pre-tokenizer is a list of splitters applied in turn, each to
// every segment the previous ones produced. The custom splitters port
// unicode.cpp's hand-written implementations of the GPT-2, Llama 3, Qwen2
// and Qwen3.5 regexes; the class splitters reproduce what std::regex does
// with the simple regexes llama.cpp runs on its "collapsed" text (every
// codepoint above 127 replaced by a byte naming its category).

// splitter cuts the segment cpts[ini:end] into words, appending their
// lengths (in codepoints) to out.
type splitter func(cpts []uint32, flags []uint16, ini, end int, out []int) []int

// split applies the splitter chain to the codepoints (with their flags):
// each splitter cuts every segment the previous ones produced. It returns
// the word lengths in segs, spare being a second buffer.
func split(chain []splitter, cpts []uint32, flags []uint16, segs, spare []int) ([]int, []int) {
	segs = append(segs[:0], len(cpts))
	for _, sp := range chain {
		out, start := spare[:0], 0
		for _, seg := range segs {
			out = sp(cpts, flags, start, start+seg, out)
			start += seg
		}
		segs, spare = out, segs
	}
	return segs, spare
}

// segmenter runs the add-token bookkeeping of llama.cpp's custom splitters
// for one segment.
type segmenter struct {
	cpts    []uint32
	flags   []uint16
	end     int
	prevEnd int
	out     []int
}

func (s *segmenter) cpt(pos int) uint32 {
	if pos < s.end {
		return s.cpts[pos]
	}
	return outOfRange
}

func (s *segmenter) fl(pos int) uint16 {
	if pos < s.end {
		return s.flags[pos]
	}
	return 0
}

// contraction returns the length of the contraction ('s 't 're 've 'm 'll
// 'd) at pos, 0 if none; fold maps the letters before they are compared.
func (s *segmenter) contraction(pos int, fold func(uint32) uint32) int {
	if s.cpt(pos) != '\'' || pos+1 >= s.end {
		return 0
	}
	n := fold(s.cpt(pos + 1))
	if n == 's' || n == 't' || n == 'm' || n == 'd' {
		return 2
	}
	if pos+2 < s.end {
		nn := fold(s.cpt(pos + 2))
		if (n == 'r' && nn == 'e') || (n == 'v' && nn == 'e') || (n == 'l' && nn == 'l') {
			return 3
		}
	}
	return 0
}

// endSpaces ends a piece with the regexes' common tail \s+(?!\S)|\s+ for
// the nws whitespace characters at pos (all but the last when a non-space
// follows) or, with none, the one character at pos, and returns the next
// position.
func (s *segmenter) endSpaces(pos, nws int) int {
	switch {
	case nws > 1 && s.cpt(pos+nws) != outOfRange:
		pos += nws - 1
	case nws > 0:
		pos += nws
	default:
		pos++
	}
	s.add(pos)
	return pos
}

// add ends a word at end and returns its length.
func (s *segmenter) add(end int) int {
	n := end - s.prevEnd
	if n > 0 {
		s.out = append(s.out, n)
	}
	s.prevEnd = end
	return n
}

// splitGPT2 is unicode_regex_split_custom_gpt2:
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func splitGPT2(cpts []uint32, flags []uint16, ini, end int, out []int) []int {
	s := segmenter{cpts: cpts, flags: flags, end: end, prevEnd: ini, out: out}
	for pos := ini; pos < end; {
		if n := s.contraction(pos, func(c uint32) uint32 { return c }); n > 0 {
			pos += s.add(pos + n)
			continue
		}
		c := s.cpt(pos)
		f := s.fl(pos)
		if c == ' ' {
			f = s.fl(pos + 1)
		}
		// ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+
		var in func(f uint16) bool
		switch {
		case f&fLetter != 0:
			in = func(f uint16) bool { return f&fLetter != 0 }
		case f&fNumber != 0:
			in = func(f uint16) bool { return f&fNumber != 0 }
		case f&(fWhitespace|fLetter|fNumber) == 0 && f != 0:
			in = func(f uint16) bool { return f&(fWhitespace|fLetter|fNumber) == 0 && f != 0 }
		}
		if in != nil {
			if c == ' ' {
				pos++
			}
			for in(s.fl(pos)) {
				pos++
			}
			s.add(pos)
			continue
		}
		nws := 0
		for s.fl(pos+nws)&fWhitespace != 0 {
			nws++
		}
		pos = s.endSpaces(pos, nws)
	}
	return s.out
}

// splitLlama3Like ports unicode_regex_split_custom_llama3 (maxDigits 3),
// _qwen2 (maxDigits 1) and _qwen35 (maxDigits 1, marks: letter runs also
// take \p{M}):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func splitLlama3Like(maxDigits int, marks bool) splitter {
	letter := uint16(fLetter)
	if marks {
		letter |= fAccentMark
	}
	return func(cpts []uint32, flags []uint16, ini, end int, out []int) []int {
		s := segmenter{cpts: cpts, flags: flags, end: end, prevEnd: ini, out: out}
		for pos := ini; pos < end; {
			if n := s.contraction(pos, asciiLower); n > 0 {
				pos += s.add(pos + n)
				continue
			}
			c := s.cpt(pos)
			f := s.fl(pos)
			// [^\r\n\p{L}\p{N}]?\p{L}+
			if !(c == '\r' || c == '\n' || f&fNumber != 0) {
				if f&letter != 0 || s.fl(pos+1)&letter != 0 {
					pos++
					for s.fl(pos)&letter != 0 {
						pos++
					}
					s.add(pos)
					continue
				}
			}
			// \p{N}{1,3} or \p{N}
			if f&fNumber != 0 {
				if maxDigits == 1 {
					pos++
					s.add(pos)
					continue
				}
				ini := pos
				for s.fl(pos)&fNumber != 0 {
					pos++
					if pos-ini >= maxDigits {
						s.add(pos)
						ini = pos
					}
				}
				s.add(pos)
				continue
			}
			// <space>?[^\s\p{L}\p{N}]+[\r\n]*
			f2 := f
			if c == ' ' {
				f2 = s.fl(pos + 1)
			}
			if f2&(fWhitespace|letter|fNumber) == 0 && f != 0 {
				if c == ' ' {
					pos++
				}
				for f2&(fWhitespace|letter|fNumber) == 0 && f2 != 0 {
					pos++
					f2 = s.fl(pos)
				}
				c2 := s.cpt(pos)
				for c2 == '\r' || c2 == '\n' {
					pos++
					c2 = s.cpt(pos)
				}
				s.add(pos)
				continue
			}
			nws, lastRN := 0, 0
			for s.fl(pos+nws)&fWhitespace != 0 {
				c2 := s.cpt(pos + nws)
				if c2 == '\r' || c2 == '\n' {
					lastRN = pos + nws + 1
				}
				nws++
			}
			if lastRN > 0 {
				pos = lastRN
				s.add(pos)
				continue
			}
			pos = s.endSpaces(pos, nws)
		}
		return s.out
	}
}

// splitNewlines is unicode_regex_split_custom_newlines: [^\n]+|[\n]+
func splitNewlines(cpts []uint32, _ []uint16, pos, end int, out []int) []int {
	for pos < end {
		nl := cpts[pos] == '\n'
		run := pos
		for pos < end && (cpts[pos] == '\n') == nl {
			pos++
		}
		out = append(out, pos-run)
	}
	return out
}

// charClass reports whether a codepoint (with its flags) is in a character
// class of a regex llama.cpp runs through std::regex on its collapsed text.
type charClass func(c uint32, f uint16) bool

// collapsedCategory is what a codepoint of 128 or more stands for in
// llama.cpp's collapsed text: whitespace, else its category.
func collapsedCategory(f uint16) uint16 {
	if f&fWhitespace != 0 {
		return fWhitespace
	}
	return f & fCategories
}

// asciiPunct is the ASCII part of llama.cpp's collapsed \p{P}:
// !-#%-*,-/:-;?-@[-]_{}
func asciiPunct(c uint32) bool {
	switch {
	case c >= 0x21 && c <= 0x23, c >= 0x25 && c <= 0x2A, c >= 0x2C && c <= 0x2F,
		c >= 0x3A && c <= 0x3B, c >= 0x3F && c <= 0x40, c >= 0x5B && c <= 0x5D,
		c == 0x5F, c == 0x7B, c == 0x7D:
		return true
	}
	return false
}

// classPunct is [\p{P}\$\+<=>\^~\|] (plus ` when backtick is set).
func classPunct(backtick bool) charClass {
	return func(c uint32, f uint16) bool {
		if c < 128 {
			switch c {
			case '$', '+', '<', '=', '>', '^', '~', '|':
				return true
			case '`':
				return backtick
			}
			return asciiPunct(c)
		}
		return collapsedCategory(f) == fPunctuation
	}
}

// classNumber is \p{N}.
func classNumber(c uint32, f uint16) bool {
	if c < 128 {
		return c >= '0' && c <= '9'
	}
	return collapsedCategory(f) == fNumber
}

// splitClass splits like std::regex_iterator with the regex "[class]+"
// (runs) or "[class]" (single codepoints): every match is a word, and so is
// every gap between matches.
func splitClass(class charClass, runs bool) splitter {
	return func(cpts []uint32, flags []uint16, ini, end int, out []int) []int {
		last := ini // end of the last match
		for pos := ini; pos < end; {
			if !class(cpts[pos], flags[pos]) {
				pos++
				continue
			}
			if pos > last {
				out = append(out, pos-last)
			}
			m := pos
			pos++
			for runs && pos < end && class(cpts[pos], flags[pos]) {
				pos++
			}
			out = append(out, pos-m)
			last = pos
		}
		if last < end {
			out = append(out, end-last)
		}
		return out
	}
}

// splitDigits3 splits like std::regex_iterator with [0-9][0-9][0-9].
func splitDigits3(cpts []uint32, _ []uint16, ini, end int, out []int) []int {
	digit := func(c uint32) bool { return c >= '0' && c <= '9' }
	last := ini
	for pos := ini; pos+3 <= end; {
		if !(digit(cpts[pos]) && digit(cpts[pos+1]) && digit(cpts[pos+2])) {
			pos++
			continue
		}
		if pos > last {
			out = append(out, pos-last)
		}
		out = append(out, 3)
		pos += 3
		last = pos
	}
	if last < end {
		out = append(out, end-last)
	}
	return out
}

// preKind is a llama.cpp pre-tokenizer type (LLAMA_VOCAB_PRE_TYPE_*) that
// this package implements.
type preKind int

const (
	preDefault preKind = iota
	preLlama3
	preDBRX // and SMAUG: Llama 3's regex
	preChatGLM4
	preFalcon
	preStarcoder // STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA, MELLUM2
	preGPT2      // GPT2, MPT, OLMO, JAIS, TRILLION, GRANITE_DOCLING
	preQwen2     // QWEN2, STABLELM2, HUNYUAN, SOLAR_OPEN, GROK_2
	preQwen35
	preLaguna
)

// preInfo is what a tokenizer.ggml.pre name sets in llama.cpp's
// llama_vocab::impl::load.
type preInfo struct {
	kind         preKind
	ignoreMerges bool
	cleanSpaces  bool
	addBOS       bool // the default of add_bos before tokenizer.ggml.add_bos_token
	noBOS        bool // the default BOS id is none
}

// preTokenizers maps every supported tokenizer.ggml.pre value to its
// settings, as llama-vocab.cpp's chain of name comparisons.
var preTokenizers = func() map[string]preInfo {
	m := map[string]preInfo{}
	set := func(info preInfo, names ...string) {
		for _, n := range names {
			m[n] = info
		}
	}
	set(preInfo{kind: preDefault, cleanSpaces: true}, "", "default")
	set(preInfo{kind: preLlama3, ignoreMerges: true, cleanSpaces: true, addBOS: true},
		"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")
	set(preInfo{kind: preFalcon, cleanSpaces: true}, "falcon")
	set(preInfo{kind: preGPT2, cleanSpaces: true}, "mpt", "olmo", "jais", "exaone4",
		"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert",
		"jina-v1-en", "jina-v2-code", "roberta-bpe")
	set(preInfo{kind: preGPT2}, "trillion", "granite-docling")
	set(preInfo{kind: preStarcoder, cleanSpaces: true}, "starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2")
	set(preInfo{kind: preStarcoder}, "command-r", "smollm")
	set(preInfo{kind: preQwen2}, "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2")
	set(preInfo{kind: preQwen2, cleanSpaces: true}, "stablelm2", "megrez")
	set(preInfo{kind: preQwen35}, "qwen35")
	set(preInfo{kind: preLaguna}, "laguna")
	set(preInfo{kind: preDBRX, cleanSpaces: true}, "dbrx", "smaug-bpe")
	set(preInfo{kind: preChatGLM4, cleanSpaces: true, noBOS: true}, "glm4", "chatglm-bpe")
	return m
}()

// SupportedPre lists the tokenizer.ggml.pre values this package implements
// for the gpt2 model ("" means "default", as in llama.cpp), sorted.
func SupportedPre() []string {
	names := make([]string, 0, len(preTokenizers))
	for n := range preTokenizers {
		if n != "" {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// splitters returns the splitter chain of a pre-tokenizer kind (the
// regex_exprs of llm_tokenizer_bpe's constructor).
func (k preKind) splitters() []splitter {
	switch k {
	case preLlama3, preDBRX, preChatGLM4:
		return []splitter{splitLlama3Like(3, false)}
	case preQwen2:
		return []splitter{splitLlama3Like(1, false)}
	case preQwen35:
		return []splitter{splitLlama3Like(1, true)}
	case preLaguna:
		return []splitter{splitNewlines, splitLlama3Like(1, false)}
	case preGPT2:
		return []splitter{splitGPT2}
	case preStarcoder:
		return []splitter{splitClass(classNumber, false), splitGPT2}
	case preFalcon:
		return []splitter{splitClass(classPunct(true), true), splitGPT2, splitDigits3}
	default:
		return []splitter{splitClass(classPunct(false), true), splitGPT2, splitClass(classNumber, true), splitDigits3}
	}
}
