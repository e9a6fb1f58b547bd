package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// Sentinel errors. Every error Parse, Render and Check return wraps one of them (test with
// errors.Is).
var (
	// ErrParse: the engine cannot compile the template. The serving engine refuses to start on it.
	ErrParse = errors.New("chat: template does not compile")
	// ErrRender: rendering failed (an unsupported construct, a non-callable call, a panic inside the
	// engine, ...). A template that fails like this on the Check probe is broken.
	ErrRender = errors.New("chat: template render failed")
	// ErrRaised: the template called raise_exception, i.e. it refuses this conversation (for example
	// a system message where the model has no system role). The caller's input is at fault: map it
	// to a client error. errors.As with *RaiseError gives the template's message.
	ErrRaised = errors.New("chat: template raised an exception")
	// ErrLimit: the template exceeded a bound (size, nesting, loop steps, macro depth, range size,
	// output size). Also wrapped together with ErrParse or ErrRender.
	ErrLimit = errors.New("chat: template limit exceeded")
	// ErrVariables: Options.Extra holds a value the template cannot be given (reserved name,
	// unsupported type, too deep).
	ErrVariables = errors.New("chat: bad template variables")
)

// RaiseError is the error a template raises with raise_exception(message). It matches ErrRaised
// under errors.Is.
type RaiseError struct {
	// Message is the template's text, verbatim.
	Message string
}

// Error returns the template's message, prefixed.
func (e *RaiseError) Error() string { return "chat: template raised: " + e.Message }

// Is reports whether target is ErrRaised.
func (e *RaiseError) Is(target error) bool { return target == ErrRaised }

// limitError is a render-time bound being hit; it matches ErrLimit and ErrRender.
type limitError struct{ msg string }

func (e *limitError) Error() string { return "chat: template limit exceeded: " + e.msg }

func (e *limitError) Is(target error) bool { return target == ErrLimit || target == ErrRender }

// Message is one conversation turn as the template sees it: a dict with "role" and "content", plus
// "tool_call_id", "name" and "tool_calls" when they are not empty.
type Message struct {
	// Role is "system", "user", "assistant" or "tool" (passed through unchecked: the template
	// decides what it accepts).
	Role string `json:"role"`
	// Content is the message text.
	Content string `json:"content"`
	// ToolCallID is the id of the call a "tool" message answers; omitted from the dict when empty.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Name is the tool (or participant) name; omitted from the dict when empty.
	Name string `json:"name,omitempty"`
	// ToolCalls is an assistant message's tool calls as a JSON array (OpenAI's shape: id, type,
	// function with name and arguments; arguments best given as an object, as transformers'
	// templates expect), decoded for the template keeping key order; omitted from the dict when
	// empty. JSON that does not decode makes Render fail with ErrVariables.
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
}

// Limits bounds one render. A zero field takes its default.
type Limits struct {
	// MaxLoopIterations bounds the for-loop iterations of one render, all loops together.
	// Default 1,000,000.
	MaxLoopIterations int
	// MaxMacroDepth bounds macro calls nested inside macro calls (recursion). Default 100.
	MaxMacroDepth int
	// MaxRange bounds the length of a list built by range(). Default 100,000.
	MaxRange int
	// MaxOutputBytes bounds the rendered text; checked after rendering. Default 64 MiB.
	MaxOutputBytes int
}

// Default limits (see Limits).
const (
	DefaultMaxLoopIterations = 1_000_000
	DefaultMaxMacroDepth     = 100
	DefaultMaxRange          = 100_000
	DefaultMaxOutputBytes    = 64 << 20
)

func (l Limits) withDefaults() Limits {
	if l.MaxLoopIterations <= 0 {
		l.MaxLoopIterations = DefaultMaxLoopIterations
	}
	if l.MaxMacroDepth <= 0 {
		l.MaxMacroDepth = DefaultMaxMacroDepth
	}
	if l.MaxRange <= 0 {
		l.MaxRange = DefaultMaxRange
	}
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = DefaultMaxOutputBytes
	}
	return l
}

