package chat

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func mustParse(t testing.TB, src string) *Template {
	t.Helper()
	tm, err := Parse(src)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return tm
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, src string
		limit     bool // also ErrLimit
	}{
		{"unclosed if", "{% if x %}a", false},
		{"unclosed expression", "{{ x", false},
		{"unclosed comment", "{# x", false},
		{"unclosed string", "{{ 'abc }}", false},
		{"for without in", "{% for %}{% endfor %}", false},
		{"for without iterable", "{% for x in %}{% endfor %}", false},
		{"stray endfor", "{% endfor %}", false},
		{"mismatched end", "{% if x %}{% endfor %}", false},
		{"unknown statement", "{% foo %}", false},
		{"dangling operator", "{{ 1 + }}", false},
		{"unbalanced paren", "{{ (1 }}", false},
		{"unbalanced bracket", "{{ [1, 2 }}", false},
		{"two expressions", "{{ a b }}", false},
		{"empty expression", "{{ }}", false},
		{"if without condition", "{% if %}{% endif %}", false},
		{"set without value", "{% set x = %}", false},
		{"unknown character", "{{ a ; b }}", false},
		{"non-ASCII outside strings", "{{ é }}", false},
		{"macro without parameters", "{% macro m %}{% endmacro %}", false},
		{"unclosed raw", "{% raw %}x", false},
		{"reserved name", "{{ " + guardLoop + "() }}", false},
		{"too large", strings.Repeat("a", MaxTemplateBytes+1), true},
		{"brackets too deep", "{{ " + strings.Repeat("(", maxBracketDepth+1) + "1" + strings.Repeat(")", maxBracketDepth+1) + " }}", true},
		{"blocks too deep", strings.Repeat("{% if true %}", maxBlockDepth+1) + strings.Repeat("{% endif %}", maxBlockDepth+1), true},
		{"tag too long", "{{ " + strings.Repeat("not ", maxTagTokens+1) + "x }}", true},
		{"adjacent comments", strings.Repeat("{#x#}", MaxTemplateBytes/5), true},
		{"adjacent statements", strings.Repeat("{% set x = 1 %}", MaxTemplateBytes/16), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			tm, err := Parse(tc.src)
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("Parse took %v", d)
			}
			if err == nil {
				t.Fatalf("Parse(%.40q) succeeded, want an error", tc.src)
			}
			if tm != nil {
				t.Error("Parse returned a template with its error")
			}
			if !errors.Is(err, ErrParse) {
				t.Errorf("error %v does not wrap ErrParse", err)
			}
			if got := errors.Is(err, ErrLimit); got != tc.limit {
				t.Errorf("errors.Is(err, ErrLimit) = %v, want %v (%v)", got, tc.limit, err)
			}
		})
	}
}

func TestParseAcceptsNearLimits(t *testing.T) {
	srcs := map[string]string{
		"deep brackets": "{{ " + strings.Repeat("(", maxBracketDepth) + "1" + strings.Repeat(")", maxBracketDepth) + " }}",
		"deep blocks":   strings.Repeat("{% if true %}", maxBlockDepth) + "x" + strings.Repeat("{% endif %}", maxBlockDepth),
		"1 MB":          "x" + strings.Repeat("\n{% if false %}y{% endif %}", (MaxTemplateBytes-1)/28),
	}
	for name, src := range srcs {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			out, err := mustParse(t, src).Render(nil, Options{})
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("Parse and Render took %v", d)
			}
			if err != nil || (out != "1" && strings.TrimRight(out, "\n") != "x") {
				t.Fatalf("Render = %q, %v", out, err)
			}
		})
	}
}

