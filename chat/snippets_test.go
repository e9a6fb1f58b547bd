package chat

import (
	"encoding/json"
	"errors"
	"testing"
)

// snippet is a small template checked against @huggingface/jinja.
type snippet struct {
	name  string
	src   string
	extra map[string]any
}

var snippetMessages = []Message{
	{Role: "system", Content: "Sys tem"},
	{Role: "user", Content: "Hi  there"},
	{Role: "tool", Content: "42", ToolCallID: "call_9", Name: "calc"},
}

// matchingSnippets exercise the features chat templates use; each must render exactly as
// @huggingface/jinja renders it. Several cover the fix-ups this package applies around the engine.
var matchingSnippets = []snippet{
	{"trailing newline dropped", "a{{ 'b' }}\n", nil},
	{"only one trailing newline dropped", "a\n\n", nil},
	{"trim_blocks and lstrip_blocks", "a\n  {% if true %}\n  b\n  {% endif %}\nc\n  {{ 'd' }}\n  {# c #}\ne\n", nil},
	{"trim markers", "a  {%- if true -%}  b  {%- endif -%}  c {{- 'd' -}} e {#- x -#} f", nil},
	{"generation tag", "{% generation %}x{% endgeneration %}y", nil},
	{"string escapes", `{{ 'a\nb\t\'c\"' }}|{{ "it's" }}|{{ '\u00e9\u4e2d' }}|{{ '\x41' }}|{{ 'cr\rlf' }}|{{ '\ud83c\udf89' }}|{{ '\u0027' }}`, nil},
	{"nested braces in an expression", `{{ {'a': {'b': 1}} | tojson }}|{{ {'x': [1, {'y': 'z'}]}|tojson }}|{{ 'x' if {'a': 1}}}|{{- 'y' if {'b': 2} -}}|{% set d = {'c': {'d': 3}} %}{{ d.c.d }}`, nil},
	{"tojson default", `{{ [1, 'a', none, true] | tojson }}|{{ {'b': 'é"<\n', 'a': [1, 2.5]} | tojson }}`, nil},
	{"tojson indent", `{{ {'b': {'c': [1, 2]}, 'a': [], 'd': {}} | tojson(indent=2) }}`, nil},
	{"tojson ensure_ascii", `{{ {'k': 'é日🎉'} | tojson(ensure_ascii=True) }}|{{ 'é' | tojson(ensure_ascii=false) }}`, nil},
	{"tojson sort_keys and separators", `{{ {'b': 1, 'a': [1, 2]} | tojson(sort_keys=true) }}|{{ {'b': 1, 'a': [1, 2]} | tojson(separators=(',', ':')) }}`, nil},
	{"tojson of messages keeps key order", `{{ messages | tojson }}`, nil},
	{"tojson of a JSON variable keeps key order", `{{ tools | tojson }}|{% for t in tools %}{{ t.function.name }}:{{ t.function.parameters | tojson(indent=4) }}{% endfor %}`,
		map[string]any{"tools": toolsJSON}},
	{"message fields", `{% for m in messages %}[{{ m.role }}|{{ m['content'] }}|{{ m.tool_call_id }}|{{ m.name }}|{{ 1 if m.tool_calls is defined else 0 }}]{% endfor %}`, nil},
	{"arithmetic", `{{ 7 // 2 }}|{{ 2 ** 3 }}|{{ 1 / 2 }}|{{ 10 / 4 }}|{{ 7 % 3 }}|{{ 3 - 5 }}`, nil},
	{"string methods", `[{{ '  a b  '.strip() }}][{{ 'a,b,,c'.split(',') | join('|') }}][{{ 'hello wORLD'.title() }}][{{ 'A B'.lower() }}{{ 'abc'.upper() }}][{{ 'a-b'.replace('-', '+') }}][{{ 1 if 'abc'.startswith('a') else 0 }}{{ 1 if 'abc'.endswith('c') else 0 }}]`, nil},
	{"filters", `{{ '  x \n' | trim }}|{{ 'hello world' | title }}|{{ [3, 1, 2] | sort | join(',') }}|{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ [1, 2] | first }}{{ [1, 2] | last }}|{{ [1, 2, 3] | reverse | join }}|{{ [1, 1, 2] | unique | join }}|{{ none | default('d') }}{{ x | default('e') }}`, nil},
	{"slices", `{{ 'abc'[::-1] }}|{{ messages[1:] | length }}|{{ 'héllo'[1:3] }}|{{ [1, 2, 3, 4][::2] | join }}|{{ 'abc'[-1] }}|{{ messages[-1].role }}`, nil},
	{"namespace", `{% set ns = namespace(found=false, n=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}{{ 1 if ns.found else 0 }}{{ ns.n }}`, nil},
	{"in and tests", `{% for c in ['x' in 'xyz', 'a' in {'a': 1}, 1 in [1, 2], 'q' not in 'abc', 'a' is string, x is defined, none is none, {} is mapping, 1 is number, 3 is odd, 'a' == 'a', 1 != 1] %}{{ 1 if c else 0 }}{% endfor %}`, nil},
	{"macros", `{% macro m(a, b='d') %}[{{ a }}-{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(a=3, b=4) }}{{ m(5, b=6) }}`, nil},
	{"recursive macro", `{% macro walk(x) %}{% if x is mapping %}{{ '{' }}{% for k, v in x.items() %}{{ k }}:{{ walk(v) }};{% endfor %}{{ '}' }}{% else %}{{ x }}{% endif %}{% endmacro %}{{ walk({'a': {'b': {'c': 1}}, 'd': 2}) }}`, nil},
	{"loops", `{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ 1 if loop.first else 0 }}{{ 1 if loop.last else 0 }}{{ loop.length }}{{ loop.revindex }};{% endfor %}|{% for x in [1, 0, 2] if x %}{{ x }}{% else %}empty{% endfor %}|{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}`, nil},
	{"dict iteration", `{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}={{ v }};{% endfor %}{{ {'a': 1}.get('a', 'd') }}{{ {'a': 1}.get('b', 'd') }}`, nil},
	{"indent", `[{{ 'a\nb\n\nc' | indent }}][{{ 'a\nb' | indent(2) }}][{{ 'a\nb' | indent(2, true) }}][{{ 'a\n\nb' | indent(width=3, first=true, blank=true) }}]`, nil},
	{"range", `{{ range(3) | join(',') }}|{{ range(1, 5, 2) | join(',') }}|{{ range(5, 1, -2) | join(',') }}|{{ range(0) | length }}`, nil},
	{"set block and filter block", `{% set x %}inner {{ 1 }}{% endset %}[{{ x }}]{% filter upper %}abc{% endfilter %}`, nil},
	{"boolean logic", `{{ 'a' == 'a' and 1 or 2 }}|{{ none or 'x' }}|{{ 0 and 'y' }}|{{ [] or 'z' }}|{{ 'a' if false }}|{{ 'a' if true else 'b' }}`, nil},
	{"strftime_now", `{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M') }}|{{ strftime_now('%B %d, %Y %%') }}`, nil},
	{"raise_exception", `{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok`, nil},
	{"undefined is empty", `[{{ undefinedvar }}][{{ undefinedvar.attr }}][{{ messages[10] }}]`, nil},
}

