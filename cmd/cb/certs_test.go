package main

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/rpc/mtls"
)

// TestCertsPerHost: cb certs init makes the operator's CA once; cb certs
// issue writes one host's files without touching another's; the processes
// of two hosts talk mutual TLS to each other at the addresses in their
// certificates; a host issued by another CA is refused both ways.
func TestCertsPerHost(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	if out, err := run(t, "certs", "init", "--dir", dir, "--validity", "48h"); err != nil {
		t.Fatalf("cb certs init: %v\n%s", err, out)
	}
	if _, err := run(t, "certs", "init", "--dir", dir); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("a second cb certs init: %v", err)
	}
	for _, name := range []string{mtls.CAFile, mtls.CAKeyFile} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", name, fi, err)
		}
	}
	issue := func(args ...string) (string, error) {
		return run(t, append([]string{"certs", "issue", "--dir", dir}, args...)...)
	}
	if out, err := issue("--host", "node-a", "--ip", "10.0.0.1", "--role", "engine,worker,blend"); err != nil {
		t.Fatalf("issue node-a: %v\n%s", err, out)
	}
	hostA := filepath.Join(dir, "hosts", "node-a")
	before := readDir(t, hostA)
	if out, err := issue("--host", "node-b", "--ip", "10.0.0.2", "--dns", "node-b.internal", "--role", "cb-worker", "--role", "blend"); err != nil {
		t.Fatalf("issue node-b: %v\n%s", err, out)
	}
	hostB := filepath.Join(dir, "hosts", "node-b")
	if after := readDir(t, hostA); !equalFiles(before, after) {
		t.Fatal("issuing node-b changed node-a's files")
	}
	if got := readDir(t, hostB); len(got) != 5 || got[mtls.CertFile(mtls.Engine)] != nil {
		t.Fatalf("node-b's files: %d, want ca.pem and worker and blend pairs", len(got))
	}
	if _, err := issue("--host", "node-b", "--ip", "10.0.0.2", "--role", "worker"); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("re-issue without --force: %v", err)
	}
	if out, err := issue("--host", "node-b", "--ip", "10.0.0.2", "--dns", "node-b.internal", "--role", "worker,blend", "--force"); err != nil {
		t.Fatalf("re-issue with --force: %v\n%s", err, out)
	}

	// Another operator's CA and a host of it.
	other := filepath.Join(t.TempDir(), "other")
	if out, err := run(t, "certs", "init", "--dir", other); err != nil {
		t.Fatalf("init other: %v\n%s", err, out)
	}
	if out, err := run(t, "certs", "issue", "--dir", other, "--host", "intruder", "--ip", "10.0.0.9", "--role", "engine,worker"); err != nil {
		t.Fatalf("issue intruder: %v\n%s", err, out)
	}
	hostX := filepath.Join(other, "hosts", "intruder")

	load := func(dir string, r mtls.Role) *mtls.Identity {
		t.Helper()
		id, err := mtls.Load(mtls.DirFiles(dir, r), r)
		if err != nil {
			t.Fatalf("load %s of %s: %v", r, dir, err)
		}
		return id
	}
	for _, tc := range []struct {
		name       string
		client     *mtls.Identity
		server     *mtls.Identity
		serverRole mtls.Role
		dialled    string // the address the client dials (the SAN it checks)
		ok         bool
	}{
		{"engine A to worker B", load(hostA, mtls.Engine), load(hostB, mtls.Worker), mtls.Worker, "10.0.0.2", true},
		{"engine A to blend B by name", load(hostA, mtls.Engine), load(hostB, mtls.Blend), mtls.Blend, "node-b.internal", true},
		{"worker B to worker A (hand-over)", load(hostB, mtls.Worker), load(hostA, mtls.Worker), mtls.Worker, "10.0.0.1", true},
		{"worker A to worker B (hand-over)", load(hostA, mtls.Worker), load(hostB, mtls.Worker), mtls.Worker, "node-b", true},
		{"B's certificate is not A's address", load(hostA, mtls.Engine), load(hostB, mtls.Worker), mtls.Worker, "10.0.0.1", false},
		{"another CA's client", load(hostX, mtls.Engine), load(hostB, mtls.Worker), mtls.Worker, "10.0.0.2", false},
		{"another CA's server", load(hostA, mtls.Engine), load(hostX, mtls.Worker), mtls.Worker, "10.0.0.9", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := handshake(t, tc.client, tc.server, tc.serverRole, tc.dialled)
			if (err == nil) != tc.ok {
				t.Fatalf("exchange: %v, want ok=%v", err, tc.ok)
			}
		})
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"gateway role", []string{"--host", "gw", "--role", "gateway"}, "needs no certificate"},
		{"unknown role", []string{"--host", "gw", "--role", "router"}, "unknown role"},
		{"no role", []string{"--host", "gw"}, "--role is required"},
		{"no host", []string{"--role", "engine"}, "--host"},
		{"bad ip", []string{"--host", "gw", "--ip", "10.0.0", "--role", "engine"}, "not an IP address"},
		{"path as host", []string{"--host", "../x", "--role", "engine"}, "no path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := issue(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	// A directory made by the one-shot cb certs has no CA key: issue says so.
	oneShot := filepath.Join(t.TempDir(), "pki")
	if out, err := run(t, "certs", "--dir", oneShot); err != nil {
		t.Fatalf("one-shot: %v\n%s", err, out)
	}
	if _, err := run(t, "certs", "issue", "--dir", oneShot, "--host", "h", "--role", "engine"); err == nil || !strings.Contains(err.Error(), "cb certs init") {
		t.Fatalf("issue from a one-shot directory: %v", err)
	}
}

// handshake runs a TLS exchange between client and server over loopback,
// the client verifying the server as dialled at host: nil when the server
// received the client's message and the client the server's answer.
func handshake(t *testing.T, client, server *mtls.Identity, serverRole mtls.Role, host string) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server.ServerTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srvErr := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			srvErr <- err
			return
		}
		_, err = c.Write([]byte("pong"))
		srvErr <- err
	}()
	cfg := client.ClientTLS(serverRole)
	cfg.ServerName = host
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cfg)
	var cerr error
	if err != nil {
		cerr = err
	} else {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4)
		if _, err := c.Write([]byte("ping")); err != nil {
			cerr = err
		} else if _, err := io.ReadFull(c, buf); err != nil {
			cerr = err
		}
		c.Close()
	}
	ln.Close()
	return errors.Join(cerr, <-srvErr)
}

func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = b
	}
	return m
}

func equalFiles(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
