package chat

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Parse-time bounds on template text. A chat template comes from a model file, so it is outside
// input: these keep the engine's recursive-descent parser and evaluator far from the Go stack limit
// (a Go stack overflow is a fatal error, not a recoverable panic). Real templates are far below
// them: the largest in llama.cpp's collection is 17 KB, nests blocks 12 deep and brackets 6 deep.
const (
	// MaxTemplateBytes is the largest template source Parse accepts.
	MaxTemplateBytes = 1 << 20
	// maxBlockDepth bounds the nesting of block statements (if, for, macro, ...).
	maxBlockDepth = 256
	// maxBracketDepth bounds the nesting of (), [] and {} inside one tag.
	maxBracketDepth = 128
	// maxTagTokens bounds the tokens of one tag (string literals count as one): it bounds chains
	// the parser handles by recursion (a if b else c if d else ..., not not ..., - - ...).
	maxTagTokens = 20000
	// maxTagRunCost bounds the sum over runs of tags with no text between them of the run's length
	// squared. The engine's whitespace pass looks for the nearest text from every tag, which costs
	// that much: 200,000 adjacent {# #} comments (1 MB) would take minutes. Real templates stay
	// under 400.
	maxTagRunCost = 1 << 20
)

// Names of the per-render guard callables the rewritten template calls. A template that mentions
// the prefix itself is rejected, so it cannot shadow or disable them.
const (
	guardPrefix   = "__chat_guard_"
	guardLoop     = guardPrefix + "loop"
	guardEnter    = guardPrefix + "enter"
	guardExit     = guardPrefix + "exit"
	guardLoopTag  = "{{ " + guardLoop + "() }}"
	guardEnterTag = "{{ " + guardEnter + "() }}"
	guardExitTag  = "{{ " + guardExit + "() }}"
)

// segKind is the kind of a scanned piece of template text.
type segKind int

const (
	segText segKind = iota
	segExpr
	segStmt
	segComment
)

// segment is one piece of template text: raw text or one tag. start/end delimit the whole piece in
// the source (tags include their delimiters); for a tag, bodyStart/bodyEnd delimit its content
// without the delimiters and trim markers.
type segment struct {
	kind               segKind
	start, end         int
	bodyStart, bodyEnd int
}

// scanSegments splits src into text and tags the way github.com/ardanlabs/jinja's scanner does
// (same tag openers, same quote skipping inside expression and statement tags, same trim-marker
// detection) with one difference that Jinja and @huggingface/jinja share: in an expression tag,
// "}}" closes the tag only outside braces, so {{ {'a': {'b': 1}} }} is one tag. rewrite then
// splits such inner "}}" so that the engine segments the rewritten text like this.
func scanSegments(src string) ([]segment, error) {
	var segs []segment
	textStart := 0
	i := 0
	for i < len(src) {
		if src[i] != '{' || i+1 >= len(src) {
			i++
			continue
		}
		var kind segKind
		var closer string
		switch src[i+1] {
		case '{':
			kind, closer = segExpr, "}}"
		case '%':
			kind, closer = segStmt, "%}"
		case '#':
			kind, closer = segComment, "#}"
		default:
			i++
			continue
		}
		if i > textStart {
			segs = append(segs, segment{kind: segText, start: textStart, end: i})
		}
		tagStart := i
		i += 2
		if i < len(src) && src[i] == '-' {
			i++
		}
		bodyStart := i
		found := false
		braces := 0
		for i < len(src) {
			ch := src[i]
			if kind != segComment && (ch == '\'' || ch == '"') {
				i = min(stringEnd(src, i)+1, len(src))
				continue
			}
			trim := 0 // the "-" trim marker before the closer
			if ch == '-' {
				trim = 1
			}
			if braces == 0 && strings.HasPrefix(src[i+trim:], closer) {
				end := i + trim + len(closer)
				segs = append(segs, segment{kind: kind, start: tagStart, end: end, bodyStart: bodyStart, bodyEnd: i})
				i = end
				found = true
				break
			}
			if kind == segExpr {
				switch {
				case ch == '{':
					braces++
				case ch == '}' && braces > 0:
					braces--
				}
			}
			i++
		}
		if !found {
			return nil, fmt.Errorf("unclosed tag at byte %d", tagStart)
		}
		textStart = i
	}
	if textStart < len(src) {
		segs = append(segs, segment{kind: segText, start: textStart, end: len(src)})
	}
	return segs, nil
}

// stringEnd returns the index of the quote closing the string literal that
// opens at s[i] (a backslash escapes the next byte), or len(s) when the
// literal is not closed.
func stringEnd(s string, i int) int {
	q := s[i]
	for i++; i < len(s) && s[i] != q; i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
	}
	return i
}

// isIdent reports whether c may be part of a name or a number literal.
func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// keyword returns the statement keyword of a statement tag body, as the engine determines it.
func keyword(body string) string {
	body = strings.TrimSpace(body)
	for i, r := range body {
		if !unicode.IsLetter(r) && r != '_' {
			return body[:i]
		}
	}
	return body
}

