package freeport

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestMain(m *testing.M) {
	if arg := os.Getenv(portsChildEnv); arg != "" {
		os.Exit(portsChild(arg))
	}
	os.Exit(m.Run())
}

// portsChildEnv makes the test binary a process that reserves ports with
// Ports ("lo hi n": n ports of the pool [lo, hi)), prints them on one
// line and holds them until its stdin closes.
const portsChildEnv = "CB_TEST_PORTS_CHILD"

func portsChild(arg string) int {
	var lo, hi, n int
	if _, err := fmt.Sscan(arg, &lo, &hi, &n); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	setPool(lo, hi)
	ps, err := Ports(n)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(strings.Trim(fmt.Sprint(ps), "[]"))
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// setPool narrows the range Ports picks from (tests only).
func setPool(lo, hi int) {
	portsMu.Lock()
	defer portsMu.Unlock()
	poolLo, poolHi = lo, hi
}

// freeWindow returns w consecutive ports of the default pool that no
// process holds or reserves now, and narrows the pool to them until the
// test ends.
func freeWindow(t *testing.T, w int) (lo, hi int) {
	t.Helper()
	portsMu.Lock()
	plo, phi := portPool()
	portsMu.Unlock()
	t.Cleanup(func() { setPool(plo, phi) })
	free := func(p int) bool {
		portsMu.Lock()
		defer portsMu.Unlock()
		if reserved[p] != nil {
			return false
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		l.Close()
		u, err := net.Listen("unix", "@cacheblend-port-"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		u.Close()
		return true
	}
	for lo = plo + 512; lo+w <= phi; lo += w {
		if !slices.ContainsFunc(seq(lo, lo+w), func(p int) bool { return !free(p) }) {
			setPool(lo, lo+w)
			return lo, lo + w
		}
	}
	t.Fatalf("no %d free consecutive ports in %d–%d", w, plo, phi)
	return 0, 0
}

func seq(lo, hi int) []int {
	s := make([]int, 0, hi-lo)
	for p := lo; p < hi; p++ {
		s = append(s, p)
	}
	return s
}

// TestPortsBelowEphemeralRange: the ports come from below the kernel's
// ephemeral range, which other processes' outgoing connections and :0
// listeners use (one of those took a picked port between its pick and a
// worker's bind in CI).
func TestPortsBelowEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatal(err)
	}
	start, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	ps, err := Ports(16)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p < start/2 || p >= start {
			t.Errorf("port %d outside %d–%d (ephemeral range from %d)", p, start/2, start-1, start)
		}
	}
}

// TestPortsReservedAcrossProcesses: ports another process reserved
// with Ports, or holds bound, are never handed out; once the pool has
// none left Ports says so instead of returning a taken port.
func TestPortsReservedAcrossProcesses(t *testing.T) {
	lo, hi := freeWindow(t, 7)
	// Another process reserves three ports (and binds none of them).
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %d 3", portsChildEnv, lo, hi))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("child: %v", err)
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child's ports: %v", err)
	}
	var theirs []int
	for _, f := range strings.Fields(line) {
		p, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("child's ports %q: %v", line, err)
		}
		theirs = append(theirs, p)
	}
	// And one port is bound by a listener that has nothing to do with Ports.
	bound := slices.IndexFunc(seq(lo, hi), func(p int) bool { return !slices.Contains(theirs, p) }) + lo
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(bound))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ours, err := Ports(3)
	if err != nil {
		t.Fatalf("3 of the 3 ports left: %v", err)
	}
	for _, p := range ours {
		if slices.Contains(theirs, p) || p == bound || p < lo || p >= hi {
			t.Errorf("handed out %d (ours %v, the other process's %v, bound %d, pool %d–%d)", p, ours, theirs, bound, lo, hi-1)
		}
	}
	if ps, err := Ports(1); err == nil {
		t.Errorf("pool of %d–%d exhausted, yet Ports returned %v", lo, hi-1, ps)
	}
}

// TestPortsDistinct: the ports of one call differ, and so do those of
// many calls, concurrent or not, in one process (two stacks started at once
// never get the same port between its pick and its bind).
func TestPortsDistinct(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]bool{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				ps, err := Ports(5)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, p := range ps {
					if p <= 0 || seen[p] {
						t.Errorf("port %d handed out twice (this call: %v)", p, ps)
					}
					seen[p] = true
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}