// Options are the variables of one render besides the messages.
type Options struct {
	// BOS and EOS are the template's bos_token and eos_token (the model's special-token texts).
	BOS, EOS string
	// AddGenerationPrompt is add_generation_prompt: end the text with the assistant turn's header.
	AddGenerationPrompt bool
	// Extra holds more template variables (tools, documents, enable_thinking, ...). Values: see
	// toValue — nil, bool, numbers, strings, json.Number, json.RawMessage (key order kept), slices,
	// maps with string keys (keys sorted). The names messages, bos_token, eos_token,
	// add_generation_prompt, raise_exception, strftime_now, range, namespace and dict are reserved.
	Extra map[string]any
	// Now is the time strftime_now formats; the zero value means time.Now() at render time.
	Now time.Time
	// Limits bounds the render; the zero value means the defaults.
	Limits Limits
}

// reserved are the names Render always sets; Extra may not use them.
var reserved = map[string]bool{
	"messages": true, "bos_token": true, "eos_token": true, "add_generation_prompt": true,
	"raise_exception": true, "strftime_now": true, "range": true, "namespace": true, "dict": true,
}

// Template is a compiled chat template. It is immutable after Parse and safe for concurrent use:
// every Render builds its own variables and scope, and the engine's compiled tree is only read.
type Template struct {
	src string
	t   *jinja.Template
}

// Parse compiles a chat template (Hugging Face Jinja, the GGUF key tokenizer.chat_template).
// Like Jinja with the settings Hugging Face uses, a single trailing newline of src is dropped and
// trim_blocks/lstrip_blocks apply. Errors wrap ErrParse (and ErrLimit for a template over the
// parse-time bounds); Parse never falls back to a default template.
func Parse(src string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("%w: engine panic: %v", ErrParse, r)
		}
	}()
	body := strings.TrimSuffix(src, "\n")
	guarded, err := rewrite(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrParse, err)
	}
	jt, err := jinja.Compile(guarded)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrParse, err)
	}
	return &Template{src: src, t: jt}, nil
}

// Source returns the template text given to Parse.
func (t *Template) Source() string { return t.src }

// Render renders the conversation. Errors wrap ErrRaised (the template refused the conversation),
// ErrLimit, ErrVariables or ErrRender.
func (t *Template) Render(msgs []Message, o Options) (out string, err error) {
	vars := make(map[string]jinja.Value, len(o.Extra)+12)
	for k, x := range o.Extra {
		if reserved[k] || strings.HasPrefix(k, guardPrefix) {
			return "", fmt.Errorf("%w: %q is a reserved name", ErrVariables, k)
		}
		v, err := toValue(x, 0)
		if err != nil {
			return "", fmt.Errorf("%w: %q: %w", ErrVariables, k, err)
		}
		vars[k] = v
	}
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		v, err := messageValue(m)
		if err != nil {
			return "", fmt.Errorf("%w: messages[%d].tool_calls: %w", ErrVariables, i, err)
		}
		list[i] = v
	}
	vars["messages"] = jinja.NewList(list)
	vars["bos_token"] = jinja.NewString(o.BOS)
	vars["eos_token"] = jinja.NewString(o.EOS)
	vars["add_generation_prompt"] = jinja.NewBool(o.AddGenerationPrompt)
	lim := o.Limits.withDefaults()
	installGlobals(vars, o.Now, lim)

	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("%w: engine panic: %v", ErrRender, r)
		}
	}()
	out, err = t.t.RenderValues(vars)
	if err != nil {
		var re *RaiseError
		var le *limitError
		if errors.As(err, &re) || errors.As(err, &le) {
			return "", err
		}
		return "", fmt.Errorf("%w: %w", ErrRender, err)
	}
	if len(out) > lim.MaxOutputBytes {
		return "", &limitError{fmt.Sprintf("output is %d bytes, the limit is %d", len(out), lim.MaxOutputBytes)}
	}
	return out, nil
}

