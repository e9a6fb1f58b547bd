package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBlendKilledRequestsStillServedThenReuseResumes kills cb blend: the
// stack keeps serving (full prefill, the lookup failure recorded on the
// span), cb up restarts it, the worker re-registers its KV memory and
// reuse comes back.
func TestBlendKilledRequestsStillServedThenReuseResumes(t *testing.T) {
	e := startEnv(t, options{})
	sup := e.stack.Supervisor()
	if err := sup.Signal("cb-blend", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Served while the blend server is down (or restarting).
	e.chat("00-2bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ragPrompt(1, 2), 2)

	// cb up restarted it.
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := sup.Status()
		restarted := false
		for _, s := range st {
			if s.Name == "cb-blend" && s.Restarts >= 1 && s.Ready {
				restarted = true
			}
		}
		if restarted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cb-blend not restarted: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(e.logs.String(), "process died; restarting") {
		t.Error("cb up did not report the crash")
	}
	// Reuse resumes: once the worker has re-registered (within its 1 s
	// interval) a stored prompt is found again.
	e.ingest()
	var hit float64
	for i := 0; i < 20 && hit == 0; i++ {
		tp := fmt.Sprintf("00-3bf92f3577b34da6a3ce929d0e00%04x-00f067aa0ba902b7-01", i)
		e.chat(tp, ragPrompt(3, 0), 2)
		tr := e.trace(tp[3:35], "cb.request", "cb.execute")
		for _, s := range tr.Spans {
			if s.Name == "cb.request" {
				hit, _ = s.Attributes["hit_rate"].Number()
			}
		}
		if hit == 0 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	if hit <= 0 {
		t.Fatal("reuse did not resume after the blend server restarted")
	}
}