// difference is a construct where this package and @huggingface/jinja knowingly differ.
type difference struct {
	snippet
	wantGo, wantRef string
	why             string
}

// knownDifferences pins down every difference the package documents (doc.go): wantGo is what
// Render gives, wantRef what @huggingface/jinja gives. Where they differ from Python Jinja (what
// transformers uses, so what the model was trained on), why says so.
var knownDifferences = []difference{
	{snippet{"booleans print like Python", `{{ true }}|{{ 1 == 1 }}`, nil}, "True|True", "true|true",
		"Python prints True; @huggingface/jinja prints JavaScript's true"},
	{snippet{"lists and dicts print like Python", `{{ [1, 'a', none] }}|{{ {'a': 'b'} }}`, nil}, "[1, 'a', None]|{'a': 'b'}", `[1, "a", null]|{"a": "b"}`,
		"Python prints repr(); @huggingface/jinja prints JSON"},
	{snippet{"strip with characters", `[{{ '  x\n'.lstrip('\n') }}][{{ 'xxaxx'.strip('x') }}][{{ 'abc '.rstrip('c') }}]`, nil}, "[  x\n][a][abc ]", "[x\n][xxaxx][abc]",
		"@huggingface/jinja ignores the characters argument of strip/lstrip/rstrip and strips whitespace; Go follows Python"},
	{snippet{"integral float in tojson", `{{ floats | tojson }}`, map[string]any{"floats": json.RawMessage(`[1.0, 2.5, 1e-7]`)}}, "[1.0, 2.5, 1e-07]", "[1, 2.5, 1e-7]",
		"tojson formats floats like Python's json.dumps; JavaScript numbers print 1.0 as 1"},
	{snippet{"float printing", `{{ 1.0 }}|{{ 12345678.9 }}`, nil}, "1|1.23456789e+07", "1.0|12345678.9",
		"engine limitation: {{ float }} prints Go's shortest %g form (Python prints 1.0 and 12345678.9 too)"},
	{snippet{"raw block", "x {% raw %}{{ not rendered }} {% for x in y %}{% endraw %}|{{ 1 }}", nil}, "x {{ not rendered }} {% for x in y %}|1", "error",
		"@huggingface/jinja has no {% raw %}; Go renders it like Python"},
	{snippet{"tuple assignment", `{% set a, b = 1, 2 %}{{ a }}{{ b }}`, nil}, "error", "12",
		"engine limitation: {% set a, b = ... %} does not compile"},
	{snippet{"lenient where @huggingface/jinja throws", `{{ 'x' * 3 }}|{{ 'a' < 'b' }}|{{ '%s' | format(1) }}`, nil}, "error", "error",
		"both fail here, but Go renders 'x' * 3 and 'a' < 'b' like Python"},
}

