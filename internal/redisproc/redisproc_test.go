package redisproc

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
