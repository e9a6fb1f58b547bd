package scheduler

import (
	"testing"

	"github.com/cacheblend/cacheblend/engine/internal/enginetest"
)

// TestReuseCountsFollowTheWorker: the reuse counts of a request are the
// plan's when the worker reports it loaded all of it, and lowered to what
// it loaded when it reports less (a failed retrieve computes the prompt).
func TestReuseCountsFollowTheWorker(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		noLoad                    bool
		stepTokens                int
		wantReused, wantPrefixLeg int
	}{
		{"all loaded", false, 0, 200, 100},
		{"nothing loaded", true, 0, 0, 0},
		{"several prefill steps: the plan's counts", true, 128, 200, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := enginetest.NewWorker(256, 16, 4096)
			w.ReportNoLoad = tc.noLoad
			h := newHarness(t, opts{worker: w, blend: &enginetest.Blend{Result: prefixResult(100, 200, 300)},
				cfg: Config{StepTokenBudget: tc.stepTokens}})
			res := run(t, h.s, &Request{ID: "r", Prompt: prompt(400, 11), MaxTokens: 2})
			if res.Err != nil || res.ReusedTokens != tc.wantReused || res.PrefixReusedTokens != tc.wantPrefixLeg {
				t.Fatalf("reused %d (prefix leg %d), want %d (%d): %+v", res.ReusedTokens, res.PrefixReusedTokens, tc.wantReused, tc.wantPrefixLeg, res.Err)
			}
		})
	}
}
