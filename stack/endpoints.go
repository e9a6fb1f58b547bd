package stack

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// supervision returns cfg with an OnReady that records every (re)started
// process's pid in s's endpoints and rewrites the endpoints file, then
// calls cfg's own OnReady.
func (s *Stack) supervision(cfg Config) Config {
	user := cfg.OnReady
	cfg.OnReady = func(r Ready) {
		s.onReady(r)
		if user != nil {
			user(r)
		}
	}
	return cfg
}

// setEndpoint changes s's endpoints under its lock.
func (s *Stack) setEndpoint(f func(*Endpoints)) {
	s.epMu.Lock()
	defer s.epMu.Unlock()
	f(&s.eps)
}

// onReady records the pid of a process that announced itself ready (at its
// first start, set again by Up, or after a restart) and, once the endpoints
// file was written, rewrites it (the head's, for a node of a multi-node
// stack).
func (s *Stack) onReady(r Ready) {
	s.epMu.Lock()
	var ep *Endpoint
	switch r.Service {
	case "cb-engine":
		ep = &s.eps.Engine
	case "cb-worker":
		ep = &s.eps.Worker
	case "cb-blend":
		ep = &s.eps.Blend
	case "cb-gateway":
		ep = s.eps.Gateway
	case "redis-server":
		if s.eps.Redis != nil && s.eps.Redis.PID != 0 {
			s.eps.Redis.PID = r.PID
		}
	}
	if ep != nil && ep.PID != 0 { // 0: the first start, recorded by Up
		ep.PID = r.PID
	}
	head := s.head
	s.epMu.Unlock()
	if head == nil {
		head = s
	}
	head.refreshNodes()
}

// refreshNodes copies every node's endpoints into the head's node list
// and rewrites the endpoints file when WriteEndpoints wrote one (a failure
// is logged: the stack keeps serving).
func (s *Stack) refreshNodes() {
	s.epMu.Lock()
	others := s.others
	s.epMu.Unlock()
	eps := make([]Endpoints, 1+len(others)) // eps[0], s's own, is read under its lock below
	for i, n := range others {
		eps[1+i] = n.Endpoints()
	}
	s.epMu.Lock()
	defer s.epMu.Unlock()
	if len(s.eps.Nodes) == len(eps) {
		eps[0] = s.eps
		for i, e := range eps {
			s.eps.Nodes[i].Engine, s.eps.Nodes[i].Worker, s.eps.Nodes[i].Blend = e.Engine, e.Worker, e.Blend
		}
	}
	if s.endpointsFile == "" {
		return
	}
	if err := s.writeEndpointsLocked(); err != nil && s.sup != nil {
		s.sup.cfg.Logger.Error("endpoints file not rewritten", "file", s.endpointsFile, "err", err)
	}
}

// ErrStateDirAccess reports a state directory that group or others may
// access.
var ErrStateDirAccess = errors.New("stack: state directory is accessible to other users")

// ErrStateDirUnsafe reports a state directory that is a symbolic link, not
// a directory, or owned by another user: Up refuses it rather than write
// (and remove files) where the link points.
var ErrStateDirUnsafe = errors.New("stack: unsafe state directory")

// MakeStateDir creates dir (its missing parents the usual way, dir itself
// with mode 0700) when missing, and checks it without following a symbolic
// link at dir: a directory (ErrStateDirUnsafe for a link or anything else)
// of this user (ErrStateDirUnsafe) that group and others cannot access
// (ErrStateDirAccess).
func MakeStateDir(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return fmt.Errorf("stack: state directory: %w", err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("stack: state directory: %w", err)
		}
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("stack: state directory: %w", err)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link (not followed: give the directory itself)", ErrStateDirUnsafe, dir)
	case !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory", ErrStateDirUnsafe, dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("%w: %s belongs to uid %d, not %d", ErrStateDirUnsafe, dir, st.Uid, os.Getuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%w: %s has mode %v (want 0700: chmod 700 it)", ErrStateDirAccess, dir, fi.Mode().Perm())
	}
	return nil
}

// DefaultStateDir is the state directory cb up uses by default:
// $XDG_STATE_HOME/cacheblend, else ~/.local/state/cacheblend.
func DefaultStateDir() (string, error) {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "cacheblend"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("stack: default state directory: %w", err)
	}
	return filepath.Join(home, ".local", "state", "cacheblend"), nil
}

// OpenLogFile creates a log file for one run of name (e.g. "demo") in the logs directory of
// the state directory dir (MakeStateDir; the logs directory 0700):
// <dir>/logs/<name>-<UTC time>.log, mode 0600 (the logs may hold request details). The caller
// closes it.
func OpenLogFile(dir, name string) (*os.File, error) {
	logs := filepath.Join(dir, "logs")
	if err := MakeStateDir(dir); err != nil {
		return nil, err
	}
	if err := MakeStateDir(logs); err != nil {
		return nil, fmt.Errorf("stack: logs directory: %w", err)
	}
	path := filepath.Join(logs, name+"-"+time.Now().UTC().Format("20060102-150405.000")+".log")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("stack: log file: %w", err)
	}
	return f, nil
}
