package redisproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/internal/freeport"
)

// When the process that started redis-server is killed outright (no
// cleanup runs), the server stops too.
func TestServerDiesWithItsOwner(t *testing.T) {
	if os.Getenv("REDISPROC_OWNER") == "1" { // the owner: start a server, print its pid, wait
		s, err := Start(context.Background(), Options{})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(s.cmd.Process.Pid)
		select {}
	}
	owner := exec.Command(os.Args[0], "-test.run=^TestServerDiesWithItsOwner$")
	owner.Env = append(os.Environ(), "REDISPROC_OWNER=1")
	out, err := owner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(line[:max(0, len(line)-1)])
	if err != nil || perr != nil {
		owner.Process.Kill()
		owner.Wait()
		t.Fatalf("owner said %q: %v %v (is redis-server installed? run make deps)", line, err, perr)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("redis-server %d not running: %v", pid, err)
	}
	owner.Process.Kill() // SIGKILL: the owner runs no cleanup
	owner.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server %d outlived its owner", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The password is in a configuration file of mode 0600, not on the
// server's command line (readable by every user in /proc/PID/cmdline); a
// password needing quotes works; Restart reuses the file.
func TestPasswordNotOnTheCommandLine(t *testing.T) {
	for _, tc := range []struct{ name, password string }{
		{"generated", ""},
		{"quotes and spaces", `p a"s\s w'ord`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Start(context.Background(), Options{Password: tc.password})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(s.PID()) + "/cmdline")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(cmdline), s.Password) || strings.Contains(string(cmdline), "requirepass") {
				t.Fatalf("password on the command line: %q", cmdline)
			}
			fi, err := os.Stat(filepath.Join(s.dir, "redis.conf"))
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("configuration file: %v %v", fi, err)
			}
			if line, err := s.Command("PING"); err != nil || line != "+PONG" {
				t.Fatalf("PING with the password: %q %v", line, err)
			}
			if err := s.Restart(context.Background()); err != nil {
				t.Fatal(err)
			}
			if line, err := s.Command("PING"); err != nil || line != "+PONG" {
				t.Fatalf("PING after Restart: %q %v", line, err)
			}
		})
	}
}

// A server that exits before answering (here: its port is taken) is
// reported at once with its log, not after the start timeout, and Start
// launches it again on other ports.
func TestExitBeforeAnswering(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().(*net.TCPAddr).Port

	for _, tc := range []struct {
		name     string
		busyPick int // how many picks hand out the taken port
		wantErr  bool
	}{
		{"taken once, started on the next ports", 1, false},
		{"taken every time", startAttempts, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			picks := 0
			pick := func(n int) ([]int, error) {
				picks++
				if picks <= tc.busyPick {
					return []int{busy}, nil
				}
				return freeport.Ports(n)
			}
			// A minute: an exit reported only at the timeout would fail the test's deadline
			// long before, and the error would not wrap ErrExited.
			s, err := Start(context.Background(), Options{StartTimeout: time.Minute, pickPorts: pick})
			if tc.wantErr {
				if err == nil {
					s.Stop()
					t.Fatal("Start succeeded on a taken port")
				}
				if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), strconv.Itoa(busy)) ||
					!strings.Contains(err.Error(), "in use") {
					t.Fatalf("error %q: want ErrExited with the log's address-in-use line", err)
				}
				if picks != startAttempts {
					t.Fatalf("%d launches, want %d", picks, startAttempts)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			if s.Port == busy || picks != 2 {
				t.Fatalf("port %d after %d picks; want a port other than %d, on the second pick", s.Port, picks, busy)
			}
			if line, err := s.Command("PING"); err != nil || line != "+PONG" {
				t.Fatalf("PING: %q %v", line, err)
			}
		})
	}
}

// A cluster node's bus port is picked like its port (below the kernel's
// ephemeral range), not redis's Port+10000, and the node listens on it.
func TestClusterBusPort(t *testing.T) {
	s, err := Start(context.Background(), Options{Cluster: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if s.BusPort == 0 || s.BusPort == s.Port+10000 {
		t.Fatalf("bus port %d for port %d", s.BusPort, s.Port)
	}
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.BusPort), time.Second)
	if err != nil {
		t.Fatalf("cluster bus not listening on %d: %v", s.BusPort, err)
	}
	c.Close()
}
