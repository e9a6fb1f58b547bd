package contract

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"strings"

	"gopkg.in/yaml.v3"
)

// File names of the embedded contract files, as used in error messages.
const (
	InstrumentsFile = "instruments.yaml"
	SpansFile       = "spans.yaml"
	SLOFile         = "slo.yaml"
)

var (
	//go:embed instruments.yaml
	instrumentsYAML []byte
	//go:embed spans.yaml
	spansYAML []byte
	//go:embed slo.yaml
	sloYAML []byte
)

// InstrumentsYAML returns a copy of the embedded instruments.yaml. Safe for concurrent use.
func InstrumentsYAML() []byte { return bytes.Clone(instrumentsYAML) }

// SpansYAML returns a copy of the embedded spans.yaml. Safe for concurrent use.
func SpansYAML() []byte { return bytes.Clone(spansYAML) }

// SLOYAML returns a copy of the embedded slo.yaml. Safe for concurrent use.
func SLOYAML() []byte { return bytes.Clone(sloYAML) }

// ErrInvalid is wrapped by every error the loaders return for bad contract input (YAML syntax,
// unknown fields, or a rule violation); test with errors.Is.
var ErrInvalid = errors.New("contract: invalid")

// ValidationError lists every problem found in one contract file. It wraps [ErrInvalid].
type ValidationError struct {
	// File is the contract file name (e.g. "instruments.yaml"), or the caller's label for it.
	File string
	// Problems holds one human-readable sentence per violation, in file order.
	Problems []string
}

// Error joins the problems into one line.
func (e *ValidationError) Error() string {
	if len(e.Problems) == 1 {
		return fmt.Sprintf("contract: %s: %s", e.File, e.Problems[0])
	}
	return fmt.Sprintf("contract: %s: %d problems: %s", e.File, len(e.Problems), strings.Join(e.Problems, "; "))
}

// Unwrap returns [ErrInvalid].
func (e *ValidationError) Unwrap() error { return ErrInvalid }

// problems collects validation messages for one file.
type problems struct {
	file string
	list []string
}

func (p *problems) addf(format string, args ...any) {
	p.list = append(p.list, fmt.Sprintf(format, args...))
}

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	return &ValidationError{File: p.file, Problems: p.list}
}

// decodeStrict decodes exactly one YAML document into out, refusing unknown fields and
// duplicate keys. A panic inside the YAML library on hostile input becomes an error.
func decodeStrict(file string, data []byte, out any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &ValidationError{File: file, Problems: []string{fmt.Sprintf("yaml: decoder failed: %v", r)}}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return &ValidationError{File: file, Problems: []string{"empty document"}}
		}
		return &ValidationError{File: file, Problems: []string{err.Error()}}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return &ValidationError{File: file, Problems: []string{"more than one YAML document"}}
	}
	return nil
}
