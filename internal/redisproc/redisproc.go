// Package redisproc starts and stops a real redis-server process (Debian's
// redis-server) on a free loopback port for the tests (package redistest), and
// writes the configuration file a redis-server is started with (ConfLines,
// WriteConf; cb up's supervised redis-server uses it too). A missing
// redis-server is an error naming the Debian package.
package redisproc

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cacheblend/cacheblend/internal/freeport"
)

// ErrExited is wrapped by Start's and Restart's error when redis-server
// exited before it answered (a port taken between the pick and the bind,
// a bad setting); the error carries the end of the server's log.
var ErrExited = errors.New("redisproc: redis-server exited before answering")

// startAttempts is how many times Start launches redis-server, each time on
// newly picked ports, when it exits before answering.
const startAttempts = 3

// ErrNotInstalled is returned when redis-server is not on PATH.
var ErrNotInstalled = errors.New("redisproc: redis-server not found on PATH (install the Debian package redis-server)")

// Options change how a server is started. The zero value is a
// password-protected server without persistence.
type Options struct {
	// Password is the server's password; "" generates a random one.
	Password string
	// MaxMemory, when set, is the maxmemory setting ("2mb"), with the
	// allkeys-lru policy.
	MaxMemory string
	// Cluster starts the server in cluster mode.
	Cluster bool
	// Dir is the server's working directory; "" makes a temporary one,
	// removed by Stop.
	Dir string
	// StartTimeout bounds the wait for the first PING; default 10 s.
	StartTimeout time.Duration
	// pickPorts picks the ports of each launch; nil is freeport.Ports (a
	// test hands out a taken port).
	pickPorts func(n int) ([]int, error)
}

// Server is one running redis-server. Its methods are not safe for
// concurrent use.
type Server struct {
	// Addr is 127.0.0.1:Port.
	Addr     string
	Port     int
	Password string
	// BusPort is the cluster bus port of a server started with
	// Options.Cluster (0 otherwise): picked like Port, not redis's default
	// of Port+10000, which lies in the kernel's ephemeral range where any
	// outgoing connection may hold it.
	BusPort int
	dir     string
	ownDir  bool
	args    []string
	timeout time.Duration
	cmd     *exec.Cmd
	// exited is closed when the process started by start has been waited
	// for (by the goroutine start runs); waitErr is then its exit status.
	exited  chan struct{}
	waitErr error
}

// logName is the file in the server's directory that receives its output.
const logName = "redis.log"

// Start starts a redis-server listening on 127.0.0.1 on a free port. When
// the server exits before answering (its port taken between the pick and
// the bind), Start tries again on other ports, three launches in all; the
// last error wraps ErrExited and quotes the server's log.
func Start(ctx context.Context, o Options) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNotInstalled
	}
	if o.Password == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("redisproc: password: %w", err)
		}
		o.Password = hex.EncodeToString(b[:])
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 10 * time.Second
	}
	s := &Server{Password: o.Password, dir: o.Dir, timeout: o.StartTimeout, args: []string{bin}}
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "cb-redis-"); err != nil {
			return nil, fmt.Errorf("redisproc: %w", err)
		}
		s.ownDir = true
	}
	for attempt := 1; ; attempt++ {
		err = s.launch(ctx, o)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, ErrExited) || attempt == startAttempts {
			s.Stop()
			return nil, err
		}
	}
}

// launch picks ports, writes the configuration for them and starts the
// server, waiting for its first answer.
func (s *Server) launch(ctx context.Context, o Options) error {
	n := 1
	if o.Cluster {
		n = 2
	}
	pick := o.pickPorts
	if pick == nil {
		pick = freeport.Ports
	}
	ports, err := pick(n)
	if err != nil {
		return fmt.Errorf("redisproc: %w", err)
	}
	s.Port = ports[0]
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
	// The settings go in a configuration file of mode 0600 in the server's directory, not on
	// its command line: an argument (the password) is readable by every user in
	// /proc/PID/cmdline. Paths in it are relative to the directory (the process's working
	// directory).
	conf := append(ConfLines(s.Port, o.Password, "./"), "masterauth "+confQuote(o.Password))
	if o.MaxMemory != "" {
		conf = append(conf, "maxmemory "+confQuote(o.MaxMemory), "maxmemory-policy allkeys-lru")
	}
	if o.Cluster {
		s.BusPort = ports[1]
		conf = append(conf, "cluster-enabled yes", "cluster-config-file nodes.conf", "cluster-node-timeout 2000",
			"cluster-port "+strconv.Itoa(s.BusPort))
	}
	confPath := filepath.Join(s.dir, "redis.conf")
	if err := WriteConf(confPath, conf); err != nil {
		return err
	}
	s.args = []string{s.args[0], confPath}
	return s.start(ctx)
}

