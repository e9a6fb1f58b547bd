// Package llamaref drives the reference implementation, llama.cpp, from Go tests.
//
// llama.cpp runs as its prebuilt CPU libraries through node-llama-cpp 3.21.1, installed by
// `bash scripts/deps.sh` into the reference directory (Dir: $CB_REF_DIR, default
// ~/.cache/cacheblend/ref). Start launches one long-lived `node scripts/ref/llama.mjs` child per
// *Ref; requests and responses are JSON lines (requests on the child's stdin, responses on its
// file descriptor 3, so nothing the native code prints can corrupt them). The child loads each
// model file once and keeps it for its lifetime.
//
// What each call reproduces:
//
//   - Tokenize/TokenizeBatch: llama_tokenize(vocab, text, add_special, parse_special), checked
//     against every tokenizer test vector llama.cpp ships (tests/test-tokenizer-0.cpp uses
//     add_special=false, parse_special=false). node-llama-cpp's addon tokenizes with
//     add_special=false; add_special=true is rebuilt in the driver exactly as
//     llama_vocab::impl::tokenize adds tokens (BOS/EOS per the vocabulary's add_bos/add_eos for
//     SPM, UGM and BPE; CLS…SEP for WPM; nothing for RWKV and PLaMo-2), which is sound because the
//     text itself is split identically either way.
//   - Detokenize: llama_detokenize(vocab, ids, remove_special, unparse_special), as a Go string
//     decoded from llama.cpp's bytes with invalid UTF-8 replaced by U+FFFD (the addon returns a
//     JavaScript string, so partial UTF-8 cannot survive). Use Piece for raw bytes.
//   - Piece/Pieces: llama_token_to_piece(vocab, id, lstrip=0, special) as raw bytes. The addon has
//     no token_to_piece, so the driver ports it (token text, attributes and vocabulary type all
//     come from llama.cpp) and checks every result against llama_detokenize of the one token.
//   - LogProbs/Logits/Greedy: a llama_context on the CPU (EvalOptions: 1 thread, F32 KV cache,
//     flash attention off, the whole sequence in one llama_decode by default) holding one sequence
//     evaluated from an empty KV cache. The addon exposes a position's distribution only as
//     llama.cpp's float32 softmax of the raw logits, so the driver rebuilds the logits from it:
//     log(p_i/p_max) = l_i - max_j l_j (error ~2e-7); where p_i underflows (logits more than ~69
//     below the max) it samples the same logits again at temperature T = 2, 4, ... where
//     log(p_i/p_max) = (l_i - max)/T. Logits therefore returns the raw logits shifted so that each
//     row's maximum is 0 (KL divergences, argmaxes and log-softmax do not see the shift), and
//     LogProbs their log-softmax in float64. With this build, logits were bit-identical for 1 and 2
//     threads on the test fixture; an F16 KV cache or flash attention moves them by ~1e-2.
//   - BenchPrefill/BenchDecode/RSS/Unload: cb bench's side (package llamabench): contexts with
//     llama.cpp's server defaults unless BenchOptions says otherwise (F16 KV cache, flash
//     attention "auto", 512-token micro-batches), prefill timed around its llama_decode calls,
//     decode steps with every sequence's token in one batch, the driver's resident memory, and
//     dropping a model to measure the next one from a clean state.
//
// Inputs must be valid UTF-8 (ErrInvalidUTF8 otherwise): the text crosses JSON and JavaScript
// strings.
//
// A *Ref is safe for concurrent use; the child serves requests one at a time, in order.
package llamaref
