package stack

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// The run directory of one Up: its private keys (the generated
// certificates), the blend servers' KV socket directories and the Redis
// server's configuration (its password) live in
// $TMPDIR/cb-up-run-<pid>-<random> (mode 0700), with an owner file naming
// the pid and that process's start time. Shutdown removes it; a cb up
// killed with SIGKILL cannot, so every Up first removes the run
// directories whose owner process is gone (CleanStaleRunDirs). Keys on
// disk were chosen over memory-only keys (memfd) because every process is
// given its key as a file path (--tls-key), like a deployment's own
// certificates.
const (
	runDirPrefix = "cb-up-run-"
	ownerFile    = "owner"
)

// makeRunDir creates this process's new run directory and its owner file.
func makeRunDir() (string, error) {
	dir, err := os.MkdirTemp("", runDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", fmt.Errorf("stack: run directory: %w", err)
	}
	start, err := procStart(os.Getpid())
	if err == nil {
		// Written aside and renamed into place (WriteFileAtomic): another
		// Up's CleanStaleRunDirs sees no owner file (a directory being set
		// up) or the whole one, never an empty or half-written one, which
		// it would take for a dead owner's and remove.
		err = WriteFileAtomic(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+" "+start+"\n"), 0o600)
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("stack: run directory owner: %w", err)
	}
	return dir, nil
}

// makeSubdir creates dir/name (0700) and returns it.
func makeSubdir(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		return "", fmt.Errorf("stack: %w", err)
	}
	return p, nil
}

// procStart is the start time of process pid (field 22 of
// /proc/<pid>/stat, in clock ticks since boot): with the pid it tells a
// process apart from a later one that reused its pid.
func procStart(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return "", errors.New("stack: malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", errors.New("stack: malformed /proc stat")
	}
	return f[19], nil
}

// ownerAlive reports whether the process an owner file names still runs
// (same pid and start time). Without an owner file the directory is being
// set up by the process its name gives (namePID), or was left by it when it
// was killed between MkdirTemp and writing the file: alive while that
// process runs.
func ownerAlive(dir string, namePID int) bool {
	f, err := os.OpenFile(filepath.Join(dir, ownerFile), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		_, err := procStart(namePID)
		return err == nil
	}
	defer f.Close()
	b := make([]byte, 64)
	n, _ := f.Read(b)
	fields := strings.Fields(string(b[:n]))
	if len(fields) != 2 {
		return false
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil || pid <= 0 {
		return false
	}
	start, err := procStart(pid)
	return err == nil && start == fields[1]
}

// CleanStaleRunDirs removes, from $TMPDIR, the run directories of earlier
// Ups whose process is gone (killed with SIGKILL: their private keys, KV
// sockets and Redis configuration), and returns them. Only directories (not
// symbolic links) named cb-up-run-<pid>-…, owned by this user, are
// considered; one whose owner runs is left. Errors are logged to logger
// (nil: not logged).
func CleanStaleRunDirs(logger *slog.Logger) []string {
	tmp := os.TempDir()
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), runDirPrefix)
		pidStr, _, ok2 := strings.Cut(rest, "-")
		if !ok || !ok2 || !e.IsDir() || e.Type()&fs.ModeSymlink != 0 {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 {
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		fi, err := os.Lstat(dir)
		if err != nil || !fi.IsDir() {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
			continue
		}
		if ownerAlive(dir, pid) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			if logger != nil {
				logger.Warn("stale run directory not removed", "dir", dir, "err", err)
			}
			continue
		}
		removed = append(removed, dir)
	}
	if len(removed) > 0 && logger != nil {
		logger.Info("removed the run directories of stacks killed before they could clean up (private keys, KV sockets)", "dirs", removed)
	}
	return removed
}
