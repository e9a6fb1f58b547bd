package chunkstore

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// smallFS mounts a tmpfs of size (mount's syntax, e.g. "160k") on a
// directory of the test's own and unmounts it at cleanup. It needs root
// (CI runs the tests as root).
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a %s tmpfs (the test needs root): %v %s", size, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// TestDiskFull replays a full disk under the L2: the Put that cannot write
// its file says so (L2WriteError, DiskFull, still in L1), the store reports
// the disk full, a restart keeps every chunk whose Put succeeded (no temp
// file left, nothing else removed), and once there is room again the
// pending chunks are written after the next successful Put.
func TestDiskFull(t *testing.T) {
	root := smallFS(t, "192k")
	ballast := filepath.Join(root, "ballast")
	if err := os.WriteFile(ballast, make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "l2")
	s, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	var stored, pending []Key
	var wErr *L2WriteError
	for i := 0; i < 40 && len(pending) < 2; i++ {
		c := randChunk(t, uint64(100+i), 64) // ~16 KiB files
		err := s.Put(c)
		switch {
		case err == nil:
			stored = append(stored, c.Key)
		case errors.As(err, &wErr):
			if !wErr.InL1 || !wErr.DiskFull || !errors.Is(err, ErrL2Write) {
				t.Fatalf("put %d: %+v", i, wErr)
			}
			pending = append(pending, c.Key)
		default:
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if len(stored) == 0 || len(pending) == 0 {
		t.Fatalf("stored %d, failed %d: the disk never filled (or was full at once)", len(stored), len(pending))
	}
	st := s.Stats()
	if !st.DiskFull || !strings.Contains(st.LastWriteError, "no space left on device") || st.PendingL2 != len(pending) {
		t.Fatalf("stats after the disk filled: DiskFull %v, LastWriteError %q, PendingL2 %d (want %d)", st.DiskFull, st.LastWriteError, st.PendingL2, len(pending))
	}
	for _, k := range pending {
		if s.Durable(k) || s.Contains(k) != TierL1 {
			t.Fatalf("pending chunk %s: durable %v, tier %v", k, s.Durable(k), s.Contains(k))
		}
	}

	// A restart on the full disk keeps every complete chunk file.
	s2, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range stored {
		if _, tier, err := s2.Get(k); err != nil || tier != TierL2 {
			t.Fatalf("chunk %s after the restart: tier %v, %v", k, tier, err)
		}
	}
	names, _ := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	if len(names) != 0 {
		t.Fatalf("temp files left: %v", names)
	}
	t.Logf("disk full after %d chunks; all %d kept across the restart", len(stored), len(stored))

	// Room again: the next successful Put writes the pending chunks.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	for i := 0; s.Stats().PendingL2 > 0 && i < len(pending); i++ {
		if err := s.Put(randChunk(t, uint64(500+i), 4)); err != nil {
			t.Fatalf("put after freeing space: %v", err)
		}
	}
	st = s.Stats()
	if st.DiskFull || st.LastWriteError != "" || st.PendingL2 != 0 {
		t.Fatalf("after freeing space: DiskFull %v, LastWriteError %q, PendingL2 %d", st.DiskFull, st.LastWriteError, st.PendingL2)
	}
	for _, k := range pending {
		if !s.Durable(k) {
			t.Fatalf("pending chunk %s not written once there was room", k)
		}
	}
}

// TestUnsafeDirRefused: an L2 directory that is a symbolic link (to a
// victim's directory) is refused and nothing in the target is touched; a
// chunk file that does not decode is renamed aside, never deleted.
func TestUnsafeDirRefused(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.Mkdir(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	k := randChunk(t, 1, 4).Key
	files := map[string]string{
		k.String() + fileExt:              "not a chunk",
		tempPrefix + k.String() + "-1234": "looks like a temp file",
	}
	for name, body := range files {
		writeFile(t, filepath.Join(victim, name), []byte(body))
	}
	link := filepath.Join(base, "l2")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: link}); !errors.Is(err, ErrUnsafeDir) {
		t.Fatalf("New on a symlinked directory: %v, want ErrUnsafeDir", err)
	}
	for name, body := range files {
		if b, err := os.ReadFile(filepath.Join(victim, name)); err != nil || string(b) != body {
			t.Fatalf("victim file %s: %q %v", name, b, err)
		}
	}

	// The store's own directory: an undecodable chunk file is quarantined.
	dir := filepath.Join(base, "own")
	s, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	_ = s
	writeFile(t, filepath.Join(dir, k.String()+fileExt), []byte("garbage that does not decode"))
	s, err = New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(k); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("get of a corrupt file: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, k.String()+fileExt+quarantineExt)); err != nil || string(b) != "garbage that does not decode" {
		t.Fatalf("quarantined file: %q %v", b, err)
	}
	if st := s.Stats(); st.Quarantined != 1 || st.Corrupt != 1 {
		t.Fatalf("quarantined %d corrupt %d", st.Quarantined, st.Corrupt)
	}
}
