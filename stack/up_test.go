package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/cacheblend/cacheblend/rpc/mtls"
)

// fakeEnv makes the test binary act as a fake cb (see fakeCB).
const fakeEnv = "STACK_TEST_FAKE_CB"

// fakeCB is a stand-in for cb blend/worker/engine: it parses the flags Up
// passes, loads its certificate with mtls.Load when given one (exiting 3
// when that fails, so that Up fails), writes what it got as JSON to
// $STACK_TEST_FAKE_CB/<command>.json, serves /health on --addr for the
// engine, announces READY and waits for SIGTERM.
func fakeCB(args []string) int {
	if len(args) == 0 {
		return 2
	}
	cmd := args[0]
	fs := pflag.NewFlagSet(cmd, pflag.ContinueOnError)
	addr := fs.String("addr", "", "")
	fs.String("metrics-addr", "", "")
	fs.String("worker", "", "")
	fs.String("blend", "", "")
	fs.String("kv-socket", "", "")
	fs.String("blend-kv-socket", "", "")
	l2Dir := fs.String("l2-dir", "", "")
	l2Bytes := fs.String("l2-bytes", "", "")
	fs.String("redis-url", "", "")
	var files mtls.Files
	fs.StringVar(&files.Cert, "tls-cert", "", "")
	fs.StringVar(&files.Key, "tls-key", "", "")
	fs.StringVar(&files.CA, "tls-ca", "", "")
	fs.String("extra", "", "")
	if err := fs.Parse(args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	role := mtls.Role("cb-" + cmd)
	got := map[string]any{"files": files, "l2_dir": *l2Dir, "l2_bytes": *l2Bytes, "redis_url_env": os.Getenv("CB_BLEND_REDIS_URL")}
	if files.Enabled() {
		id, err := mtls.Load(files, role)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		got["role"] = id.Role()
	}
	b, _ := json.Marshal(got)
	if err := os.WriteFile(filepath.Join(os.Getenv(fakeEnv), cmd+".json"), b, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if cmd == "engine" {
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		fmt.Println("READY cb-engine api=http://" + ln.Addr().String())
	} else {
		fmt.Println("READY cb-" + cmd + " grpc=" + *addr)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return 0
}

// fakeUp runs Up with the test binary as the fake cb.
func fakeUp(t *testing.T, cfg UpConfig) (*Stack, string) {
	t.Helper()
	out := t.TempDir()
	t.Setenv(fakeEnv, out)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Exe, cfg.APIAddr = exe, "127.0.0.1:0"
	cfg.Supervisor = Config{Logs: &syncBuf{}, ReadyTimeout: 30 * time.Second, StopTimeout: 5 * time.Second}
	st, err := Up(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st, out
}

func readFake(t *testing.T, out, cmd string) (files mtls.Files, role string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, cmd+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Files mtls.Files
		Role  string
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	return got.Files, got.Role
}

// TestUpMutualTLS: Up generates a CA and a certificate per process into a
// private directory, hands each process its own (each loads it as its
// role), lets extra flags come after them, and removes them at Shutdown.
func TestUpMutualTLS(t *testing.T) {
	st, out := fakeUp(t, UpConfig{WorkerArgs: []string{"--extra=x"}})
	dir := st.TLSDir()
	if dir == "" || !st.Endpoints().MutualTLS {
		t.Fatalf("TLSDir %q, MutualTLS %v", dir, st.Endpoints().MutualTLS)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("certificate directory: %v %v", fi, err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, _ := e.Info(); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v", e.Name(), fi.Mode().Perm())
		}
		if strings.Contains(e.Name(), "ca-key") {
			t.Errorf("CA key written: %s", e.Name())
		}
	}
	for _, cmd := range []string{"blend", "worker", "engine"} {
		files, role := readFake(t, out, cmd)
		if want := mtls.DirFiles(dir, mtls.Role("cb-"+cmd)); files != want || role != "cb-"+cmd {
			t.Errorf("%s got %+v as %q, want %+v", cmd, files, role, want)
		}
	}
	if err := st.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("certificates not removed at shutdown: %v", err)
	}
}

// TestUpPlaintext: with Plaintext no certificates are made or passed.
func TestUpPlaintext(t *testing.T) {
	st, out := fakeUp(t, UpConfig{Plaintext: true})
	defer st.Shutdown(context.Background())
	if st.TLSDir() != "" || st.Endpoints().MutualTLS {
		t.Fatalf("TLSDir %q, MutualTLS %v", st.TLSDir(), st.Endpoints().MutualTLS)
	}
	for _, cmd := range []string{"blend", "worker", "engine"} {
		if files, _ := readFake(t, out, cmd); files.Enabled() {
			t.Errorf("%s got TLS files %+v", cmd, files)
		}
	}
}

// TestUpBadCertificateFails: a process that refuses its certificate (here
// the extra flags hand the worker the engine's) makes Up fail, and the
// certificates are removed all the same.
func TestUpBadCertificateFails(t *testing.T) {
	out := t.TempDir()
	t.Setenv(fakeEnv, out)
	exe, _ := os.Executable()
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where Up makes its certificate directory
	// The worker's extra flag points at a file that is not the worker's
	// certificate: Load fails and the fake exits 3.
	_, err := Up(context.Background(), UpConfig{Exe: exe, APIAddr: "127.0.0.1:0",
		WorkerArgs: []string{"--tls-cert=/nonexistent/cert.pem"},
		Supervisor: Config{Logs: &syncBuf{}, ReadyTimeout: 30 * time.Second}})
	if err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Up = %v, want the worker's exit", err)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, runDirPrefix+"*")); len(left) > 0 {
		t.Errorf("run directory (certificates) left behind: %v", left)
	}
}

func TestTPArgs(t *testing.T) {
	cases := []struct {
		name string
		cfg  UpConfig
		want []string
	}{
		{"default", UpConfig{WorkerArgs: []string{"--layers=4"}}, []string{"--layers=4"}},
		{"one rank", UpConfig{TP: 1}, nil},
		{"two ranks", UpConfig{TP: 2, WorkerArgs: []string{"--layers=4"}}, []string{"--layers=4", "--tp=2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := tpArgs(c.cfg)
			if !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			if c.cfg.TP > 1 && len(c.cfg.WorkerArgs) != 1 {
				t.Fatal("tpArgs changed the caller's WorkerArgs")
			}
		})
	}
}
