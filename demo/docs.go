package demo

import "github.com/cacheblend/cacheblend/corpus"

// Document is a sample document (corpus.Document).
type Document = corpus.Document

// Documents returns the sample documents of package corpus, sorted by ID.
func Documents() []Document { return corpus.Documents() }
