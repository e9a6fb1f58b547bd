package netns_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cacheblend/cacheblend/internal/netns"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestNet: two hosts reach each other over the bridge, the test reaches a
// server inside a host with the host's dialer, a link down cuts the host
// off and up restores it, nothing is added to the test's namespace, and
// Close removes every namespace.
func TestNet(t *testing.T) {
	before := rootLinks(t)
	n, err := netns.New(netns.Config{})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			n.Close()
		}
	})
	a, err := n.AddHost("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.AddHost("b")
	if err != nil {
		t.Fatal(err)
	}
	if a.IP.String() != "10.213.7.1" || b.IP.String() != "10.213.7.2" || !strings.HasPrefix(a.NS, n.Prefix()) {
		t.Fatalf("hosts %+v %+v", a, b)
	}
	// A server inside b, reached from the test through a's and b's
	// namespaces (over the bridge from a), not from the test's own.
	ln, err := b.Listen("tcp", b.Addr(0))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/"
	get := func(h *netns.Host) error {
		c := h.HTTPClient(time.Second)
		defer c.CloseIdleConnections()
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if string(body) != "ok" {
			return fmt.Errorf("body %q", body)
		}
		return nil
	}
	for _, h := range []*netns.Host{a, b} {
		if err := get(h); err != nil {
			t.Fatalf("from %s: %v", h.Name, err)
		}
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), 300*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("b's address is reachable from the root namespace")
	}

	if err := b.LinkDown(); err != nil {
		t.Fatal(err)
	}
	if err := get(a); err == nil {
		t.Fatal("a reaches b with b's link down")
	}
	if err := b.LinkUp(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for get(a) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("b not back after LinkUp: %v", get(a))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A command runs in the namespace.
	out, err := a.Command(context.Background(), "ip", "-4", "-o", "addr", "show", "dev", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), a.IP.String()+"/24") {
		t.Fatalf("ip addr in a: %s %v", out, err)
	}
	if after := rootLinks(t); after != before {
		t.Errorf("root namespace links changed:\n%s\n---\n%s", before, after)
	}
	srv.Close()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	out, err = exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil || strings.Contains(string(out), n.Prefix()) {
		t.Fatalf("namespaces left: %s %v", out, err)
	}
}

func TestConfigRefused(t *testing.T) {
	for _, s := range []string{"8.8.8.0/24", "10.0.0.0/16", "nonsense"} {
		t.Run(s, func(t *testing.T) {
			if n, err := netns.New(netns.Config{Subnet: s}); err == nil {
				n.Close()
				t.Fatalf("subnet %s accepted", s)
			}
		})
	}
}

func rootLinks(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			names = append(names, f[1])
		}
	}
	return strings.Join(names, " ")
}