// installGlobals adds the functions a chat template may call (replacing the engine's own where
// they differ from Hugging Face's) and the per-render guards the rewritten template calls.
func installGlobals(vars map[string]jinja.Value, now time.Time, lim Limits) {
	vars["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := ""
		if len(args) > 0 {
			msg = display(args[0])
		}
		return jinja.Undefined(), &RaiseError{Message: msg}
	})
	vars["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now: expected a format string")
		}
		at := now
		if at.IsZero() {
			at = time.Now()
		}
		return jinja.NewString(strftime(at, args[0].AsString())), nil
	})
	vars["range"] = jinja.NewCallable("range", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return rangeValue(args, lim.MaxRange)
	})
	// namespace(...) and dict(...) get their keyword arguments as a Go map: sort the keys so the
	// order (seen by tojson and by iteration) does not change from render to render.
	kwDict := func(_ []jinja.Value, kw map[string]jinja.Value) (jinja.Value, error) {
		out := jinja.NewDict()
		d := out.AsDict()
		for _, k := range slices.Sorted(maps.Keys(kw)) {
			d.Set(k, kw[k])
		}
		return out, nil
	}
	vars[guardToJSON] = jinja.NewCallable("tojson", filterToJSON)
	vars[guardIndent] = jinja.NewCallable("indent", filterIndent)
	vars["namespace"] = jinja.NewCallable("namespace", kwDict)
	vars["dict"] = jinja.NewCallable("dict", kwDict)

	steps, depth := 0, 0
	vars[guardLoop] = jinja.NewCallable(guardLoop, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		steps++
		if steps > lim.MaxLoopIterations {
			return jinja.Undefined(), &limitError{fmt.Sprintf("more than %d loop iterations", lim.MaxLoopIterations)}
		}
		return jinja.NewString(""), nil
	})
	vars[guardEnter] = jinja.NewCallable(guardEnter, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		depth++
		if depth > lim.MaxMacroDepth {
			return jinja.Undefined(), &limitError{fmt.Sprintf("macro calls nested deeper than %d", lim.MaxMacroDepth)}
		}
		return jinja.NewString(""), nil
	})
	vars[guardExit] = jinja.NewCallable(guardExit, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		depth--
		return jinja.NewString(""), nil
	})
}

// rangeValue is Python's range(stop) / range(start, stop[, step]) as a list of at most max items.
func rangeValue(args []jinja.Value, max int) (jinja.Value, error) {
	var n [3]int64
	for i, a := range args {
		if i >= 3 || !a.IsInt() {
			return jinja.Undefined(), errors.New("range: expected 1 to 3 integers")
		}
		n[i] = a.AsInt()
	}
	start, stop, step := int64(0), n[0], int64(1)
	switch len(args) {
	case 0:
		return jinja.Undefined(), errors.New("range: expected 1 to 3 integers")
	case 2:
		start, stop = n[0], n[1]
	case 3:
		start, stop, step = n[0], n[1], n[2]
	}
	if step == 0 {
		return jinja.Undefined(), errors.New("range: step must not be zero")
	}
	var count uint64
	switch {
	case step > 0 && stop > start:
		count = (uint64(stop-start) + uint64(step) - 1) / uint64(step)
	case step < 0 && start > stop:
		count = (uint64(start-stop) + uint64(-step) - 1) / uint64(-step)
	}
	if count > uint64(max) {
		return jinja.Undefined(), &limitError{fmt.Sprintf("range of %d items, the limit is %d", count, max)}
	}
	items := make([]jinja.Value, count)
	for i := range items {
		items[i] = jinja.NewInt(start + int64(i)*step)
	}
	return jinja.NewList(items), nil
}

// display is the text of a value as {{ }} prints it for the types a raise_exception message has.
func display(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	if v.IsUndefined() || v.IsNone() {
		return ""
	}
	return v.String()
}

// probe is the conversation Check renders.
var probe = []Message{
	{Role: "system", Content: "You are a helpful assistant."},
	{Role: "user", Content: "Hello!"},
	{Role: "assistant", Content: "Hi, how can I help?"},
	{Role: "user", Content: "Tell me a joke."},
}

// Check renders a probe conversation (system, user, assistant, user, with the generation prompt)
// so that a template that compiles but fails at render time is caught at startup. A template that
// raises on the system message (a model without a system role, like Gemma 2) is accepted when the
// probe without it renders: requests with a system message will then get ErrRaised.
func (t *Template) Check(o Options) error {
	o.AddGenerationPrompt = true
	_, err := t.Render(probe, o)
	if errors.Is(err, ErrRaised) {
		if _, err2 := t.Render(probe[1:], o); err2 == nil {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("chat: check: %w", err)
	}
	return nil
}