func TestSnippetsMatchHuggingFaceJinja(t *testing.T) {
	var cases []refCase
	add := func(s snippet) {
		cases = append(cases, refCase{Template: s.src, Messages: snippetMessages,
			Opts: Options{BOS: "<s>", EOS: "</s>", Now: fixedNow, Extra: s.extra}})
	}
	for _, s := range matchingSnippets {
		add(s)
	}
	for _, d := range knownDifferences {
		add(d.snippet)
	}
	ref := renderRef(t, cases)

	render := func(c refCase) string {
		tm, err := Parse(c.Template)
		if err != nil {
			return "error"
		}
		out, err := tm.Render(c.Messages, c.Opts)
		if err != nil {
			var re *RaiseError
			if errors.As(err, &re) {
				return "raise: " + re.Message
			}
			return "error"
		}
		return out
	}
	refText := func(r refResult) string {
		if r.Error != nil {
			if *r.Error == "System role not supported" {
				return "raise: " + *r.Error
			}
			return "error"
		}
		return *r.Output
	}
	for i, s := range matchingSnippets {
		t.Run(s.name, func(t *testing.T) {
			got, want := render(cases[i]), refText(ref[i])
			if got != want {
				t.Errorf("template %q\n go: %q\nref: %q", s.src, got, want)
			}
		})
	}
	for j, d := range knownDifferences {
		i := len(matchingSnippets) + j
		t.Run("difference/"+d.name, func(t *testing.T) {
			if got := render(cases[i]); got != d.wantGo {
				t.Errorf("template %q: go %q, want %q", d.src, got, d.wantGo)
			}
			if got := refText(ref[i]); got != d.wantRef {
				t.Errorf("template %q: @huggingface/jinja %q, documented %q (%s)", d.src, got, d.wantRef, d.why)
			}
		})
	}
}
