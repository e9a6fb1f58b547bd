package netns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultSubnet is the subnet of a Net whose Config gives none: a private
// /24 that exists only inside the Net's namespaces.
const DefaultSubnet = "10.213.7.0/24"

// Config are a Net's optional settings.
type Config struct {
	// Subnet is the hosts' /24 (default DefaultSubnet); host i gets
	// address .i+1 in the order AddHost is called.
	Subnet string
	// Prefix starts every namespace name (default "cb" and 6 random hex
	// digits); names are Prefix-<host> and Prefix-sw for the switch.
	Prefix string
}

// Net is a bridge in a switch namespace and the hosts attached to it.
type Net struct {
	prefix string
	subnet netip.Prefix
	sw     string

	mu    sync.Mutex
	hosts []*Host
}

// Host is one network namespace attached to the Net's bridge.
type Host struct {
	// Name is the host's name in the Net (AddHost's argument).
	Name string
	// NS is the namespace's name (ip netns exec NS ...).
	NS string
	// IP is the host's address on eth0.
	IP netip.Addr

	net  *Net
	port string // the bridge port in the switch namespace
}

// ip runs the ip command with args and returns its error with its output.
func ip(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netns: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// New makes the switch namespace with its bridge. Close removes it.
func New(cfg Config) (*Net, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("netns: the ip command (Debian package iproute2): %w", err)
	}
	subnet, err := netip.ParsePrefix(cmpOr(cfg.Subnet, DefaultSubnet))
	if err != nil || !subnet.Addr().Is4() || subnet.Bits() != 24 || !subnet.Addr().IsPrivate() {
		return nil, fmt.Errorf("netns: subnet %q: want a private IPv4 /24 (%v)", cfg.Subnet, err)
	}
	prefix := cfg.Prefix
	if prefix == "" {
		b := make([]byte, 3)
		if _, err := rand.Read(b); err != nil {
			return nil, fmt.Errorf("netns: name prefix: %w", err)
		}
		prefix = "cb" + hex.EncodeToString(b)
	}
	n := &Net{prefix: prefix, subnet: subnet.Masked(), sw: prefix + "-sw"}
	if err := ip("netns", "add", n.sw); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"-n", n.sw, "link", "set", "lo", "up"},
		{"-n", n.sw, "link", "add", "br0", "type", "bridge"},
		{"-n", n.sw, "link", "set", "br0", "up"},
	} {
		if err := ip(args...); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Prefix is the start of every namespace name of the Net.
func (n *Net) Prefix() string { return n.prefix }

// AddHost makes a namespace Prefix-name with loopback up and eth0 on the
// bridge, addressed with the next address of the subnet.
func (n *Net) AddHost(name string) (*Host, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := len(n.hosts)
	if i >= 250 {
		return nil, errors.New("netns: subnet full")
	}
	addr := n.subnet.Addr().As4()
	addr[3] = byte(i + 1)
	h := &Host{Name: name, NS: n.prefix + "-" + name, IP: netip.AddrFrom4(addr), net: n, port: fmt.Sprintf("p%d", i)}
	if err := ip("netns", "add", h.NS); err != nil {
		return nil, err
	}
	n.hosts = append(n.hosts, h) // Close removes it from here on
	for _, args := range [][]string{
		{"-n", h.NS, "link", "set", "lo", "up"},
		{"-n", n.sw, "link", "add", h.port, "type", "veth", "peer", "name", "eth0", "netns", h.NS},
		{"-n", n.sw, "link", "set", h.port, "master", "br0"},
		{"-n", n.sw, "link", "set", h.port, "up"},
		{"-n", h.NS, "addr", "add", h.IP.String() + "/24", "dev", "eth0"},
		{"-n", h.NS, "link", "set", "eth0", "up"},
	} {
		if err := ip(args...); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// Close removes every namespace of the Net (the hosts', then the
// switch's). Processes still running in a namespace keep their network
// stack alive, detached from the bridge: stop them first.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	for _, h := range n.hosts {
		if err := ip("netns", "del", h.NS); err != nil {
			errs = append(errs, err)
		}
	}
	n.hosts = nil
	if err := ip("netns", "del", n.sw); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Command is cmd run in the host's namespace: ip netns exec NS name
// args... (ip execs it, so the process id is the command's). The process is
// killed when the goroutine's thread that started it exits (Pdeathsig), so
// that a crashed test leaves nothing running.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// LinkDown takes the host's eth0 down inside its namespace: the host is cut
// off from every other host (a partition) until LinkUp.
func (h *Host) LinkDown() error { return ip("-n", h.NS, "link", "set", "eth0", "down") }

// LinkUp brings the host's eth0 back up (its address is kept).
func (h *Host) LinkUp() error { return ip("-n", h.NS, "link", "set", "eth0", "up") }

// DialContext dials addr from inside the host's namespace: the socket is
// made on a thread moved into the namespace (setns) and back. It is safe
// for concurrent use.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := h.do(func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// Listen listens on addr (e.g. the host's IP and a port) inside the host's
// namespace.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.do(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// do runs f on a thread moved into the host's namespace, then moves the
// thread back. A socket f makes stays in the namespace.
func (h *Host) do(f func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + h.NS)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: setns %s: %w", h.NS, err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays in the namespace: keep it locked, so that it
		// ends with this goroutine instead of running others. A socket f
		// made is still returned to the caller (it is in the right
		// namespace).
		return errors.Join(ferr, fmt.Errorf("netns: setns back: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// HTTPClient is an HTTP client whose connections are dialled from inside
// the host's namespace, with timeout as its overall request timeout (0:
// none). Its idle connections are closed by CloseIdleConnections.
func (h *Host) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: h.DialContext, MaxIdleConnsPerHost: 16}}
}

// URL is http://IP:port.
func (h *Host) URL(port int) string { return fmt.Sprintf("http://%s:%d", h.IP, port) }

// Addr is IP:port.
func (h *Host) Addr(port int) string { return fmt.Sprintf("%s:%d", h.IP, port) }
