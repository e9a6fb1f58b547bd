package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/eval"
)

// TestEvalStack runs `cb eval` in its default stack mode, bounded (2
// prompts of 2 documents, ratios 0 and 0.3, one repeat): it starts the
// stack as separate processes, ingests the documents and times every
// configuration through the API against full prefills; every point carries
// a TTFT speedup measured on requests that really reused the documents
// off the prefix, and full reuse is faster than a full prefill.
func TestEvalStack(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "eval.json")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cbBin, "eval", "--prompts=2", "--docs=2", "--ratios=0,0.3", "--repeats=1",
		"--positions=2", "--verbose", "--json="+out)
	cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+dir, "OTEL_SDK_DISABLED=true")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Run(); err != nil {
		t.Fatalf("cb eval: %v\n%s", err, tail(logs.String(), 80))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep eval.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Stack == nil || rep.Stack.Repeats != 1 || rep.Stack.PromptTokens <= 0 || len(rep.Points) != 3 {
		t.Fatalf("report %s", b)
	}
	for _, p := range rep.Points {
		if p.Requests != 2 || p.FullTTFTMs <= 0 || p.BlendTTFTMs <= 0 || p.TTFTSpeedup <= 0 || p.NonPrefixHitTokens <= 0 || p.ModelSpeedup <= 0 {
			t.Fatalf("point %+v", p)
		}
		if p.Rule == "full_reuse" && p.TTFTSpeedup <= 1 {
			t.Fatalf("full reuse through the stack no faster than a full prefill: %+v", p)
		}
	}
	if s := logs.String(); !strings.Contains(s, "TTFT speedup") || !strings.Contains(s, "stack up in") {
		t.Fatalf("output:\n%s", s)
	}
}
