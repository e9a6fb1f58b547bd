// Package testmodel writes small GGUF model files with random weights for
// tests: a llama or qwen2 architecture at a chosen shape and tensor type,
// with a real vocabulary copied from one of llama.cpp's vocab files, and
// weights scaled so the next-token distribution is peaked and depends on
// the prompt like a trained model's (so that comparisons between two
// implementations, or between a reused and a fresh KV cache, compare
// outputs that differ between prompts). The files are what llama.cpp and
// package model both load.
package testmodel
