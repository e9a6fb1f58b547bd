// Package vocab is a model's tokenizer as its GGUF file describes it
// (the tokenizer.ggml.* keys), tokenizing and detokenizing exactly as
// llama.cpp does (src/llama-vocab.cpp, src/unicode.cpp; the behaviour is
// ported, the code is this package's own).
//
// Two tokenizer models are implemented:
//
//   - "llama": SentencePiece BPE. The text gets a leading space
//     (add_space_prefix, also after each special token), spaces become
//     "▁", and characters are merged highest score first while the merged
//     text is a token; what is left over is written as byte tokens
//     (<0xNN>).
//   - "gpt2": byte-level BPE. The text is split into words by the
//     pre-tokenizer named by tokenizer.ggml.pre, each word's bytes are
//     mapped to GPT-2's byte↔unicode characters and merged lowest merge
//     rank first. The pre-tokenizers are hand-written ports of llama.cpp's
//     (its custom GPT-2, Llama 3, Qwen2 and Qwen3.5 splitters, and the
//     simple class regexes it runs through std::regex), classifying
//     codepoints with llama.cpp's own Unicode tables (unicode_tables.go,
//     generated from src/unicode-data.cpp by gen_tables.go), so they agree
//     with llama.cpp whatever Unicode version Go has. SupportedPre lists
//     the names: "default", the Llama 3 family ("llama-bpe", "llama3",
//     "llama-v3", …), "qwen2", "qwen35", "gpt-2", "smollm", "starcoder",
//     "command-r", "falcon", … Other pre-tokenizers and models fail in New
//     with an error wrapping ErrUnsupported that names them.
//
// Special tokens (control, user-defined, unknown) are split out of the
// text before either model runs, longest first, as llama.cpp's
// tokenizer_st_partition: user-defined tokens always, control and unknown
// ones only with parseSpecial (EncodeSpecial, for rendered chat
// templates; Encode treats such text as plain text). Strip attributes are
// set as llama.cpp sets them (Phi-3's special tokens eat the whitespace
// after them). Token attributes, the end-of-generation set (EOG) and the
// ids llama.cpp finds by their text (EOT, EOM, FIM) follow
// llama_vocab::impl::load, including where several candidates exist and
// llama.cpp's choice depends on its std::unordered_map's iteration order,
// which stdmap.go reproduces.
//
// Decode concatenates the tokens' pieces (as llama.cpp's server streams
// text), so that decoding consecutive runs of ids, cut where Incomplete
// allows, concatenates to Decode of all; Detokenize is llama_detokenize
// itself (it drops a llama model's leading space and applies gpt2 models'
// space clean-up, which makes it unfit for streaming).
//
// Checked against llama.cpp: every test vector of its models/ggml-vocab-*
// files with a supported tokenizer, thousands of random texts per
// vocabulary and per pre-tokenizer compared with llama_tokenize, every
// token's piece with llama_token_to_piece, and random id sequences with
// llama_detokenize (vectors_test.go, ref_test.go).
//
// Known differences, on input llama.cpp cannot handle: codepoints past
// U+10FFFF in invalid UTF-8 (where llama.cpp throws) are read as U+FFFD,
// and a missing byte token of a llama model (where llama.cpp throws) is
// left out.
//
// A *Vocab is immutable and safe for concurrent use. Tokenize keeps a
// bounded cache of the ids of short words (32,768 entries, cleared when
// full); a ~2,000-token prompt takes well under a millisecond.
package vocab
