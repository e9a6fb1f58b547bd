package spanname_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/internal/spangen"
	"github.com/cacheblend/cacheblend/contract/spanname"
)

// TestGeneratedFileIsCurrent re-runs the generator in memory on the embedded contract and
// compares the result with the committed spanname_gen.go byte for byte.
func TestGeneratedFileIsCurrent(t *testing.T) {
	set, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	want, err := spangen.Generate(set)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("spanname_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got, want) {
		return
	}
	gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	line := 0
	for line < len(gl) && line < len(wl) && gl[line] == wl[line] {
		line++
	}
	g, w := "<end of file>", "<end of file>"
	if line < len(gl) {
		g = gl[line]
	}
	if line < len(wl) {
		w = wl[line]
	}
	t.Fatalf("spanname_gen.go is stale (contract/spans.yaml changed): run `make generate`\nfirst difference at line %d:\n  committed: %s\n  generated: %s", line+1, g, w)
}

// TestConstantsAreContractSpans checks a few constants against the contract, and that the
// SERVER span's name matches the contract's pattern.
func TestConstantsAreContractSpans(t *testing.T) {
	set, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{spanname.CBRequest, spanname.CBLookupRPC, spanname.MPLookupPrefetch,
		spanname.CBL2Load, spanname.CBStartLoadKV, spanname.EngineQueue, spanname.CBStorePreComputed} {
		if sp, ok := set.Lookup(name); !ok || sp.NamePattern != "" {
			t.Errorf("%q is not an exact span name of the contract", name)
		}
	}
	root, ok := set.Root(contract.TraceRequest)
	if !ok {
		t.Fatal("no request root")
	}
	for _, tc := range []struct{ op, model, want string }{
		{"chat", "m1", "chat m1"},
		{"text_completion", "cb-llama", "text_completion cb-llama"},
	} {
		got := spanname.Server(tc.op, tc.model)
		if got != tc.want {
			t.Errorf("Server(%q, %q) = %q, want %q", tc.op, tc.model, got, tc.want)
		}
		if sp, ok := set.Match(got); !ok || sp != root {
			t.Errorf("Server(%q, %q) = %q does not match the contract's root %q", tc.op, tc.model, got, root.Name)
		}
	}
	if got := spanname.Server("chat", ""); got != "chat" {
		t.Errorf("Server without a model = %q, want the operation", got)
	}
}

// TestNoSpanNameLiterals keeps the constants the only spelling of a span name in the
// module's production code: no string literal in a non-test Go file outside this package
// may equal a span name of the contract.
func TestNoSpanNameLiterals(t *testing.T) {
	set, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, sp := range set.Spans {
		if sp.NamePattern == "" {
			names[sp.Name] = true
		}
	}
	root := filepath.Join("..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == root {
				return nil
			}
			abs, _ := filepath.Abs(path)
			name := d.Name()
			if abs == self || name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if v, err := strconv.Unquote(lit.Value); err == nil && names[v] {
				t.Errorf("%s: span name %s as a literal; use the constant of package spanname", fset.Position(lit.Pos()), lit.Value)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("scanned only %d files", files)
	}
}
