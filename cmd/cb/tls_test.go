package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/rpc/mtls"
)

// run executes cb with args and returns its output and error.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestCertsCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	out, err := run(t, "certs", "--dir", dir, "--host", "worker.example", "--host", "10.0.0.2", "--validity", "24h")
	if err != nil {
		t.Fatalf("cb certs: %v\n%s", err, out)
	}
	for _, r := range mtls.Roles {
		if _, err := mtls.Load(mtls.DirFiles(dir, r), r); err != nil {
			t.Errorf("%s: %v", r, err)
		}
		if !strings.Contains(out, mtls.KeyFile(r)) {
			t.Errorf("output does not list %s:\n%s", mtls.KeyFile(r), out)
		}
	}
	if _, err := run(t, "certs", "--dir", dir); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("second cb certs without --force: %v", err)
	}
	if out, err := run(t, "certs", "--dir", dir, "--force"); err != nil {
		t.Errorf("cb certs --force: %v\n%s", err, out)
	}
	if _, err := run(t, "certs"); err == nil {
		t.Error("cb certs without --dir succeeded")
	}
}

// TestTLSFlagsRefused: the processes read --tls-* (here from
// CB_<COMMAND>_TLS_*) and refuse to start with an incomplete set or with
// another process's certificate, before they bind anything.
func TestTLSFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	if err := mtls.WriteDir(dir, mtls.DefaultHosts, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"engine", "worker", "blend"} {
		t.Run(cmd+"/incomplete", func(t *testing.T) {
			t.Setenv(envName(cmd, "tls-cert"), filepath.Join(dir, "cb-"+cmd+".pem"))
			if _, err := run(t, cmd); err == nil || !strings.Contains(err.Error(), "incomplete TLS configuration") {
				t.Fatalf("err = %v", err)
			}
		})
		t.Run(cmd+"/another role", func(t *testing.T) {
			other := mtls.Blend
			if cmd == "blend" {
				other = mtls.Engine
			}
			f := mtls.DirFiles(dir, other)
			t.Setenv(envName(cmd, "tls-cert"), f.Cert)
			t.Setenv(envName(cmd, "tls-key"), f.Key)
			t.Setenv(envName(cmd, "tls-ca"), f.CA)
			if _, err := run(t, cmd); err == nil || !strings.Contains(err.Error(), "names role "+string(other)) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}
