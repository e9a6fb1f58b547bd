// Package redistest starts real Redis servers (Debian's redis-server) for
// tests: a single password-protected server or a 3-master cluster, on free
// loopback ports, stopped at test cleanup. A missing redis-server fails the
// test with the package to install (scripts/deps.sh installs it).
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Password is the password of the servers started here.
const Password = "cb-test-secret"

// Server is one running redis-server.
type Server struct {
	Addr string // 127.0.0.1:port
	Port int
	dir  string
	args []string
	cmd  *exec.Cmd
	t    testing.TB
}

// URL is the server's redis:// URL with the password.
func (s *Server) URL() string { return fmt.Sprintf("redis://:%s@%s", Password, s.Addr) }

// Options change how a server is started.
type Options struct {
	// MaxMemory, when set, is the maxmemory setting ("2mb"), with the
	// allkeys-lru policy.
	MaxMemory string
	// Cluster starts the server in cluster mode.
	Cluster bool
}

// Start starts a redis-server on a free loopback port; it stops at cleanup.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found (Debian package redis-server; scripts/deps.sh installs it): %v", err)
	}
	dir := t.TempDir()
	port := freePort(t)
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--requirepass", Password, "--masterauth", Password, "--dir", dir, "--protected-mode", "yes"}
	if o.MaxMemory != "" {
		args = append(args, "--maxmemory", o.MaxMemory, "--maxmemory-policy", "allkeys-lru")
	}
	if o.Cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000")
	}
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port, dir: dir, args: append([]string{bin}, args...), t: t}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	s.cmd = exec.Command(s.args[0], s.args[1:]...)
	s.cmd.Dir = s.dir
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := s.ping(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on %s did not answer", s.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Command runs one command (inline protocol, authenticated) and returns its
// first reply line.
func (s *Server) Command(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	w := bufio.NewWriter(c)
	writeCmd(w, "AUTH", Password)
	writeCmd(w, args...)
	if err := w.Flush(); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		return "", fmt.Errorf("auth: %q %v", line, err)
	}
	line, err := r.ReadString('\n')
	return strings.TrimSpace(line), err
}

// writeCmd writes one command in the RESP array form (binary safe).
func writeCmd(w *bufio.Writer, args ...string) {
	fmt.Fprintf(w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(w, "$%d\r\n%s\r\n", len(a), a)
	}
}

func (s *Server) ping() error {
	line, err := s.Command("PING")
	if err != nil {
		return err
	}
	if line != "+PONG" {
		return fmt.Errorf("ping: %q", line)
	}
	return nil
}

// Kill stops the server with SIGKILL (it loses every key).
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Restart starts a killed server again on the same port (empty).
func (s *Server) Restart() { s.t.Helper(); s.Kill(); s.start() }

// Pause stops the server with SIGSTOP; Resume continues it.
func (s *Server) Pause()  { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// Stop ends the server (SIGTERM, then SIGKILL after 5 s).
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// Cluster is a running 3-master Redis Cluster.
type Cluster struct {
	Nodes []*Server
}

// URL is the cluster's URL for package fleet: the first node, the others as
// addr parameters.
func (c *Cluster) URL() string {
	u := fmt.Sprintf("redis://:%s@%s?cluster=true", Password, c.Nodes[0].Addr)
	for _, n := range c.Nodes[1:] {
		u += "&addr=" + n.Addr
	}
	return u
}

// StartCluster starts three cluster-mode servers and joins them with
// redis-cli --cluster create; they stop at cleanup.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not found (Debian package redis-tools): %v", err)
	}
	c := &Cluster{}
	var addrs []string
	for range 3 {
		s := Start(t, Options{Cluster: true})
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"-a", Password, "--no-auth-warning", "--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		line, _ := c.Nodes[0].Command("CLUSTER", "INFO")
		if strings.Contains(line, "cluster_state:ok") || clusterOK(c.Nodes[0]) {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatal("redis cluster not ok in time")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clusterOK reads the whole CLUSTER INFO bulk reply.
func clusterOK(s *Server) bool {
	out, err := exec.Command("redis-cli", "-a", Password, "--no-auth-warning", "-p", strconv.Itoa(s.Port), "cluster", "info").Output()
	return err == nil && strings.Contains(string(out), "cluster_state:ok")
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
