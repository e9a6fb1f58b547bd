package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDiskFullIngest replays issue 27's full disk: the stack's state
// directory on a small tmpfs, L2 unbounded, documents ingested until the
// disk is full. The ingest answer says which documents are held in memory
// only (status memory_only, l2 "failed: no space left on device"), the
// blend server's gauge and /health say the disk is full, and a restart of
// the blend server keeps every sequence whose files were complete.
func TestDiskFullIngest(t *testing.T) {
	mnt := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=12m,mode=0700", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs (the test needs root): %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount: %v %s", err, out)
		}
	})
	state := filepath.Join(mnt, "state")
	e := startEnv(t, options{stateDir: state, blendArgs: []string{"--l2-bytes", "0"}}) // unbounded: fill the disk
	var stored, memOnly int
	for i := 0; i < 12 && memOnly == 0; i++ {
		var words []string
		for w := range 220 {
			words = append(words, fmt.Sprintf("d%dw%d", i, w))
		}
		var out struct {
			Data []struct {
				Status, L2, Error string
				Tokens            int
			}
		}
		code := e.post("/v1/documents", nil, map[string]any{"documents": []string{strings.Join(words, " ")}}, &out)
		if code != http.StatusOK || len(out.Data) != 1 {
			t.Fatalf("ingest %d: %d %+v", i, code, out)
		}
		d := out.Data[0]
		switch d.Status {
		case "stored":
			if d.L2 != "stored" {
				t.Fatalf("document %d stored with l2 %q", i, d.L2)
			}
			stored++
		case "memory_only":
			if !strings.Contains(d.L2, "no space left on device") {
				t.Fatalf("document %d memory_only with l2 %q", i, d.L2)
			}
			memOnly++
		default:
			t.Fatalf("document %d: %+v", i, d)
		}
		t.Logf("document %d (%d tokens): %s %s", i, d.Tokens, d.Status, d.L2)
	}
	if stored == 0 || memOnly == 0 {
		t.Fatalf("%d stored, %d memory only: the disk never filled (or was full at once)", stored, memOnly)
	}
	metricsURL := e.stack.Endpoints().Blend.Metrics
	if v := scrapeSum(t, metricsURL, "lmcache_blend_l2_disk_full"); v != 1 {
		t.Fatalf("lmcache_blend_l2_disk_full = %v", v)
	}
	health, _ := httpGet(strings.TrimSuffix(metricsURL, "/metrics") + "/health")
	if !strings.Contains(health, "l2: DISK FULL") {
		t.Fatalf("blend /health:\n%s", health)
	}
	seqs := func() []string {
		m, _ := filepath.Glob(filepath.Join(state, "l2", "sequences", "*.seq"))
		return m
	}
	before := seqs()
	if len(before) < stored {
		t.Fatalf("%d sequence files for %d documents stored", len(before), stored)
	}
	// Restart the blend server on the full disk.
	old := e.stack.Endpoints().Blend.PID
	if err := e.stack.Supervisor().Signal("cb-blend", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if pid := e.stack.Endpoints().Blend.PID; pid != old && pid != 0 {
			if _, err := httpGet(metricsURL); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the blend server did not come back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	after := seqs()
	if len(after) != len(before) {
		t.Fatalf("sequence files: %d before the restart, %d after", len(before), len(after))
	}
	if n := scrapeSum(t, metricsURL, "lmcache_blend_fingerprints"); n <= 0 {
		t.Fatalf("the restarted blend server restored no sequence (%v fingerprints)", n)
	}
	if !strings.Contains(e.logs.String(), "no space left on device") {
		t.Fatal("the full disk is not in the logs")
	}
	t.Logf("12 MiB state directory: %d documents stored, then %d held in memory only (disk full); %d sequence files kept across the restart", stored, memOnly, len(after))
}
