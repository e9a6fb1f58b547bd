package stack

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMakeStateDirRefusesUnsafe: the state directory is checked without
// following a symbolic link; a link (to a victim's directory), a file,
// another user's directory and one others may read are refused, and
// nothing in the victim's directory is touched.
func TestMakeStateDirRefusesUnsafe(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(base, "victimstate")
	if err := os.MkdirAll(filepath.Join(victim, "l2"), 0o700); err != nil {
		t.Fatal(err)
	}
	victimFile := filepath.Join(victim, "l2", "notes.chunk")
	if err := os.WriteFile(victimFile, []byte("victim data"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	os.WriteFile(file, nil, 0o600)
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o755)
	os.Chmod(open, 0o755)
	other := filepath.Join(base, "other")
	os.Mkdir(other, 0o700)
	if err := os.Chown(other, 65534, 65534); err != nil {
		t.Fatalf("chown (the test needs root): %v", err)
	}
	for _, tc := range []struct {
		name, dir string
		want      error
	}{
		{"symlink to a victim", link, ErrStateDirUnsafe},
		{"regular file", file, ErrStateDirUnsafe},
		{"another user's", other, ErrStateDirUnsafe},
		{"mode 0755", open, ErrStateDirAccess},
		{"new", filepath.Join(base, "a", "new"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := MakeStateDir(tc.dir)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("MakeStateDir(%s) = %v, want %v", tc.dir, err, tc.want)
			}
		})
	}
	// Up itself refuses the symlinked state directory before any process
	// starts; the victim's directory is untouched.
	out := t.TempDir()
	t.Setenv(fakeEnv, out)
	exe, _ := os.Executable()
	_, err := Up(context.Background(), UpConfig{Exe: exe, APIAddr: "127.0.0.1:0", Plaintext: true, StateDir: link,
		Supervisor: Config{Logs: &syncBuf{}, ReadyTimeout: 30 * time.Second}})
	if !errors.Is(err, ErrStateDirUnsafe) {
		t.Fatalf("Up with a symlinked state directory: %v", err)
	}
	if b, err := os.ReadFile(victimFile); err != nil || string(b) != "victim data" {
		t.Fatalf("victim file: %q %v", b, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(victim, "l2")); len(ents) != 1 {
		t.Fatalf("victim's directory changed: %v", ents)
	}
	if _, err := os.Stat(filepath.Join(out, "blend.json")); err == nil {
		t.Fatal("cb blend was started")
	}
}

// TestUpL2Budget: with a state directory Up passes a default L2 budget
// sized from the free space, an explicit one as given, none when negative.
func TestUpL2Budget(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	def, err := DefaultL2Budget(filepath.Dir(state), 1)
	if err != nil || def < 1<<20 {
		t.Fatalf("DefaultL2Budget = %d, %v", def, err)
	}
	for _, tc := range []struct {
		name  string
		bytes int64
		check func(got string) bool
	}{
		{"default", 0, func(got string) bool {
			n, err := strconv.ParseInt(got, 10, 64)
			return err == nil && n > def/2 && n < def*2 // the free space moves a little
		}},
		{"explicit", 5 << 20, func(got string) bool { return got == strconv.Itoa(5<<20) }},
		{"unbounded", -1, func(got string) bool { return got == "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, out := fakeUp(t, UpConfig{Plaintext: true, StateDir: state, L2Bytes: tc.bytes})
			defer st.Shutdown(context.Background())
			var got struct {
				L2Bytes string `json:"l2_bytes"`
			}
			b, _ := os.ReadFile(filepath.Join(out, "blend.json"))
			if err := json.Unmarshal(b, &got); err != nil || !tc.check(got.L2Bytes) {
				t.Fatalf("cb blend got --l2-bytes %q (%v); default %d", got.L2Bytes, err, def)
			}
		})
	}
}

// upChildEnv makes the test binary run Up (with the fake cb) and wait to
// be killed: it writes the run directory's path to <dir>/rundir.
const upChildEnv = "STACK_TEST_UP_CHILD"

func upChild(out string) int {
	os.Unsetenv(upChildEnv)
	os.Setenv(fakeEnv, out)
	exe, _ := os.Executable()
	st, err := Up(context.Background(), UpConfig{Exe: exe, APIAddr: "127.0.0.1:0",
		Supervisor: Config{Logs: os.Stderr, ReadyTimeout: 30 * time.Second}})
	if err != nil {
		return 2
	}
	if err := os.WriteFile(filepath.Join(out, "rundir"), []byte(filepath.Dir(st.TLSDir())), 0o600); err != nil {
		return 2
	}
	select {} // until SIGKILL
}

// TestSIGKILLedUpLeavesNoKeys replays a cb up killed with SIGKILL: its run
// directory (private keys, KV socket) outlives it, and the next Up removes
// it because its owner is gone, while a live stack's is kept.
func TestSIGKILLedUpLeavesNoKeys(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	out := t.TempDir()
	exe, _ := os.Executable()
	child := exec.Command(exe, "-test.run=^$")
	child.Env = append(os.Environ(), upChildEnv+"="+out)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var runDir string
	for deadline := time.Now().Add(30 * time.Second); runDir == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			child.Process.Kill()
			child.Wait()
			t.Fatal("the child cb up never came up")
		}
		b, _ := os.ReadFile(filepath.Join(out, "rundir"))
		runDir = string(b)
	}
	keys, _ := filepath.Glob(filepath.Join(runDir, "tls", "*key*"))
	if len(keys) == 0 || !strings.HasPrefix(runDir, filepath.Join(tmp, runDirPrefix+strconv.Itoa(child.Process.Pid)+"-")) {
		t.Fatalf("run directory %s, keys %v", runDir, keys)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	if _, err := os.Stat(keys[0]); err != nil {
		t.Fatalf("the killed stack's key is already gone (%v): the replay shows nothing", err)
	}
	// A live stack's run directory is kept by the next start.
	live, _ := fakeUp(t, UpConfig{})
	defer live.Shutdown(context.Background())
	if _, err := os.Stat(runDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the killed stack's run directory is left after the next start: %v", err)
	}
	if _, err := os.Stat(live.TLSDir()); err != nil {
		t.Fatalf("the live stack's certificates: %v", err)
	}
	if removed := CleanStaleRunDirs(nil); len(removed) != 0 {
		t.Fatalf("a live stack's run directory removed: %v", removed)
	}
}

