// Package corpus holds the repo's sample documents (corpus/docs/*.txt, embedded in the
// binary): short technical paragraphs that cb demo and cb load build their RAG prompts from.
// It has no state; every function is safe for concurrent use.
package corpus
