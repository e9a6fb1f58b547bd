package stack

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// A run directory without its owner file yet is another Up being set up
// while the process its name gives runs, and is kept; one whose process is
// gone is removed.
func TestCleanStaleRunDirsWithoutOwnerFile(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	live := filepath.Join(tmp, runDirPrefix+strconv.Itoa(os.Getpid())+"-setup")
	dead := filepath.Join(tmp, runDirPrefix+strconv.Itoa(deadPID(t))+"-left")
	for _, d := range []string{live, dead} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	removed := CleanStaleRunDirs(nil)
	if !slices.Equal(removed, []string{dead}) {
		t.Fatalf("removed %v, want only %s", removed, dead)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("the directory being set up is gone: %v", err)
	}
}

// deadPID returns a pid no process has.
func deadPID(t *testing.T) int {
	for pid := 4194000; pid > 4000000; pid-- {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) {
			return pid
		}
	}
	t.Fatal("no free pid found")
	return 0
}

// Run directories being made while another Up cleans stale ones are never
// taken for stale: the owner file appears whole or not at all (a reader of
// a half-written file took a live Up's keys and KV sockets away — CI saw a
// stack fail to start that way).
func TestCleanStaleRunDirsWhileAnotherUpStarts(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	stop := make(chan struct{})
	done := make(chan []string)
	go func() {
		var removed []string
		for {
			select {
			case <-stop:
				done <- removed
				return
			default:
				removed = append(removed, CleanStaleRunDirs(nil)...)
			}
		}
	}()
	var made []string
	for range 300 {
		dir, err := makeRunDir()
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, dir)
	}
	close(stop)
	if removed := <-done; len(removed) > 0 {
		t.Fatalf("live run directories removed as stale: %d of %d (e.g. %s)", len(removed), len(made), removed[0])
	}
	for _, d := range made {
		if _, err := os.Stat(filepath.Join(d, ownerFile)); err != nil {
			t.Fatalf("run directory %s: %v", d, err)
		}
	}
}