// TestRedisSupervised: the fleet tier's redis-server under Up is supervised
// like the other processes: killed, it is reaped (no zombie) and restarted
// on the same address with the same password, its new pid in the
// endpoints; its password is in no command line.
func TestRedisSupervised(t *testing.T) {
	st, out := fakeUp(t, UpConfig{Plaintext: true, Nodes: 2, NoGateway: true})
	defer st.Shutdown(context.Background())
	ep := st.Endpoints().Redis
	if ep == nil || ep.PID == 0 {
		t.Fatalf("redis endpoint %+v", ep)
	}
	password := strings.TrimPrefix(strings.Split(strings.TrimPrefix(ep.URL, "redis://"), "@")[0], ":")
	addr := strings.Split(ep.URL, "@")[1]
	if cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(ep.PID) + "/cmdline"); len(cmdline) == 0 || strings.Contains(string(cmdline), password) {
		t.Fatalf("redis-server command line %q", cmdline)
	}
	var blend struct {
		RedisURLEnv string `json:"redis_url_env"`
	}
	b, _ := os.ReadFile(filepath.Join(out, "blend.json"))
	if err := json.Unmarshal(b, &blend); err != nil || blend.RedisURLEnv != ep.URL {
		t.Fatalf("cb blend's CB_BLEND_REDIS_URL %q (%v), want the fleet URL", blend.RedisURLEnv, err)
	}
	old := ep.PID
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for {
		now := st.Endpoints().Redis.PID
		if now != old && now != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := redisPing(ctx, addr, password)
			cancel()
			if err != nil {
				t.Fatalf("the restarted redis-server: %v", err)
			}
			break
		}
		if time.Since(t0) > 30*time.Second {
			t.Fatal("redis-server not restarted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("redis-server restarted in %v", time.Since(t0).Round(time.Millisecond))
	if stat, err := os.ReadFile("/proc/" + strconv.Itoa(old) + "/stat"); err == nil {
		t.Fatalf("the killed redis-server is still there (a zombie?): %s", stat)
	}
}