// opensBlock reports whether a statement with this keyword and body starts a block that an end tag
// closes (used only to bound nesting depth).
func opensBlock(kw, body string) bool {
	switch kw {
	case "if", "for", "macro", "call", "filter", "raw", "generation":
		return true
	case "set":
		return !strings.Contains(body, "=")
	}
	return false
}

// exprPunct are the punctuation characters of Jinja expressions.
const exprPunct = "+-*/%<>=!~|.,:()[]{}"

// checkSyntax rejects tags the engine would accept with a made-up meaning although Jinja rejects
// them: an empty expression ({{ }}), a condition-less if/elif, a for without an iterable, a set
// without a value. (The engine reads the missing expression as none.)
func checkSyntax(kind segKind, kw, body string) error {
	body = strings.TrimSpace(body)
	switch {
	case kind == segExpr && body == "":
		return fmt.Errorf("empty expression {{ }}")
	case kind != segStmt:
	case (kw == "if" || kw == "elif") && strings.TrimSpace(body[len(kw):]) == "":
		return fmt.Errorf("%s without a condition", kw)
	case kw == "for" && (strings.HasSuffix(body, " in") || strings.HasSuffix(body, "\tin") || strings.HasSuffix(body, "\nin")):
		return fmt.Errorf("for without an iterable")
	case kw == "set" && strings.HasSuffix(body, "="):
		return fmt.Errorf("set without a value")
	}
	return nil
}

// checkTag bounds the bracket nesting and the token count of one tag body and rejects characters
// that are not part of Jinja's expression syntax.
func checkTag(body string) error {
	depth, tokens := 0, 0
	for i := 0; i < len(body); {
		if tokens > maxTagTokens {
			return fmt.Errorf("%w: a tag has more than %d tokens", ErrLimit, maxTagTokens)
		}
		ch := body[i]
		switch {
		case ch == '\'' || ch == '"':
			i = stringEnd(body, i) + 1
			tokens++
			continue
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r':
			i++
			continue
		case isIdent(ch):
			for i < len(body) && isIdent(body[i]) {
				i++
			}
			tokens++
			continue
		case !strings.ContainsRune(exprPunct, rune(ch)):
			// The engine's tokenizer skips characters it does not know; Jinja rejects them.
			return fmt.Errorf("unexpected character %q", firstRunes(body[i:], 1))
		case ch == '(' || ch == '[' || ch == '{':
			depth++
			if depth > maxBracketDepth {
				return fmt.Errorf("%w: brackets nested deeper than %d", ErrLimit, maxBracketDepth)
			}
		case ch == ')' || ch == ']' || ch == '}':
			depth--
		}
		tokens++
		i++
	}
	if tokens > maxTagTokens {
		return fmt.Errorf("%w: a tag has more than %d tokens", ErrLimit, maxTagTokens)
	}
	return nil
}

// rewrite checks src against the parse-time bounds and returns it instrumented with the guard
// calls: a loop-step guard at the start of every for-loop body, and a depth guard at the start and
// end of every macro body. The guards are expression tags that print nothing; the engine applies
// trim_blocks/lstrip_blocks and the "-" markers only to the nearest text, skipping expression tags
// without trim markers, so inserting them changes no output. Text inside {% raw %} is left alone.
func rewrite(src string) (string, error) {
	if len(src) > MaxTemplateBytes {
		return "", fmt.Errorf("%w: template is %d bytes, the limit is %d", ErrLimit, len(src), MaxTemplateBytes)
	}
	if strings.Contains(src, guardPrefix) {
		return "", fmt.Errorf("template uses the reserved name prefix %q", guardPrefix)
	}
	segs, err := scanSegments(src)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(len(src) + 256)
	depth, inRaw := 0, false
	run, runCost := 0, 0
	for _, s := range segs {
		if s.kind == segText {
			runCost += run * run
			run = 0
		} else {
			run += 2 // the tag and a possible guard next to it
		}
		if runCost+run*run > maxTagRunCost {
			return "", fmt.Errorf("%w: too many tags without text between them", ErrLimit)
		}
		body := src[s.bodyStart:s.bodyEnd]
		if (s.kind == segExpr || s.kind == segStmt) && !inRaw {
			if err := checkTag(body); err != nil {
				return "", err
			}
			if err := checkSyntax(s.kind, keyword(body), body); err != nil {
				return "", err
			}
		}
		if s.kind != segStmt && (s.kind != segExpr || inRaw) {
			b.WriteString(src[s.start:s.end])
			continue
		}
		nb := rewriteTag(body)
		if strings.HasSuffix(nb, "}") && s.kind == segExpr {
			nb += " " // {{ {'a': 1}}} must not end at the dict's brace
		}
		tag := src[s.start:s.bodyStart] + nb + src[s.bodyEnd:s.end]
		if s.kind == segExpr {
			b.WriteString(tag)
			continue
		}
		kw := keyword(body)
		if inRaw {
			if kw == "endraw" {
				inRaw = false
				depth--
			}
			b.WriteString(src[s.start:s.end])
			continue
		}
		switch {
		case opensBlock(kw, body):
			depth++
			if depth > maxBlockDepth {
				return "", fmt.Errorf("%w: blocks nested deeper than %d", ErrLimit, maxBlockDepth)
			}
		case strings.HasPrefix(kw, "end"):
			depth--
		}
		if kw == "endmacro" {
			b.WriteString(guardExitTag)
		}
		b.WriteString(tag)
		switch kw {
		case "for":
			b.WriteString(guardLoopTag)
		case "macro":
			b.WriteString(guardEnterTag)
		case "raw":
			inRaw = true
		}
	}
	return b.String(), nil
}

