package redisproc

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
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
