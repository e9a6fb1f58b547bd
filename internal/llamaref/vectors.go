package llamaref

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Vector is one tokenizer test vector of llama.cpp: a text and the ids
// llama_tokenize gives it (add_special false, parse_special false).
type Vector struct {
	Text string
	IDs  []int32
}

// ReadVectors reads the test vectors of a vocabulary file (vocab + ".inp"
// and ".out", e.g. models/ggml-vocab-llama-bpe.gguf.inp) the way llama.cpp's
// tests/test-tokenizer-0.cpp does: inputs separated by
// "\n__ggml_vocab_test__\n" (a trailing separator starts no input), one line
// of ids per input.
func ReadVectors(vocab string) ([]Vector, error) {
	inp, err := os.ReadFile(vocab + ".inp")
	if err != nil {
		return nil, err
	}
	out, err := os.ReadFile(vocab + ".out")
	if err != nil {
		return nil, err
	}
	const sep = "\n__ggml_vocab_test__\n"
	var texts []string
	for raw := string(inp); raw != ""; {
		i := strings.Index(raw, sep)
		if i < 0 {
			texts = append(texts, raw)
			break
		}
		texts = append(texts, raw[:i])
		raw = raw[i+len(sep):]
	}
	lines := strings.Split(string(out), "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(texts) != len(lines) {
		return nil, fmt.Errorf("%s: %d inputs, %d outputs", vocab, len(texts), len(lines))
	}
	vs := make([]Vector, len(texts))
	for i := range texts {
		vs[i] = Vector{Text: texts[i], IDs: []int32{}}
		for _, f := range strings.Fields(lines[i]) {
			n, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%s.out line %d: %w", vocab, i+1, err)
			}
			vs[i].IDs = append(vs[i].IDs, int32(n))
		}
	}
	return vs, nil
}
