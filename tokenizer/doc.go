// Package tokenizer is the byte-level tokenizer shared by cb-engine and the
// model of cb-worker: every UTF-8 byte of a text is one token (ids 0..255),
// plus two special tokens, [BOS] and [EOS]; the vocabulary has [Vocab] ids.
// Because tokens are bytes, a document's tokens are identical wherever it
// appears in a prompt, which CacheBlend's chunk matching relies on.
//
// [Tokenizer] encodes and decodes, and [Tokenizer.Incomplete] tells a
// streaming detokenizer how many trailing ids to hold back. The package is a
// leaf: it imports only the standard library, so the engine links it without
// the model.
package tokenizer
