package modelfile

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/cacheblend/cacheblend/chat"
	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/vocab"
)

// File is a model file opened for serving.
type File struct {
	// GGUF is the memory-mapped file (model.Load reads its weights).
	GGUF *gguf.File
	// Path is the path it was opened from.
	Path string
	// Identity is gguf.File.Identity: the file's size and a hash of its
	// header, metadata and tensor index.
	Identity string
	// Name is the name the API serves the model under: the file's
	// general.name, or its base name without ".gguf" when it has none.
	Name string
	// Vocab is the file's tokenizer.
	Vocab *vocab.Vocab
	// Template is the file's chat template (tokenizer.chat_template),
	// parsed and checked; nil when the file has none (chat requests are
	// then refused).
	Template *chat.Template
	// BOS and EOS are the vocabulary's ids; AddBOS says whether a prompt
	// starts with BOS (tokenizer.ggml.add_bos_token).
	BOS, EOS int32
	AddBOS   bool
	// Stop are the ids that end generation (vocab.Vocab.EOG).
	Stop []int32
}

// Open maps the GGUF file at path (or, with gguf.Resident, reads it into
// memory) and checks that it can be served: a supported tokenizer, and a
// chat template that renders (when it has one).
func Open(path string, opts ...gguf.OpenOption) (*File, error) {
	g, err := gguf.Open(path, opts...)
	if err != nil {
		return nil, fmt.Errorf("model file: %w", err)
	}
	f, err := FromGGUF(g, path)
	if err != nil {
		g.Close()
		return nil, err
	}
	return f, nil
}

// FromGGUF is Open for a file already mapped (or parsed from memory); path
// names it in errors and gives the default Name. The File takes g over:
// its Close closes g.
func FromGGUF(g *gguf.File, path string) (*File, error) {
	f := &File{GGUF: g, Path: path, Identity: g.Identity()}
	f.Name, _ = g.String("general.name")
	if f.Name == "" {
		f.Name = strings.TrimSuffix(filepath.Base(path), ".gguf")
	}
	v, err := vocab.FromGGUF(g)
	if err != nil {
		return nil, fmt.Errorf("model file %s: tokenizer: %w", path, err)
	}
	f.Vocab = v
	f.BOS, f.EOS, f.AddBOS, f.Stop = v.BOS(), v.EOS(), v.AddBOS(), v.EOG()
	if src, err := g.String("tokenizer.chat_template"); err == nil && src != "" {
		t, err := chat.Parse(src)
		if err != nil {
			return nil, fmt.Errorf("model file %s: chat template: %w", path, err)
		}
		if err := t.Check(f.ChatOptions(true)); err != nil {
			return nil, fmt.Errorf("model file %s: chat template: %w", path, err)
		}
		f.Template = t
	}
	// The vocabulary holds its own copies: the metadata's arrays of
	// strings (7.4 MiB for Qwen2.5's 151,936 tokens and merges) can go.
	g.Release(vocab.GGUFArrays...)
	return f, nil
}

// ChatOptions are the variables a chat template of f is rendered with: the
// vocabulary's BOS and EOS text.
func (f *File) ChatOptions(addGenerationPrompt bool) chat.Options {
	o := chat.Options{AddGenerationPrompt: addGenerationPrompt}
	if f.BOS >= 0 {
		o.BOS = f.Vocab.TokenText(f.BOS)
	}
	if f.EOS >= 0 {
		o.EOS = f.Vocab.TokenText(f.EOS)
	}
	return o
}

// ChatTokens renders msgs with the file's template (with the generation
// prompt) and tokenizes the result as llama.cpp does: special-token text in
// the rendering is parsed as special tokens, and BOS is prepended when the
// vocabulary asks for it and the template did not write it. It fails when
// the file has no template or the template fails on msgs.
func (f *File) ChatTokens(msgs []chat.Message) ([]int32, string, error) {
	return f.ChatTokensTools(msgs, nil)
}

// ChatTokensTools is ChatTokens with the request's tools (a JSON array of
// OpenAI tool objects; nil or empty for none) given to the template as its
// tools variable, as transformers' apply_chat_template(tools=...) does.
// A template that does not use tools ignores them.
func (f *File) ChatTokensTools(msgs []chat.Message, tools json.RawMessage) ([]int32, string, error) {
	if f.Template == nil {
		return nil, "", fmt.Errorf("model %s has no chat template", f.Name)
	}
	o := f.ChatOptions(true)
	if len(tools) > 0 {
		o.Extra = map[string]any{"tools": tools}
	}
	text, err := f.Template.Render(msgs, o)
	if err != nil {
		return nil, "", err
	}
	toks := f.Vocab.EncodeSpecial(text)
	if f.AddBOS && f.BOS >= 0 && (len(toks) == 0 || toks[0] != f.BOS) {
		toks = append([]int32{f.BOS}, toks...)
	}
	return toks, text, nil
}

// PromptTokens tokenizes a completion prompt: user text (special-token text
// in it stays text), with BOS first when the vocabulary asks for it.
func (f *File) PromptTokens(text string) []int32 {
	toks := f.Vocab.Encode(text)
	if f.AddBOS && f.BOS >= 0 {
		toks = append([]int32{f.BOS}, toks...)
	}
	return toks
}

// Close unmaps the file.
func (f *File) Close() error { return f.GGUF.Close() }
