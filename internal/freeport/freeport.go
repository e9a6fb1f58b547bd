package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Ports returns n distinct free TCP ports on 127.0.0.1 for processes
// that bind them later (a port flag given to a child process). Safe for
// concurrent use.
//
// A port picked by listening on :0 and closing is free only for a moment:
// any other process's outgoing connection or :0 listener may take it before
// the child binds it. So Ports picks from the ports below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range; from half its start up to
// it, 16384–32767 by default), which neither of those ever takes, and
// reserves each port it returns for the rest of this process's life: in
// this process (no call returns it again) and in every process of the same
// network namespace that uses Ports (an abstract Unix socket named after
// the port, held open; a test binary's stacks never collide with another
// test binary's). What remains is a program binding that port by number
// between the pick and the bind; the child then fails to start and says so.
// A machine whose ephemeral range starts too low for a pool of 1,024 ports
// falls back to the :0 pick.
func Ports(n int) ([]int, error) {
	if n <= 0 {
		return nil, nil
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, hi := portPool()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries >= 64+4*n+(hi-lo) {
			pool := "ephemeral ports"
			if hi > 0 {
				pool = fmt.Sprintf("%d–%d", lo, hi-1)
			}
			return nil, fmt.Errorf("freeport: %d picks in %s gave only %d of %d ports", tries, pool, len(ports), n)
		}
		p, l, err := pickPort(lo, hi)
		if err != nil {
			return nil, err
		}
		if l == nil {
			continue
		}
		defer l.Close() // every listener held until return: the n ports differ
		ports = append(ports, p)
	}
	return ports, nil
}

// pickPort tries one port of [lo, hi) (or :0 when hi is 0): it returns the
// port and a listener on it when the port is free and not reserved, and
// reserves it; a nil listener when it is not (pick again).
func pickPort(lo, hi int) (int, net.Listener, error) {
	addr := "127.0.0.1:0"
	if hi > 0 {
		addr = "127.0.0.1:" + strconv.Itoa(lo+rand.IntN(hi-lo))
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		if hi > 0 && errors.Is(err, syscall.EADDRINUSE) {
			return 0, nil, nil
		}
		return 0, nil, fmt.Errorf("freeport: %w", err)
	}
	p := l.Addr().(*net.TCPAddr).Port
	if reserved[p] != nil {
		l.Close()
		return 0, nil, nil
	}
	// The reservation between processes: the first to bind the abstract
	// socket (never a file) holds the port.
	lease, err := net.Listen("unix", "@cacheblend-port-"+strconv.Itoa(p))
	if err != nil {
		l.Close()
		if errors.Is(err, syscall.EADDRINUSE) {
			return 0, nil, nil
		}
		return 0, nil, fmt.Errorf("freeport: reserve %d: %w", p, err)
	}
	reserved[p] = lease
	return p, l, nil
}

// portPool is the range Ports picks from, [lo, hi): the upper half of
// the ports below the ephemeral range, or (0, 0) for the :0 pick.
func portPool() (lo, hi int) {
	if poolHi > 0 {
		return poolLo, poolHi
	}
	start := 32768 // the kernel's default, if the file cannot be read
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				start = v
			}
		}
	}
	lo, hi = max(1024, start/2), start
	if hi-lo < 1024 {
		return 0, 0
	}
	poolLo, poolHi = lo, hi
	return lo, hi
}

// portsMu guards reserved (every port Ports returned in this process,
// with the abstract socket that reserves it, held until the process exits)
// and the pool's bounds (read once; tests narrow them).
var (
	portsMu        sync.Mutex
	reserved       = map[int]net.Listener{}
	poolLo, poolHi int
)
