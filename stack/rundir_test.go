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
