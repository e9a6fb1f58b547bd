// Package chat renders a model's chat template (the GGUF key tokenizer.chat_template, a Hugging
// Face Jinja template) for an OpenAI-style conversation. The output is meant to equal, character
// for character, what Hugging Face's reference implementation @huggingface/jinja renders; the
// tests compare the two on llama.cpp's collection of real templates.
//
// # Use
//
// Parse the template once at startup, Check it, then Render per request:
//
//	t, err := chat.Parse(src)               // ErrParse: the engine must refuse to start
//	err = t.Check(chat.Options{BOS: bos, EOS: eos})
//	prompt, err := t.Render(msgs, chat.Options{BOS: bos, EOS: eos, AddGenerationPrompt: true})
//	stop, err := t.EndOfTurn(chat.Options{EOS: eos}) // e.g. "<|eot_id|>", to add as a stop token
//
// The template sees messages (a list of dicts: role, content, and tool_call_id, name and tool_calls
// when set; tool_calls is decoded from JSON keeping key order), bos_token, eos_token, add_generation_prompt and the Options.Extra variables, plus the
// functions raise_exception(msg) (Render fails with a *RaiseError, matching ErrRaised: the
// conversation is refused, a client error), strftime_now(format) (formats Options.Now, default the
// current time; tests inject a fixed date), range, namespace and dict. A *Template is immutable and
// safe for concurrent use; Render takes ~15–55 µs for a 4-message conversation.
//
// # Engine
//
// Rendering is done by github.com/ardanlabs/jinja (v1.8.0), a pure-Go Jinja engine written for
// chat templates: it applies trim_blocks and lstrip_blocks like transformers and, with the fix-ups
// below, renders 65 of the 68 templates in llama.cpp's models/templates plus SmolLM2's exactly like
// @huggingface/jinja on every test conversation (system, multi-turn, unicode and quotes, a long
// document, tool lists, tool results, with and without the generation prompt). The three others
// differ only because @huggingface/jinja throws where Go (like Python) renders (ByteDance-Seed-OSS:
// integer dict keys; tencent-Hy3: str.format; unsloth-Apriel-1.5: the string filter on a dict).
//
// This package fixes, around the engine, what it does differently from Jinja, by rewriting the
// template text before compiling it (rewrite in guard.go) and by supplying variables:
//   - a single trailing newline of the template is dropped (Jinja's keep_trailing_newline=False);
//   - string-literal escapes the engine does not know (\r \b \f \v \a \xHH \uHHHH \UHHHHHHHH) are
//     decoded;
//   - in an expression, "}}" inside braces does not end the tag ({{ {'a': {'b': 1}} | tojson }});
//   - characters outside Jinja's syntax, and empty expressions, conditions and values, which the
//     engine silently skips, are parse errors;
//   - tojson is replaced (the engine sorts keys and escapes HTML when indenting and ignores
//     ensure_ascii, sort_keys and separators) by transformers' json.dumps-based filter, and indent
//     by a bounded one; the filter names are rewritten to names the engine resolves from the
//     variables;
//   - raise_exception, strftime_now, range (bounded), namespace and dict (sorted keyword order,
//     not Go's random map order) are supplied per render;
//   - engine panics are recovered into ErrParse/ErrRender errors.
//
// # Limits and gaps
//
// A template is outside input (it comes from a model file). Parse rejects templates over
// MaxTemplateBytes, with blocks nested more than 256 deep, brackets more than 128 deep in a tag, a
// tag of more than 20,000 tokens, or long runs of adjacent tags (the engine's whitespace pass is
// quadratic in them) — all far above real templates — so that the engine's recursive parser stays
// far from the Go stack limit (a Go stack overflow is fatal, not a panic). Render enforces Limits:
// loop iterations (a guard call is inserted at the start of every for body), macro nesting (a
// guard around every macro body: infinite recursion is an ErrLimit, not a crash), range() size,
// and the output size (checked after rendering). The guards are expression tags that print
// nothing; the engine's whitespace handling skips them, so they change no output (the reference
// test proves it on every template).
//
// Gaps (the engine has no hook for them; they need a hostile template, not a hostile request):
// string repetition ('x' * 10**12) and string methods chained to grow exponentially
// (.replace/.format) can allocate without bound before the output check; a list or dict made to
// contain itself (a.append(a)) overflows the Go stack when printed or compared (tojson is
// guarded); and a string doubled by repeated assignments grows until memory runs out. Fixing these
// needs depth/size accounting inside the engine (an upstream change or a fork).
//
// # Known differences from @huggingface/jinja
//
// Where @huggingface/jinja departs from Python Jinja (what transformers, hence model training,
// uses), Go follows Python: {{ true }} prints True (not true), {{ [1, 'a'] }} prints [1, 'a'] (not
// JSON), strip/lstrip/rstrip honour their characters argument (@huggingface/jinja strips all
// whitespace), tojson prints floats like Python (1.0, 1e-07), {% raw %} works. Engine limitations:
// {{ 1.0 }} prints 1 and {{ 12345678.9 }} prints 1.23456789e+07; {% set a, b = ... %} does not
// compile. TestSnippetsMatchHuggingFaceJinja pins each of these down against both engines.
//
// # End of turn
//
// EndOfTurn renders user, assistant, user with a unique assistant reply and returns what follows
// the reply: Options.EOS when the text starts with it, else the leading <...> special-token text.
// It finds <|eot_id|> (Llama 3), <|im_end|> (ChatML, Qwen, SmolLM), </s> (Mistral), <|end|>
// (Phi-3.5), <end_of_turn> (Gemma) and the others of llama.cpp's collection except MiniMax-M2/M3
// (found only through Options.EOS) and RWKV World (plain text); for GLM it returns the next turn's
// <|user|>, which is GLM's stop token.
package chat
