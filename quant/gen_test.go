package quant

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedUpToDate runs gen.go in a scratch directory and compares its
// output with the committed dot_amd64.s.
func TestGeneratedUpToDate(t *testing.T) {
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command on PATH: %v", err)
	}
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "gen.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gotool, "run", "gen.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GO111MODULE=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run gen.go: %v\n%s", err, out)
	}
	want, err := os.ReadFile(filepath.Join(dir, "dot_amd64.s"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("dot_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("dot_amd64.s is stale: run go generate ./quant")
	}
}
