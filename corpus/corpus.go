package corpus

import (
	"embed"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/cacheblend/cacheblend/apiclient"
)

//go:embed docs/*.txt
var docFS embed.FS

// Document is one sample document: ID is the file name without extension (e.g.
// "03-cacheblend"), Text the document's text. It is package apiclient's Document, so the
// documents are ingested as they are.
type Document = apiclient.Document

// Documents returns the sample documents, sorted by ID: short technical paragraphs (~600
// bytes, so ~600 byte-level tokens each) written for this repo. Each call returns a new slice.
func Documents() []Document {
	entries, err := fs.ReadDir(docFS, "docs")
	if err != nil {
		panic("corpus: embedded documents missing: " + err.Error()) // a build defect, not input
	}
	docs := make([]Document, 0, len(entries))
	for _, e := range entries {
		b, err := docFS.ReadFile(path.Join("docs", e.Name()))
		if err != nil {
			panic("corpus: read embedded document: " + err.Error())
		}
		docs = append(docs, Document{ID: strings.TrimSuffix(e.Name(), ".txt"), Text: strings.TrimSpace(string(b))})
	}
	sort.Slice(docs, func(i, j int) bool { return docs[i].ID < docs[j].ID })
	return docs
}
