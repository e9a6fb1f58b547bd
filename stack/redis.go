package stack

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cacheblend/cacheblend/internal/freeport"
	"github.com/cacheblend/cacheblend/internal/redisproc"
)

// ErrNoRedis is returned when a multi-node stack needs redis-server and it
// is not on PATH.
var ErrNoRedis = errors.New("stack: redis-server not found on PATH (install the Debian package redis-server, or pass --redis-url)")

// redisSpec prepares a supervised redis-server for a multi-node stack's
// fleet tier: on a free loopback port, with a random password, without
// persistence, its configuration (the password never in a command line) in
// the run directory dir (0600). It returns the spec and the server's URL
// (redis://:password@127.0.0.1:port). The supervisor restarts it on the
// same port with the same password when it dies (empty: the fleet tier
// refills as documents are stored again); the blend servers reconnect.
func redisSpec(dir string) (Spec, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return Spec{}, "", ErrNoRedis
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Spec{}, "", fmt.Errorf("stack: redis password: %w", err)
	}
	password := hex.EncodeToString(b[:])
	ports, err := freeport.Ports(1)
	if err != nil {
		return Spec{}, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	data, err := makeSubdir(dir, "redis")
	if err != nil {
		return Spec{}, "", err
	}
	path := filepath.Join(dir, "redis.conf")
	if err := redisproc.WriteConf(path, redisproc.ConfLines(ports[0], password, data)); err != nil {
		return Spec{}, "", fmt.Errorf("stack: %w", err)
	}
	spec := Spec{Name: "redis-server", Path: bin, Args: []string{path},
		Probe: func(ctx context.Context) error { return redisPing(ctx, addr, password) }}
	return spec, "redis://:" + password + "@" + addr, nil
}

// redisPing authenticates to addr and sends PING; nil on +PONG.
func redisPing(ctx context.Context, addr, password string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n*1\r\n$4\r\nPING\r\n", len(password), password); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	for _, want := range []string{"+OK", "+PONG"} {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if strings.TrimSpace(line) != want {
			return fmt.Errorf("stack: redis answered %q, want %s", strings.TrimSpace(line), want)
		}
	}
	return nil
}
