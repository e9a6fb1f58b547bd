package stack

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMakeStateDir(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, dir string)
		wantErr error // nil: success; errAny: some error
	}{
		{"missing: created", func(*testing.T, string) {}, nil},
		{"existing private", func(t *testing.T, dir string) { mustMkdir(t, dir, 0o700) }, nil},
		{"existing open to others", func(t *testing.T, dir string) { mustMkdir(t, dir, 0o755) }, ErrStateDirAccess},
		{"existing open to the group", func(t *testing.T, dir string) { mustMkdir(t, dir, 0o750) }, ErrStateDirAccess},
		{"a file", func(t *testing.T, dir string) {
			if err := os.WriteFile(dir, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, errAny},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "a", "state")
			if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
				t.Fatal(err)
			}
			tc.prepare(t, dir)
			err := MakeStateDir(dir)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatal(err)
			case tc.wantErr == errAny && err == nil, tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("MakeStateDir = %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil {
				if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
					t.Fatalf("state directory %v %v", fi, err)
				}
			}
		})
	}
}

var errAny = errors.New("any error")

func mustMkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultStateDir(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, tc := range []struct {
		name, xdg, want string
	}{
		{"XDG_STATE_HOME", "/x/state", "/x/state/cacheblend"},
		{"relative XDG_STATE_HOME ignored", "rel", filepath.Join(home, ".local/state/cacheblend")},
		{"unset", "", filepath.Join(home, ".local/state/cacheblend")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("XDG_STATE_HOME", tc.xdg)
			if got, err := DefaultStateDir(); err != nil || got != tc.want {
				t.Fatalf("DefaultStateDir() = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestUpStateDir: with a state directory the blend server keeps its L2 in
// it; an existing directory others may read is refused.
func TestUpStateDir(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	st, out := fakeUp(t, UpConfig{Plaintext: true, StateDir: state})
	defer st.Shutdown(context.Background())
	b, err := os.ReadFile(filepath.Join(out, "blend.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		L2Dir string `json:"l2_dir"`
	}
	if err := json.Unmarshal(b, &got); err != nil || got.L2Dir != filepath.Join(state, "l2") {
		t.Fatalf("blend got --l2-dir %q (%v)", got.L2Dir, err)
	}
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state directory %v %v", fi, err)
	}

	open := filepath.Join(t.TempDir(), "open")
	mustMkdir(t, open, 0o755)
	exe, _ := os.Executable()
	_, err = Up(context.Background(), UpConfig{Exe: exe, APIAddr: "127.0.0.1:0", Plaintext: true, StateDir: open,
		Supervisor: Config{Logs: &syncBuf{}, ReadyTimeout: 30 * time.Second}})
	if !errors.Is(err, ErrStateDirAccess) {
		t.Fatalf("Up with an open state directory = %v", err)
	}
}

// TestEndpointsFileRewrittenOnRestart: a process the supervisor restarts
// gets its new pid in the endpoints file.
func TestEndpointsFileRewrittenOnRestart(t *testing.T) {
	st, _ := fakeUp(t, UpConfig{Plaintext: true})
	defer st.Shutdown(context.Background())
	path := filepath.Join(t.TempDir(), "endpoints.json")
	if err := st.WriteEndpoints(path); err != nil {
		t.Fatal(err)
	}
	read := func() Endpoints {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var eps Endpoints
		if err := json.Unmarshal(b, &eps); err != nil {
			t.Fatal(err)
		}
		return eps
	}
	before := read()
	for _, tc := range []struct {
		name string
		pid  func(Endpoints) int
	}{
		{"cb-worker", func(e Endpoints) int { return e.Worker.PID }},
		{"cb-blend", func(e Endpoints) int { return e.Blend.PID }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := tc.pid(before)
			if old == 0 {
				t.Fatal("no pid in the endpoints file")
			}
			if err := st.Supervisor().Signal(tc.name, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second) // the restart backoff is 0.5 s
			for {
				now := read()
				if p := tc.pid(now); p != old && p != 0 {
					if p != tc.pid(st.Endpoints()) || syscall.Kill(p, 0) != nil {
						t.Fatalf("endpoints file pid %d, stack %d", p, tc.pid(st.Endpoints()))
					}
					if now.Engine.PID != before.Engine.PID {
						t.Fatalf("the engine's pid changed: %d -> %d", before.Engine.PID, now.Engine.PID)
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("endpoints file still has pid %d", old)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestEndpointsFileRewrittenOnNodeRestart: in a multi-node stack, a process
// of node 1 restarted gets its new pid in the head's endpoints file (its
// node entry), and node 1's state directory is its own.
func TestEndpointsFileRewrittenOnNodeRestart(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	st, _ := fakeUp(t, UpConfig{Plaintext: true, Nodes: 2, NoGateway: true, RedisURL: "redis://127.0.0.1:1", FleetKey: strings.Repeat("k", 32), StateDir: state})
	defer st.Shutdown(context.Background())
	path := filepath.Join(t.TempDir(), "endpoints.json")
	if err := st.WriteEndpoints(path); err != nil {
		t.Fatal(err)
	}
	var before Endpoints
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &before); err != nil || len(before.Nodes) != 2 || before.Nodes[1].Worker.PID == 0 {
		t.Fatalf("endpoints %s (%v)", b, err)
	}
	if err := st.others[0].Supervisor().Signal("cb-worker", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var now Endpoints
		b, _ := os.ReadFile(path)
		_ = json.Unmarshal(b, &now)
		if len(now.Nodes) == 2 && now.Nodes[1].Worker.PID != before.Nodes[1].Worker.PID && now.Nodes[1].Worker.PID != 0 {
			if now.Nodes[0].Worker.PID != before.Nodes[0].Worker.PID {
				t.Fatalf("node 0's worker pid changed too: %d -> %d", before.Nodes[0].Worker.PID, now.Nodes[0].Worker.PID)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoints file still names node 1's killed worker: %s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if fi, err := os.Stat(filepath.Join(state, "node1")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("node 1's state directory: %v %v", fi, err)
	}
}

// TestEndpointsIsACopy: what Endpoints returns does not change when the
// stack updates its own (a restarted process's pid, the node list), so
// callers may read it while supervisor goroutines write.
func TestEndpointsIsACopy(t *testing.T) {
	s := &Stack{eps: Endpoints{
		Gateway: &Endpoint{PID: 1}, Collector: &Endpoint{UI: "a"}, Redis: &RedisEndpoint{PID: 2},
		Nodes: []NodeEndpoints{{Engine: Endpoint{PID: 3}}},
	}}
	got := s.Endpoints()
	s.setEndpoint(func(e *Endpoints) {
		e.Gateway.PID, e.Collector.UI, e.Redis.PID, e.Nodes[0].Engine.PID = 10, "b", 20, 30
	})
	if got.Gateway.PID != 1 || got.Collector.UI != "a" || got.Redis.PID != 2 || got.Nodes[0].Engine.PID != 3 {
		t.Fatalf("the caller's copy changed: %+v %+v %+v %+v", *got.Gateway, *got.Collector, *got.Redis, got.Nodes)
	}
	if now := s.Endpoints(); now.Gateway.PID != 10 || now.Nodes[0].Engine.PID != 30 {
		t.Fatalf("the stack's endpoints were not updated: %+v", now)
	}
}

func TestOpenLogFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	f, err := OpenLogFile(dir, "demo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := filepath.Dir(f.Name()); got != filepath.Join(dir, "logs") {
		t.Fatalf("log file in %s, want %s/logs", got, dir)
	}
	for path, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, filepath.Join(dir, "logs"): 0o700 | os.ModeDir, f.Name(): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
		}
	}
}
