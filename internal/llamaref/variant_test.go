package llamaref

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"
)

// TestCPUVariant starts the reference with only the AVX2 ("haswell") CPU backend and checks that
// it is the one loaded, that it computes the fixture's logits as the backend ggml picks by
// itself does (within float rounding: the kernels differ), and that an unknown variant is an
// error naming the installed ones.
func TestCPUVariant(t *testing.T) {
	if !cpu.X86.HasAVX2 || !cpu.X86.HasFMA {
		t.Fatal("this test needs a CPU with AVX2 and FMA (the haswell backend)")
	}
	ref := testRef(t)
	model := tinyModels(t)[0]
	positions := []int{0, 5, len(evalTokens) - 1}
	want, err := ref.LogitsWith(model, evalTokens, positions, EvalOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	best := ref.CPUBackend()
	if best == "" {
		t.Fatal("no CPU backend in the reference's memory map")
	}

	hw, err := StartWith(context.Background(), StartOptions{CPUVariant: "haswell"})
	if err != nil {
		t.Fatal(err)
	}
	defer hw.Close()
	if got := hw.CPUBackend(); got != "haswell" {
		t.Fatalf("CPU backend %q loaded, want haswell", got)
	}
	if _, err := os.Stat(filepath.Join(Dir(), "cpu-haswell", "node_modules", "node-llama-cpp")); err != nil {
		t.Fatalf("variant tree: %v", err)
	}
	got, err := hw.LogitsWith(model, evalTokens, positions, EvalOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	var maxDiff, spread float64
	for r := range want {
		lo, hi := math.Inf(1), math.Inf(-1)
		for i, v := range want[r] {
			maxDiff = max(maxDiff, math.Abs(got[r][i]-v))
			lo, hi = min(lo, v), max(hi, v)
		}
		spread = max(spread, hi-lo)
	}
	t.Logf("haswell against %s: max |Δlogit| %.3g (logits spread over %.3g)", best, maxDiff, spread)
	if spread < 1 || maxDiff > 1e-3*spread {
		t.Fatalf("haswell logits differ from %s's by %.3g (spread %.3g)", best, maxDiff, spread)
	}

	_, err = StartWith(context.Background(), StartOptions{CPUVariant: "no-such-cpu"})
	if err == nil || !strings.Contains(err.Error(), "haswell") {
		t.Fatalf("unknown variant: error %v, want one naming the installed variants", err)
	}
}
