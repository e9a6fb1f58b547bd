// Package modelfile opens a GGUF model file for serving: the memory-mapped
// file (package gguf), its identity (the engine and the worker compare it
// before they pair), the name the API serves it under, its tokenizer
// (package vocab) and its chat template (package chat), each checked when
// the file is opened, so a file the stack cannot serve fails at start-up
// with an error naming the problem, never at the first request.
//
// The compute side of the same file is model.Load; this package does not
// read the weights. A File is immutable after Open and safe for concurrent
// use; Close unmaps the file (every tensor slice and model built from it
// becomes invalid).
package modelfile
