// Package gguf reads and writes GGUF files, the model file format of ggml
// and llama.cpp (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).
//
// # Support
//
// Versions 2 and 3, little-endian, are read; version 1 (32-bit counts) and
// big-endian files are rejected with an error saying so. [Write] and
// [Encode] produce version 3. A file is
//
//	magic "GGUF" | uint32 version | uint64 n_tensors | uint64 n_kv
//	n_kv × (string key | uint32 value type | value)
//	n_tensors × (string name | uint32 n_dims | n_dims × uint64 ne | uint32 ggml type | uint64 offset)
//	padding to general.alignment (default 32)
//	tensor data section
//
// where a string is a uint64 byte length and the bytes, and an array value
// is a uint32 element type, a uint64 count and the elements. Metadata values
// are decoded to the Go types listed at [KV]; an array of arrays is an []any.
// Tensor types are [quant.Type] numbers; any type whose block layout package
// quant knows can be indexed (whether or not it can be computed).
//
// [Open] memory-maps the file read-only and never copies tensor data:
// [File.Data] returns slices of the mapping. Metadata (including large
// token arrays) is decoded into Go values at open time; all the strings of
// one string array share a single allocation.
//
// # Validation and limits
//
// [Open] and [Parse] treat the input as hostile. Every error wraps
// [ErrFormat] and names the problem and the key or tensor involved; no input
// makes them panic or allocate more than a small multiple of the input's
// size. They check:
//
//   - the magic, and a version of 2 or 3;
//   - every string length, array count, metadata count and tensor count
//     against the bytes remaining before allocating anything (a count of
//     2^60 fails at once);
//   - value types 0..12, bools 0 or 1, arrays nested at most [MaxArrayDepth]
//     (2) deep, no empty and no duplicate keys;
//   - general.alignment, when present, is a uint32 power of two in
//     [1, [MaxAlignment]];
//   - tensor names at most [MaxNameLen] (63) bytes and unique; n_dims in
//     [1, [MaxDims]]; every dim > 0 and their product (and the byte size)
//     within int64; a known ggml type (else the error names the number and
//     the tensor); a row length ne[0] that is a multiple of the type's block
//     size;
//   - the data section starts at the end of the tensor index rounded up to
//     the alignment; each tensor offset (relative to it) is aligned, each
//     tensor's bytes lie inside the file, and no two tensors overlap.
//
// Gaps between tensors and missing trailing padding are accepted, as by
// llama.cpp's loader; a file without tensors may end right after its index.
// Unlike ggml, tensors need not be stored in index order.
//
// # Identity
//
// [File.Identity] hashes (SHA-256) only bytes [0, DataOffset) — header,
// metadata and tensor index — plus the file size, so two processes can cheaply
// check they hold the same model file.
package gguf
