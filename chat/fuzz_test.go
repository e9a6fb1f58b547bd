package chat

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// fuzzSeeds are starting templates: real ones and hostile ones.
func fuzzSeeds(f *testing.F) []string {
	seeds := []string{
		smolLM2Template,
		templateFile(f, "meta-llama-Llama-3.1-8B-Instruct"),
		templateFile(f, "google-gemma-2-2b-it"),
		templateFile(f, "microsoft-Phi-3.5-mini-instruct"),
		templateFile(f, "mistralai-Mistral-Nemo-Instruct-2407"),
		"{% for i in range(1000000000) %}x{% endfor %}",
		"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
		"{{ {'a': {'b': [1, 2, {'c': '\\u00e9'}]}} | tojson(indent=2) }}",
		"{% raw %}{{ x }}{% endraw %}{{ '\\x41' }}",
		"{%- if messages[0].role == 'system' -%}{{ raise_exception('no') }}{%- endif -%}",
		"{{ strftime_now('%d %b %Y') }}{{ namespace(a=1).a }}",
		"{% filter upper %}{% call m() %}x{% endcall %}{% endfilter %}",
	}
	return seeds
}

// FuzzParse: Parse of arbitrary text returns a template or an ErrParse error, never panics, hangs
// or runs out of stack.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		tm, err := Parse(src)
		if err != nil {
			if tm != nil || !errors.Is(err, ErrParse) {
				t.Fatalf("Parse error %v (template %v): want only an ErrParse error", err, tm != nil)
			}
			return
		}
		if tm.Source() != src {
			t.Fatal("Source differs from the input")
		}
	})
}

// renderGaps are the constructs whose cost the engine gives no hook to bound (see doc.go, "Limits
// and gaps"): string repetition (*), list/dict mutation (a value that contains itself overflows the
// Go stack when printed), string methods whose output outgrows their input (chained replace or
// format grow exponentially), and variables (set, macro and call arguments: a string that doubles
// per assignment). FuzzRender leaves templates containing them to FuzzParse.
var renderGaps = []string{"*", "append", "insert", "update", "extend", "pop", "setdefault", "replace", "format", "set", "macro", "call"}

// FuzzRender: a template that parses renders (or fails with a package error) within small limits,
// in bounded time, never panicking or overflowing the stack.
func FuzzRender(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s, "hello", true)
	}
	f.Fuzz(func(t *testing.T, src, content string, agp bool) {
		for _, g := range renderGaps {
			if strings.Contains(src, g) {
				return
			}
		}
		tm, err := Parse(src)
		if err != nil {
			return
		}
		msgs := []Message{{Role: "system", Content: "sys"}, {Role: "user", Content: content}, {Role: "assistant", Content: "a"}, {Role: "user", Content: content}}
		o := Options{BOS: "<s>", EOS: "</s>", AddGenerationPrompt: agp, Now: fixedNow,
			Limits: Limits{MaxLoopIterations: 10000, MaxMacroDepth: 20, MaxRange: 1000, MaxOutputBytes: 1 << 20}}
		start := time.Now()
		out, err := tm.Render(msgs, o)
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("render took %v", d)
		}
		if err != nil {
			if !errors.Is(err, ErrRender) && !errors.Is(err, ErrRaised) && !errors.Is(err, ErrLimit) {
				t.Fatalf("render error %v wraps no package error", err)
			}
			return
		}
		if len(out) > o.Limits.MaxOutputBytes {
			t.Fatalf("output of %d bytes over the limit", len(out))
		}
	})
}
