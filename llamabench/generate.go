package llamabench

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/internal/testmodel"
	"github.com/cacheblend/cacheblend/quant"
)

// FileName is the name of the test file of shape s in format.
func FileName(s Shape, format string) string { return s.Name + "-" + format + ".gguf" }

// Generate returns the path of the test file of shape s in format inside
// dir, writing it first when it is not there (random weights seeded by the
// shape, the vocabulary copied from vocabDir/ggml-vocab-<s.Vocab>.gguf;
// written to a temporary name and renamed, so an interrupted run leaves no
// half file). A file already there is reused when it opens as GGUF and is
// named for s and format.
func Generate(dir, vocabDir string, s Shape, format string) (string, error) {
	if _, err := TensorType(format, "output.weight", 256, s.Layers, s.Tied); err != nil {
		return "", err
	}
	path := filepath.Join(dir, FileName(s, format))
	name := s.Name + " (random weights, " + format + ")"
	if f, err := gguf.Open(path); err == nil {
		got, _ := f.String("general.name")
		f.Close()
		if got == name {
			return path, nil
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("llamabench: test file directory: %w", err)
	}
	var typeErr error
	spec := testmodel.Spec{
		Arch: s.Arch, Name: name, Layers: s.Layers, Dim: s.Dim, Heads: s.Heads, KVHeads: s.KVHeads,
		FFNDim: s.FFN, CtxLen: 8192, Tied: s.Tied, RopeFreqs: s.RopeFreqs, Theta: s.Theta,
		Seed:      uint64(len(s.Name))*1000 + uint64(s.Dim),
		Type:      quant.F32,
		VocabFile: filepath.Join(vocabDir, "ggml-vocab-"+s.Vocab+".gguf"),
		TensorType: func(tensor string, in, _ int) quant.Type {
			t, err := TensorType(format, tensor, in, s.Layers, s.Tied)
			if err != nil && typeErr == nil {
				typeErr = err
			}
			return t
		},
	}
	b, err := testmodel.Encode(spec)
	if err == nil {
		err = typeErr
	}
	if err != nil {
		return "", fmt.Errorf("llamabench: generate %s: %w", FileName(s, format), err)
	}
	tmp, err := os.CreateTemp(dir, ".gen-*.gguf")
	if err != nil {
		return "", fmt.Errorf("llamabench: generate: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return "", fmt.Errorf("llamabench: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("llamabench: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("llamabench: write %s: %w", path, err)
	}
	return path, nil
}
