package eval

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/internal/llamaref"
	"github.com/cacheblend/cacheblend/internal/testmodel"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/modelfile"
)

// A small built-in model: every configuration measured, ratio 1 is the
// full prefill (no drift), full reuse drifts, more recompute drifts less,
// and the table and the chart render (the chart is well-formed XML).
func TestRun(t *testing.T) {
	m, err := model.New(model.Config{Layers: 4, Dim: 64, Heads: 4, KVHeads: 2, FFNDim: 128, MaxPositions: 2048, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), m, "small", BuiltinPrompts(), Config{Ratios: []float64{0, 0.3, 1}, Prompts: 2, Docs: 2, Positions: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Points) != 4 {
		t.Fatalf("%d points, want 4 (full reuse, hkvd and random at 0.3, ratio 1): %+v", len(rep.Points), rep.Points)
	}
	byKey := map[string]Point{}
	for _, p := range rep.Points {
		byKey[fmt.Sprintf("%s/%g", p.Rule, p.Ratio)] = p
		if p.FullMs <= 0 || p.BlendMs <= 0 || p.ModelSpeedup <= 0 || p.Speedup() != p.ModelSpeedup {
			t.Fatalf("timing of %+v", p)
		}
	}
	full, one, hk := byKey["full_reuse/0"], byKey["hkvd/1"], byKey["hkvd/0.3"]
	if one.FirstKL > 1e-9 || one.MeanKL > 1e-9 || one.Top1 != 1 || one.GreedyMatch != 1 {
		t.Fatalf("ratio 1 drifts: %+v", one)
	}
	if !(full.MeanKL > hk.MeanKL && hk.MeanKL > 0) {
		t.Fatalf("full reuse mean KL %g, ratio 0.3 %g: want full > 0.3 > 0", full.MeanKL, hk.MeanKL)
	}
	var tab, svg bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil || !strings.Contains(tab.String(), "full_reuse") {
		t.Fatalf("table %v:\n%s", err, tab.String())
	}
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&svg)
	for {
		if _, err := d.Token(); err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("chart is not XML: %v", err)
			}
			break
		}
	}
	if _, ok := rep.Cheapest("hkvd", 1e9); !ok {
		t.Fatal("no point under an infinite KL bound")
	}
}

// A GGUF file with a chat template: the prompts are the template's
// rendering with the documents' tokens in the user message, and the
// evaluation runs on the file's model.
func TestRunOnModelFile(t *testing.T) {
	src, err := llamaref.LlamaCppSource()
	if err != nil {
		t.Fatalf("%v: run bash scripts/deps.sh", err)
	}
	tmpl, err := os.ReadFile(filepath.Join(src, "models", "templates", "meta-llama-Llama-3.2-3B-Instruct.jinja"))
	if err != nil {
		t.Fatalf("%v: run bash scripts/deps.sh", err)
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := testmodel.Write(path, testmodel.Spec{Layers: 2, Dim: 64, FFNDim: 128, Template: string(tmpl),
		VocabFile: filepath.Join(src, "models", "ggml-vocab-llama-bpe.gguf")}); err != nil {
		t.Fatal(err)
	}
	mf, err := modelfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	p := FilePrompts(mf)
	before, after, err := p.Wrap("Why?")
	if err != nil {
		t.Fatal(err)
	}
	header := mf.Vocab.EncodeSpecial("<|start_header_id|>")
	if b, a := mf.Vocab.Decode(before), mf.Vocab.Decode(after); len(header) != 1 || !slices.Contains(before, header[0]) || !slices.Contains(after, header[0]) ||
		!strings.HasSuffix(b, "Answer from the documents.user\n\nDocuments:\n") || !strings.HasSuffix(a, "\nQuestion: Why?assistant\n\n") {
		t.Fatalf("prompt around the documents:\n%q\n...\n%q", b, a)
	}
	m, err := model.Load(mf.GGUF, model.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), m, mf.Name, p, Config{Ratios: []float64{0, 1}, Prompts: 1, Docs: 2, Positions: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Points) != 2 || rep.Points[1].FirstKL > 1e-9 || rep.Points[0].FirstKL <= 0 || rep.DocTokens <= 0 {
		t.Fatalf("report %+v", rep)
	}
}

func TestReadWorkload(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadDocuments(dir); err == nil {
		t.Fatal("an empty directory read as documents")
	}
	os.WriteFile(filepath.Join(dir, "b.txt"), []byte("second\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte(" first "), 0o600)
	os.WriteFile(filepath.Join(dir, "c.md"), []byte("not a document"), 0o600)
	docs, err := ReadDocuments(dir)
	if err != nil || fmt.Sprint(docs) != "[first second]" {
		t.Fatalf("documents %q %v", docs, err)
	}
	q := filepath.Join(dir, "q")
	os.WriteFile(q, []byte("\n  one?\n\ntwo?\n"), 0o600)
	if qs, err := ReadQuestions(q); err != nil || fmt.Sprint(qs) != "[one? two?]" {
		t.Fatalf("questions %q %v", qs, err)
	}
	if _, err := Run(context.Background(), nil, "", BuiltinPrompts(), Config{Ratios: []float64{2}}); err == nil {
		t.Fatal("ratio 2 accepted")
	}
}