// ConfLines are the settings of a redis-server on 127.0.0.1:port with password and working
// directory dir, without persistence, in protected mode: lines of a redis.conf (WriteConf),
// so that the password is never in a command line (readable by every user in
// /proc/PID/cmdline).
func ConfLines(port int, password, dir string) []string {
	return []string{"port " + strconv.Itoa(port), "bind 127.0.0.1", "protected-mode yes", `save ""`,
		"appendonly no", "requirepass " + confQuote(password), "dir " + confQuote(dir)}
}

// WriteConf writes the configuration lines to path, mode 0600 (a symbolic link there is
// refused).
func WriteConf(path string, lines []string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("redisproc: configuration file: %w", err)
	}
	err = f.Chmod(0o600) // an existing file keeps its mode on open
	if err == nil {
		_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("redisproc: configuration file: %w", err)
	}
	return nil
}

// confQuote quotes v as one argument of a redis.conf line: in double quotes, with
// backslashes, quotes and control characters escaped.
func confQuote(v string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\' || c == '"':
			sb.WriteByte('\\')
			sb.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&sb, "\\x%02x", c)
		default:
			sb.WriteByte(c)
		}
	}
	sb.WriteByte('"')
	return sb.String()
}

// URL is the server's redis:// URL with its password.
func (s *Server) URL() string { return fmt.Sprintf("redis://:%s@%s", s.Password, s.Addr) }

func (s *Server) start(ctx context.Context) error {
	log, err := os.OpenFile(filepath.Join(s.dir, logName), os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("redisproc: log file: %w", err)
	}
	defer log.Close() // the child holds its own descriptor
	s.cmd = exec.Command(s.args[0], s.args[1:]...)
	s.cmd.Dir = s.dir
	s.cmd.Stdout, s.cmd.Stderr = log, log
	setProcAttr(s.cmd)
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return fmt.Errorf("redisproc: start redis-server: %w", err)
	}
	cmd, exited := s.cmd, make(chan struct{})
	s.exited = exited
	go func() { s.waitErr = cmd.Wait(); close(exited) }() // ends when the process does
	deadline := time.Now().Add(s.timeout)
	for {
		select {
		case <-exited:
			s.cmd = nil
			return fmt.Errorf("%w on %s (%v); its log ends:\n%s", ErrExited, s.Addr, s.waitErr, s.logTail())
		default:
		}
		// A short deadline per PING: a port held by another process may accept the
		// connection and never answer, while this server has already exited.
		line, err := s.command(pingTimeout, "PING")
		if err == nil && line == "+PONG" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redisproc: redis-server on %s did not answer within %s; its log ends:\n%s", s.Addr, s.timeout, s.logTail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited: // reported at the top of the loop
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// pingTimeout bounds each PING of a starting server.
const pingTimeout = 500 * time.Millisecond

// logTail is the last 2 KiB of the server's log, for an error.
func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, logName))
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return strings.TrimSpace(string(b[max(0, len(b)-2048):]))
}

// Command runs one command (authenticated) and returns its first reply
// line.
func (s *Server) Command(args ...string) (string, error) { return s.command(5*time.Second, args...) }

// command is Command with its time limit.
func (s *Server) command(timeout time.Duration, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr, min(timeout, time.Second))
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	w := bufio.NewWriter(c)
	writeCmd(w, "AUTH", s.Password)
	writeCmd(w, args...)
	if err := w.Flush(); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		return "", fmt.Errorf("redisproc: auth: %q %v", line, err)
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

// Kill stops the server with SIGKILL (it loses every key).
func (s *Server) Kill() {
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
		s.cmd = nil
	}
}

// Restart starts a killed (or running) server again on the same port,
// empty.
func (s *Server) Restart(ctx context.Context) error { s.Kill(); return s.start(ctx) }

// Pause stops the server with SIGSTOP; Resume continues it.
func (s *Server) Pause() {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused server.
func (s *Server) Resume() {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// PID is the server process's id (0 when not running).
func (s *Server) PID() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop ends the server (SIGTERM, then SIGKILL after 5 s) and removes the
// directory Start made.
func (s *Server) Stop() {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
		s.cmd = nil
	}
	if s.ownDir {
		os.RemoveAll(s.dir)
	}
}