func TestRaiseException(t *testing.T) {
	gemma := mustParse(t, templateFile(t, "google-gemma-2-2b-it"))
	small := mustParse(t, `{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('No system role: ' ~ m.content) }}{% endif %}{{ m.content }}{% endfor %}`)
	tests := []struct {
		name string
		tm   *Template
		want string
	}{
		{"gemma-2 real template", gemma, "System role not supported"},
		{"message built by the template", small, "No system role: be brief"},
	}
	msgs := []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.tm.Render(msgs, Options{BOS: "<bos>"})
			if err == nil {
				t.Fatalf("Render succeeded with %q, want the template's exception", out)
			}
			if !errors.Is(err, ErrRaised) {
				t.Errorf("error %v does not wrap ErrRaised", err)
			}
			var re *RaiseError
			if !errors.As(err, &re) || re.Message != tc.want {
				t.Errorf("error %v: want RaiseError with message %q", err, tc.want)
			}
			if errors.Is(err, ErrRender) {
				t.Errorf("a raised exception also matches ErrRender: %v", err)
			}
			// Without the system message the same template renders.
			if _, err := tc.tm.Render(msgs[1:], Options{BOS: "<bos>"}); err != nil {
				t.Errorf("Render without system: %v", err)
			}
		})
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name, src string
		opts      Options
		want      error
	}{
		{"calling a non-function", `{{ messages[0].content.nosuchmethod() }}`, Options{}, ErrRender},
		{"range too long", `{% for i in range(1000000000) %}x{% endfor %}`, Options{}, ErrLimit},
		{"too many loop iterations", `{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`, Options{}, ErrLimit},
		{"infinite macro recursion", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, Options{}, ErrLimit},
		{"mutual macro recursion", `{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}`, Options{}, ErrLimit},
		{"output too large", `{% for i in range(100) %}0123456789{% endfor %}`, Options{Limits: Limits{MaxOutputBytes: 999}}, ErrLimit},
		{"custom iteration limit", `{% for i in range(11) %}{% endfor %}`, Options{Limits: Limits{MaxLoopIterations: 10}}, ErrLimit},
		{"custom macro depth", `{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}`, Options{Limits: Limits{MaxMacroDepth: 5}}, ErrLimit},
		{"reserved Extra name", `x`, Options{Extra: map[string]any{"messages": 1}}, ErrVariables},
		{"unsupported Extra type", `x`, Options{Extra: map[string]any{"f": func() {}}}, ErrVariables},
		{"bad JSON Extra", `x`, Options{Extra: map[string]any{"tools": json.RawMessage(`[1,`)}}, ErrVariables},
		{"self-containing Extra", `x`, Options{Extra: map[string]any{"m": selfMap()}}, ErrVariables},
		{"tojson of a self-containing list", `{% set a = [] %}{% set _ = a.append(a) %}{{ a | tojson }}`, Options{}, ErrRender},
		{"huge indent", `{{ 'a\nb' | indent(1000000000000) }}`, Options{}, ErrRender},
		{"negative string repeat", `{{ 'x' * -1 }}`, Options{}, ErrRender},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tm := mustParse(t, tc.src)
			start := time.Now()
			out, err := tm.Render([]Message{{Role: "user", Content: "hi"}}, tc.opts)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Render = %.60q, %v; want an error wrapping %v", out, err, tc.want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

func selfMap() map[string]any {
	m := map[string]any{}
	m["self"] = m
	return m
}

func TestLimitsAllowRecursionWithinDepth(t *testing.T) {
	tm := mustParse(t, `{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}`)
	out, err := tm.Render(nil, Options{Limits: Limits{MaxMacroDepth: 6}})
	if err != nil || out != "54321" {
		t.Fatalf("Render = %q, %v", out, err)
	}
	// Sequential calls do not accumulate depth.
	tm = mustParse(t, `{% macro g() %}.{% endmacro %}{% for i in range(50) %}{{ g() }}{% endfor %}`)
	out, err = tm.Render(nil, Options{Limits: Limits{MaxMacroDepth: 1}})
	if err != nil || out != strings.Repeat(".", 50) {
		t.Fatalf("Render = %q, %v", out, err)
	}
}

func TestExtraVariables(t *testing.T) {
	tm := mustParse(t, `{{ tools | tojson }}|{{ n }}|{{ u }}|{{ f }}|{{ flag }}|{{ names | join(',') }}|{{ cfg.b }}{{ cfg.a }}|{{ cfg | tojson }}|{{ p }}`)
	b := true
	out, err := tm.Render(nil, Options{Extra: map[string]any{
		"tools": json.RawMessage(`[{"z": 1, "a": {"y": null, "b": [true, 2.5, "s"]}}]`),
		"n":     int32(-7),
		"u":     uint8(200),
		"f":     float32(0.5),
		"flag":  "on",
		"names": []string{"x", "y"},
		"cfg":   map[string]int{"b": 2, "a": 1},
		"p":     &b,
	}})
	want := `[{"z": 1, "a": {"y": null, "b": [true, 2.5, "s"]}}]|-7|200|0.5|on|x,y|21|{"a": 1, "b": 2}|True`
	if err != nil || out != want {
		t.Fatalf("Render = %q, %v\nwant %q", out, err, want)
	}
}

func TestTemplateStateDoesNotLeakBetweenRenders(t *testing.T) {
	tm := mustParse(t, `{% set _ = messages.append({'role': 'x', 'content': 'y'}) %}{{ messages | length }}{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}`)
	msgs := []Message{{Role: "user", Content: "hi"}}
	for i := range 3 {
		out, err := tm.Render(msgs, Options{})
		if err != nil || out != "21" {
			t.Fatalf("render %d = %q, %v; want 21", i, out, err)
		}
	}
	if len(msgs) != 1 {
		t.Fatalf("the template changed the caller's messages: %v", msgs)
	}
}

func TestStrftime(t *testing.T) {
	at := time.Date(2025, 3, 9, 15, 4, 5, 0, time.UTC)
	tests := []struct{ format, want string }{
		{"%d %b %Y", "09 Mar 2025"},
		{"%Y-%m-%d", "2025-03-09"},
		{"%B %d, %Y", "March 09, 2025"},
		{"%H:%M:%S", "15:04:05"},
		{"%I %p", "03 PM"},
		{"%a %A", "Sun Sunday"},
		{"%y %j %e", "25 068  9"},
		{"100%% %Q %", "100% %Q %"},
		{"", ""},
	}
	for _, tc := range tests {
		t.Run(tc.format, func(t *testing.T) {
			if got := strftime(at, tc.format); got != tc.want {
				t.Errorf("strftime(%q) = %q, want %q", tc.format, got, tc.want)
			}
		})
	}
	tm := mustParse(t, `{{ strftime_now('%Y') }}`)
	out, err := tm.Render(nil, Options{})
	if want := time.Now().Format("2006"); err != nil || out != want {
		t.Errorf("strftime_now without Options.Now = %q, %v; want the current year %s", out, err, want)
	}
}

func TestCheck(t *testing.T) {
	for _, name := range requiredTemplates {
		src := smolLM2Template
		if name != "SmolLM2 (ChatML, constant)" {
			src = templateFile(t, name)
		}
		t.Run(name, func(t *testing.T) {
			if err := mustParse(t, src).Check(Options{BOS: "<s>", EOS: "</s>"}); err != nil {
				t.Fatal(err)
			}
		})
	}
	broken := []struct{ name, src string }{
		{"render-time failure", `{{ messages[0].content.nosuchmethod() }}`},
		{"always raises", `{{ raise_exception('no') }}`},
	}
	for _, tc := range broken {
		t.Run(tc.name, func(t *testing.T) {
			if err := mustParse(t, tc.src).Check(Options{}); err == nil {
				t.Fatal("Check succeeded on a template that cannot render")
			}
		})
	}
}

func TestEndOfTurn(t *testing.T) {
	tests := []struct{ template, want string }{
		{"meta-llama-Llama-3.1-8B-Instruct", "<|eot_id|>"},
		{"meta-llama-Llama-3.2-3B-Instruct", "<|eot_id|>"},
		{"Qwen-Qwen2.5-7B-Instruct", "<|im_end|>"},
		{"HuggingFaceTB-SmolLM3-3B", "<|im_end|>"},
		{"mistralai-Mistral-Nemo-Instruct-2407", "</s>"},
		{"unsloth-mistral-Devstral-Small-2507", "</s>"},
		{"Mistral-Small-3.2-24B-Instruct-2506", "</s>"},
		{"microsoft-Phi-3.5-mini-instruct", "<|end|>"},
		{"google-gemma-2-2b-it", "<end_of_turn>"},
		{"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "<｜end▁of▁sentence｜>"},
		{"ibm-granite-granite-3.3-2B-Instruct", "<|end_of_text|>"},
	}
	for _, tc := range tests {
		t.Run(tc.template, func(t *testing.T) {
			got, err := EndOfTurn(templateFile(t, tc.template), Options{BOS: "<s>", EOS: "</s>", Now: fixedNow})
			if err != nil || got != tc.want {
				t.Fatalf("EndOfTurn = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("SmolLM2", func(t *testing.T) {
		if got, err := EndOfTurn(smolLM2Template, Options{}); err != nil || got != "<|im_end|>" {
			t.Fatalf("EndOfTurn = %q, %v", got, err)
		}
	})
	t.Run("EOS text wins", func(t *testing.T) {
		got, err := EndOfTurn(templateFile(t, "MiniMax-M2"), Options{EOS: "[e~["})
		if err != nil || got != "[e~[" {
			t.Fatalf("EndOfTurn = %q, %v", got, err)
		}
	})
	t.Run("plain-text turns", func(t *testing.T) {
		_, err := EndOfTurn(`{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}`, Options{})
		if !errors.Is(err, ErrNoEndOfTurn) {
			t.Fatalf("err = %v, want ErrNoEndOfTurn", err)
		}
	})
	t.Run("reply dropped", func(t *testing.T) {
		_, err := EndOfTurn(`{{ messages[-1].content }}`, Options{})
		if !errors.Is(err, ErrNoEndOfTurn) {
			t.Fatalf("err = %v, want ErrNoEndOfTurn", err)
		}
	})
}

func TestConcurrentRender(t *testing.T) {
	names := []string{"meta-llama-Llama-3.1-8B-Instruct", "Qwen-Qwen2.5-7B-Instruct", "HuggingFaceTB-SmolLM3-3B", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use"}
	type job struct {
		tm   *Template
		msgs []Message
		o    Options
		want string
	}
	var jobs []job
	for _, n := range names {
		tm := mustParse(t, templateFile(t, n))
		for i, c := range conversations() {
			o := Options{BOS: "<s>", EOS: "</s>", AddGenerationPrompt: i%2 == 0, Now: fixedNow, Extra: map[string]any{"tools": toolsJSON}}
			want, err := tm.Render(c.msgs, o)
			if err != nil {
				continue
			}
			jobs = append(jobs, job{tm, c.msgs, o, want})
		}
	}
	const goroutines = 8
	var wg sync.WaitGroup
	errs := make(chan string, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range 3 * len(jobs) {
				j := jobs[(i+g)%len(jobs)]
				got, err := j.tm.Render(j.msgs, j.o)
				if err != nil || got != j.want {
					errs <- "concurrent render differs from the sequential one"
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
