package chat

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// refDir is the reference directory made by scripts/deps.sh (CB_REF_DIR, default
// ${XDG_CACHE_HOME:-~/.cache}/cacheblend/ref). A missing directory fails the test: it never skips.
func refDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("CB_REF_DIR")
	if dir == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				t.Fatalf("no home directory (%v): set CB_REF_DIR or run bash scripts/deps.sh", err)
			}
			base = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(base, "cacheblend", "ref")
	}
	for _, p := range []string{"node_modules/@huggingface/jinja/package.json", "llama.cpp/models/templates"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Fatalf("reference implementation missing (%v): run bash scripts/deps.sh", err)
		}
	}
	return dir
}

// templateFile reads one of llama.cpp's real chat templates.
func templateFile(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(refDir(t), "llama.cpp", "models", "templates", name+".jinja"))
	if err != nil {
		t.Fatalf("read template: %v (run bash scripts/deps.sh)", err)
	}
	return string(b)
}

// refScript is scripts/ref/jinja.mjs, found from this file's location.
func refScript(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller failed")
	}
	return filepath.Join(filepath.Dir(file), "..", "scripts", "ref", "jinja.mjs")
}

// refCase is one rendering for @huggingface/jinja.
type refCase struct {
	Template string
	Messages []Message
	Opts     Options
}

// refResult is @huggingface/jinja's output or error for one case.
type refResult struct {
	Output *string `json:"output"`
	Error  *string `json:"error"`
}

// renderRef renders all cases with @huggingface/jinja in one node process. Options.Now, when set,
// is given to both sides as the fixed strftime_now date (UTC).
func renderRef(t testing.TB, cases []refCase) []refResult {
	t.Helper()
	dir := refDir(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found (%v): run bash scripts/deps.sh", err)
	}
	in := make([]map[string]any, len(cases))
	for i, c := range cases {
		m := map[string]any{}
		for k, v := range c.Opts.Extra {
			m[k] = v
		}
		msgs := c.Messages
		if msgs == nil {
			msgs = []Message{}
		}
		m["template"] = c.Template
		m["messages"] = msgs
		m["bos_token"] = c.Opts.BOS
		m["eos_token"] = c.Opts.EOS
		m["add_generation_prompt"] = c.Opts.AddGenerationPrompt
		if !c.Opts.Now.IsZero() {
			m["now"] = c.Opts.Now.UTC().Format(time.RFC3339)
		}
		in[i] = m
	}
	body, err := json.Marshal(map[string]any{"cases": in})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, refScript(t))
	cmd.Env = append(os.Environ(), "CB_REF_DIR="+dir)
	cmd.Stdin = bytes.NewReader(body)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", refScript(t), err, stderr.String())
	}
	var res []refResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("decode node output: %v", err)
	}
	if len(res) != len(cases) {
		t.Fatalf("node returned %d results for %d cases", len(res), len(cases))
	}
	return res
}