// replacedFilters are the filters Render provides itself (see tojson.go), by their engine names.
var replacedFilters = map[string]string{"tojson": guardToJSON, "indent": guardIndent}

// rewriteTag rewrites one tag's content, outside string literals: "| name" becomes
// "| replacement" for the replaced filters (the engine looks a filter name up among its own filters
// first and then among the variables, where Render puts the replacement), and "}}" becomes "} }"
// (see scanSegments). Inside string literals, the escapes the engine does not know are decoded
// (see decodeEscapes).
func rewriteTag(body string) string {
	var b strings.Builder
	b.Grow(len(body) + 16)
	for i := 0; i < len(body); i++ {
		ch := body[i]
		switch {
		case ch == '\'' || ch == '"':
			j := stringEnd(body, i)
			b.WriteByte(ch)
			b.WriteString(decodeEscapes(body[i+1:j], ch))
			if j < len(body) {
				b.WriteByte(ch)
			}
			i = j
		case ch == '}' && i+1 < len(body) && body[i+1] == '}':
			b.WriteString("} ")
		case ch == '|':
			j := i + 1
			for j < len(body) && (body[j] == ' ' || body[j] == '\t' || body[j] == '\n' || body[j] == '\r') {
				j++
			}
			k := j
			for k < len(body) && isIdent(body[k]) {
				k++
			}
			b.WriteString(body[i:j])
			if repl, ok := replacedFilters[body[j:k]]; ok {
				b.WriteString(repl)
			} else {
				b.WriteString(body[j:k])
			}
			i = k - 1
		default:
			b.WriteByte(ch)
		}
	}
	return b.String()
}

// simpleEscapes are the one-letter escapes decodeEscapes decodes.
var simpleEscapes = map[byte]rune{'r': '\r', 'b': '\b', 'f': '\f', 'v': '\v', 'a': '\a'}

// decodeEscapes rewrites the body of a string literal quoted with quote so that the engine, which
// knows only \n \t \\ \' \", reads it as Jinja (Python) and @huggingface/jinja do: \r \b \f \v
// \a \xHH \uHHHH (UTF-16 pairs joined) and \UHHHHHHHH become the characters themselves (a quote or
// backslash produced this way stays escaped). Other escapes are left to the engine.
func decodeEscapes(lit string, quote byte) string {
	if !strings.Contains(lit, "\\") {
		return lit
	}
	var b strings.Builder
	b.Grow(len(lit))
	put := func(r rune) {
		switch r {
		case '\\':
			b.WriteString(`\\`)
		case rune(quote):
			b.WriteByte('\\')
			b.WriteByte(quote)
		case '\n':
			b.WriteString(`\n`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteRune(r)
		}
	}
	for i := 0; i < len(lit); i++ {
		if lit[i] != '\\' || i+1 >= len(lit) {
			b.WriteByte(lit[i])
			continue
		}
		c := lit[i+1]
		if r, ok := simpleEscapes[c]; ok {
			put(r)
			i++
			continue
		}
		n := 0
		switch c {
		case 'x':
			n = 2
		case 'u':
			n = 4
		case 'U':
			n = 8
		}
		r, ok := hexAt(lit, i+2, n)
		if !ok {
			b.WriteString(lit[i : i+2])
			i++
			continue
		}
		i += 1 + n
		if c == 'u' && utf16.IsSurrogate(r) && strings.HasPrefix(lit[i+1:], "\\u") {
			if lo, ok := hexAt(lit, i+3, 4); ok {
				if pair := utf16.DecodeRune(r, lo); pair != utf8.RuneError {
					r = pair
					i += 6
				}
			}
		}
		if !utf8.ValidRune(r) {
			r = utf8.RuneError
		}
		put(r)
	}
	return b.String()
}

// hexAt parses the n hex digits at s[i:]; false when n is 0, they run past
// the end of s or are not hex digits.
func hexAt(s string, i, n int) (rune, bool) {
	if n == 0 || i+n > len(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(s[i:i+n], 16, 32)
	return rune(v), err == nil
}
