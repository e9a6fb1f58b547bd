package chat

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// The engine's tojson filter sorts keys and escapes HTML when indenting and ignores ensure_ascii,
// sort_keys and separators; filters cannot be replaced through variables, so Parse renames the
// filter in the template text (| tojson → | guardToJSON) and Render provides this implementation:
// transformers' tojson, i.e. Python's json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), which @huggingface/jinja follows too.
const guardToJSON = guardPrefix + "tojson"

// toJSONOptions are tojson's keyword arguments.
type toJSONOptions struct {
	indent      int // < 0: no indent
	ensureASCII bool
	sortKeys    bool
	itemSep     string
	keySep      string
}

// filterToJSON is the tojson filter: args[0] is the value; keyword arguments indent, ensure_ascii,
// sort_keys, separators.
func filterToJSON(args []jinja.Value, kw map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Undefined(), errors.New("tojson: takes keyword arguments only")
	}
	o := toJSONOptions{indent: -1}
	sepSet := false
	for k, v := range kw {
		switch k {
		case "indent":
			switch {
			case v.IsNone() || v.IsUndefined():
			case v.IsInt() && v.AsInt() >= 0 && v.AsInt() <= 64:
				o.indent = int(v.AsInt())
			default:
				return jinja.Undefined(), errors.New("tojson: indent must be an integer from 0 to 64")
			}
		case "ensure_ascii", "sort_keys":
			if !v.IsBool() {
				return jinja.Undefined(), fmt.Errorf("tojson: %s must be a boolean", k)
			}
			if k == "ensure_ascii" {
				o.ensureASCII = v.AsBool()
			} else {
				o.sortKeys = v.AsBool()
			}
		case "separators":
			if v.IsNone() || v.IsUndefined() {
				continue
			}
			if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
				return jinja.Undefined(), errors.New("tojson: separators must be two strings")
			}
			o.itemSep, o.keySep = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
			sepSet = true
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: unknown argument %q", k)
		}
	}
	if !sepSet {
		o.itemSep, o.keySep = ", ", ": "
		if o.indent >= 0 {
			o.itemSep = ","
		}
	}
	var b strings.Builder
	if err := writeJSON(&b, args[0], &o, 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(b.String()), nil
}

func writeJSON(b *strings.Builder, v jinja.Value, o *toJSONOptions, depth int) error {
	if depth > maxValueDepth {
		return fmt.Errorf("tojson: nested deeper than %d (a value that contains itself?)", maxValueDepth)
	}
	switch {
	case v.IsUndefined() || v.IsNone():
		b.WriteString("null")
	case v.IsBool():
		b.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		writeJSONString(b, v.AsString(), o.ensureASCII)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(b, o, depth+1)
			if err := writeJSON(b, it, o, depth+1); err != nil {
				return err
			}
		}
		newline(b, o, depth)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if len(d.Keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = slices.Clone(keys)
			slices.Sort(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(b, o, depth+1)
			writeJSONString(b, k, o.ensureASCII)
			b.WriteString(o.keySep)
			if err := writeJSON(b, d.Data[k], o, depth+1); err != nil {
				return err
			}
		}
		newline(b, o, depth)
		b.WriteByte('}')
	default:
		return errors.New("tojson: a function cannot be converted to JSON")
	}
	return nil
}

// newline starts a new indented line when indenting.
func newline(b *strings.Builder, o *toJSONOptions, depth int) {
	if o.indent < 0 {
		return
	}
	b.WriteByte('\n')
	for range depth * o.indent {
		b.WriteByte(' ')
	}
}

// writeJSONString writes s as a JSON string the way Python's json.dumps does: escapes for " \ and
// control characters (\n \r \t \b \f, others \u00XX), everything else as is, or as \uXXXX (UTF-16,
// lower-case hex) when ensureASCII. Invalid UTF-8 becomes U+FFFD.
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	const hex = "0123456789abcdef"
	u4 := func(r rune) {
		b.WriteString(`\u`)
		b.WriteByte(hex[r>>12&0xf])
		b.WriteByte(hex[r>>8&0xf])
		b.WriteByte(hex[r>>4&0xf])
		b.WriteByte(hex[r&0xf])
	}
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20:
			u4(r)
		case r < utf8.RuneSelf:
			b.WriteByte(byte(r))
		case !ensureASCII:
			b.WriteRune(r)
		case r > 0xffff:
			r -= 0x10000
			u4(0xd800 + r>>10)
			u4(0xdc00 + r&0x3ff)
		default:
			u4(r)
		}
	}
	b.WriteByte('"')
}

// pyFloat formats f as Python's repr(float): the shortest text that reads back as f, with ".0" on
// integral values and an exponent (at least two digits) below 1e-4 and from 1e16 up.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d[.ddd]e±XX
	mant, exp, _ := strings.Cut(e, "e")
	x, _ := strconv.Atoi(exp)
	if x < -4 || x >= 16 {
		sign := "+"
		if x < 0 {
			sign, x = "-", -x
		}
		return fmt.Sprintf("%se%s%02d", mant, sign, x)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// guardIndent is the name Parse gives the indent filter (see replacedFilters): the engine's indent
// repeats a space width times with no bound.
const guardIndent = guardPrefix + "indent"

// maxIndentWidth bounds indent's width.
const maxIndentWidth = 1024

// filterIndent is Jinja's indent(width=4, first=False, blank=False): every line but the first
// (unless first) and the empty ones (unless blank) gets width spaces, or the width string, in
// front. Lines are split at "\n", as @huggingface/jinja does.
func filterIndent(args []jinja.Value, kw map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 || len(args) > 4 {
		return jinja.Undefined(), errors.New("indent: takes up to 3 arguments")
	}
	param := func(i int, name string) (jinja.Value, bool) {
		if i < len(args) {
			return args[i], true
		}
		v, ok := kw[name]
		return v, ok
	}
	pad := "    "
	if w, ok := param(1, "width"); ok {
		switch {
		case w.IsString() && len(w.AsString()) <= maxIndentWidth:
			pad = w.AsString()
		case w.IsInt() && w.AsInt() >= 0 && w.AsInt() <= maxIndentWidth:
			pad = strings.Repeat(" ", int(w.AsInt()))
		default:
			return jinja.Undefined(), fmt.Errorf("indent: width must be a string or an integer from 0 to %d", maxIndentWidth)
		}
	}
	first, _ := param(2, "first")
	blank, _ := param(3, "blank")
	s := args[0]
	if !s.IsString() {
		return jinja.Undefined(), errors.New("indent: expects a string")
	}
	lines := strings.Split(s.AsString(), "\n")
	for i, l := range lines {
		if (i == 0 && !first.IsTruthy()) || (l == "" && !blank.IsTruthy()) {
			continue
		}
		lines[i] = pad + l
	}
	return jinja.NewString(strings.Join(lines, "\n")), nil
}
