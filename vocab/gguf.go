package vocab

import (
	"errors"
	"fmt"

	"github.com/cacheblend/cacheblend/gguf"
)

// GGUF metadata keys read by SpecFromGGUF.
const (
	keyModel        = "tokenizer.ggml.model"
	keyPre          = "tokenizer.ggml.pre"
	keyTokens       = "tokenizer.ggml.tokens"
	keyScores       = "tokenizer.ggml.scores"
	keyTypes        = "tokenizer.ggml.token_type"
	keyMerges       = "tokenizer.ggml.merges"
	keyAddBOS       = "tokenizer.ggml.add_bos_token"
	keyAddEOS       = "tokenizer.ggml.add_eos_token"
	keyAddPrefix    = "tokenizer.ggml.add_space_prefix"
	keyName         = "general.name"
	keyArchitecture = "general.architecture"
)

// GGUFArrays are the tokenizer's array keys (token texts, scores, types,
// merges): a Vocab built from a file holds copies of what it needs of
// them, so a caller may release them (gguf.File.Release) once it is built.
var GGUFArrays = []string{keyTokens, keyScores, keyTypes, keyMerges}

// SpecFromGGUF reads a tokenizer from f's tokenizer.ggml.* keys as
// llama.cpp's llama_vocab::impl::load does: defaults per model type
// (llama: BOS 1, EOS 2, UNK 0, add_bos, add_space_prefix; gpt2: BOS = EOS =
// 11, add_bos for the Llama 3 family), overridden by the keys present; a
// default special id out of range is dropped, and a special id key out of
// range is ignored (llama.cpp warns and keeps the default). Scores may be
// float32 or int32; score and type arrays longer than the token list are
// cut to it. The model and pre-tokenizer are checked by New, not here.
func SpecFromGGUF(f *gguf.File) (Spec, error) {
	var s Spec
	var err error
	if s.Model, err = f.String(keyModel); err != nil {
		return Spec{}, fmt.Errorf("vocab: %w", err)
	}
	if s.Pre, err = optString(f, keyPre); err != nil {
		return Spec{}, err
	}
	s = DefaultSpec(s.Model, s.Pre)
	if s.Tokens, err = f.Strings(keyTokens); err != nil {
		return Spec{}, fmt.Errorf("vocab: %w", err)
	}
	n := len(s.Tokens)
	if v, ok := f.Get(keyScores); ok {
		switch x := v.(type) {
		case []float32:
			s.Scores = x
		case []int32:
			s.Scores = make([]float32, len(x))
			for i, e := range x {
				s.Scores[i] = float32(e)
			}
		default:
			return Spec{}, fmt.Errorf("vocab: %s is %T, want a float32 or int32 array: %w", keyScores, v, ErrInvalidSpec)
		}
		if len(s.Scores) < n {
			return Spec{}, fmt.Errorf("vocab: %d scores for %d tokens: %w", len(s.Scores), n, ErrInvalidSpec)
		}
		s.Scores = s.Scores[:n]
	}
	if _, ok := f.Get(keyTypes); ok {
		if s.Types, err = f.Int32s(keyTypes); err != nil {
			return Spec{}, fmt.Errorf("vocab: %w", err)
		}
		if len(s.Types) < n {
			return Spec{}, fmt.Errorf("vocab: %d token types for %d tokens: %w", len(s.Types), n, ErrInvalidSpec)
		}
		s.Types = s.Types[:n]
	}
	if s.Model == "gpt2" {
		if s.Merges, err = f.Strings(keyMerges); err != nil {
			return Spec{}, fmt.Errorf("vocab: %w", err)
		}
	}
	// The FIM ids have older keys too, read last.
	ids := append(s.ids(), specialID{key: "prefix_token_id", id: &s.FIMPre},
		specialID{key: "suffix_token_id", id: &s.FIMSuf}, specialID{key: "middle_token_id", id: &s.FIMMid})
	for _, sp := range ids {
		if *sp.id >= int32(n) {
			*sp.id = -1
		}
		key := "tokenizer.ggml." + sp.key
		if _, ok := f.Get(key); !ok {
			continue
		}
		id, err := f.Int(key)
		if err != nil {
			return Spec{}, fmt.Errorf("vocab: %w", err)
		}
		if id >= 0 && id < int64(n) {
			*sp.id = int32(id)
		}
	}
	for _, k := range []struct {
		key string
		b   *bool
	}{{keyAddBOS, &s.AddBOS}, {keyAddEOS, &s.AddEOS}, {keyAddPrefix, &s.AddSpacePrefix}} {
		if _, ok := f.Get(k.key); !ok {
			continue
		}
		if *k.b, err = f.Bool(k.key); err != nil {
			return Spec{}, fmt.Errorf("vocab: %w", err)
		}
	}
	if s.Name, err = optString(f, keyName); err != nil {
		return Spec{}, err
	}
	if s.Arch, err = optString(f, keyArchitecture); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// optString returns the string value of key, "" when absent.
func optString(f *gguf.File, key string) (string, error) {
	s, err := f.String(key)
	if errors.Is(err, gguf.ErrMissingKey) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("vocab: %w", err)
	}
	return s, nil
}

// FromGGUF is New(SpecFromGGUF(f)).
func FromGGUF(f *gguf.File) (*Vocab, error) {
	s, err := SpecFromGGUF(f)
	if err != nil {
		return nil, err
	}
	return New(s)
}
