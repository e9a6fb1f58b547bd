// Package redistest starts real Redis servers (Debian's redis-server,
// through package redisproc) for tests: a single password-protected server
// or a 3-master cluster, on free loopback ports, stopped at test cleanup. A
// missing redis-server fails the test with the package to install
// (scripts/deps.sh installs it).
package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/internal/redisproc"
)

// Password is the password of the servers started here.
const Password = "cb-test-secret"

// Options change how a server is started.
type Options struct {
	// MaxMemory, when set, is the maxmemory setting ("2mb"), with the
	// allkeys-lru policy.
	MaxMemory string
	// Cluster starts the server in cluster mode.
	Cluster bool
}

// Server is one running redis-server of a test.
type Server struct {
	*redisproc.Server
	t testing.TB
}

// Start starts a redis-server on a free loopback port; it stops at cleanup.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	s, err := redisproc.Start(context.Background(), redisproc.Options{
		Password: Password, MaxMemory: o.MaxMemory, Cluster: o.Cluster, Dir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return &Server{Server: s, t: t}
}

// Restart starts a killed server again on the same port (empty); a failure
// fails the test.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.Server.Restart(context.Background()); err != nil {
		s.t.Fatal(err)
	}
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
	// Every node must see the whole cluster before a client writes: a node
	// that has not learnt the slot map yet answers CLUSTERDOWN.
	deadline := time.Now().Add(30 * time.Second)
	for !clusterOK(c.Nodes...) {
		if time.Now().After(deadline) {
			t.Fatal("redis cluster not ok in time")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c
}

// clusterOK reports whether every node's CLUSTER INFO says the cluster is
// ok with every slot assigned and every node known.
func clusterOK(nodes ...*Server) bool {
	for _, s := range nodes {
		out, err := exec.Command("redis-cli", "-a", Password, "--no-auth-warning", "-p", strconv.Itoa(s.Port), "cluster", "info").Output()
		info := string(out)
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") ||
			!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(nodes))) {
			return false
		}
	}
	return true
}
