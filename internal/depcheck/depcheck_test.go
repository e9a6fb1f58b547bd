package depcheck

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/cacheblend/cacheblend"

// Package path prefixes the rules forbid. A prefix matches the package
// itself and everything below it.
const (
	gonum     = "gonum.org/v1/gonum"
	otelSDK   = "go.opentelemetry.io/otel/sdk"
	exporters = "go.opentelemetry.io/otel/exporters"
	model     = module + "/model"
	provider  = module + "/telemetry/provider"
)

// goList runs `go list args...` in the module and returns its non-empty
// output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command on PATH: %v", err)
	}
	cmd := exec.Command(gotool, append([]string{"list"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	var lines []string
	for l := range strings.Lines(string(out)) {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// under reports whether pkg is prefix or a package below it.
func under(pkg, prefix string) bool {
	return pkg == prefix || strings.HasPrefix(pkg, prefix+"/")
}

// TestForbiddenDeps checks that the non-test dependencies of each pattern
// (`go list -deps`) contain none of the forbidden packages.
func TestForbiddenDeps(t *testing.T) {
	rules := []struct {
		pattern   string
		forbidden []string
		why       string
	}{
		{module + "/engine/...", []string{gonum, otelSDK, exporters, model},
			"the engine uses the byte tokenizer (package tokenizer) and the tracing API (package telemetry) only"},
		{module + "/blend/...", []string{model, gonum},
			"the blend server uses RoPE (package rope), not the model"},
		{module + "/gateway", []string{model, gonum, otelSDK, exporters, provider},
			"the gateway routes with the byte tokenizer and the fingerprint table; it runs no model and takes its tracer provider as component.Deps"},
		{module + "/component", []string{otelSDK, exporters, provider, model, gonum},
			"every component (the engine included) takes its process-wide collaborators as component.Deps; it is API only"},
		{module + "/telemetry", []string{otelSDK, exporters},
			"package telemetry is the API layer; the SDK and the exporters belong to telemetry/provider"},
		{module + "/telemetry/internal/...", []string{otelSDK, exporters},
			"package telemetry links its internal packages"},
	}
	for _, r := range rules {
		t.Run(r.pattern, func(t *testing.T) {
			deps := goList(t, "-deps", r.pattern)
			if len(deps) == 0 {
				t.Fatalf("go list -deps %s listed nothing", r.pattern)
			}
			for _, d := range deps {
				for _, f := range r.forbidden {
					if under(d, f) {
						t.Errorf("go list -deps %s lists %s: %s", r.pattern, d, r.why)
					}
				}
			}
		})
	}
}

// TestLeafPackages checks that tokenizer, defaults and contract/spanname
// depend on the standard library only, simd (the compute kernels) on it and
// golang.org/x/sys/cpu (run-time CPU features) only, and rope on those and
// simd only.
func TestLeafPackages(t *testing.T) {
	const cpuPkg = "golang.org/x/sys/cpu"
	tests := []struct {
		pkg     string
		allowed []string
	}{
		{module + "/tokenizer", nil},
		{module + "/defaults", nil},
		{module + "/contract/spanname", nil},
		{module + "/simd", []string{cpuPkg}},
		{module + "/rope", []string{module + "/simd", cpuPkg}},
	}
	for _, tc := range tests {
		t.Run(tc.pkg, func(t *testing.T) {
			deps := goList(t, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", tc.pkg)
			for _, d := range deps {
				if d != tc.pkg && !slices.Contains(tc.allowed, d) {
					t.Errorf("leaf package %s depends on %s", tc.pkg, d)
				}
			}
		})
	}
}

// TestProviderImporters checks that only process setup imports
// telemetry/provider (tests aside): libraries take a trace.TracerProvider
// and use package telemetry.
func TestProviderImporters(t *testing.T) {
	allowed := []string{module + "/service", module + "/cmd", module + "/stack", provider}
	lines := goList(t, "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...")
	if len(lines) == 0 {
		t.Fatal("go list listed no package")
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		pkg, imports := f[0], f[1:]
		ok := false
		for _, a := range allowed {
			ok = ok || under(pkg, a)
		}
		for _, imp := range imports {
			if under(imp, provider) && !ok {
				t.Errorf("%s imports %s; only process setup (service, cmd, stack) may", pkg, imp)
			}
		}
	}
}
