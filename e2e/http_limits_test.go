package e2e

import (
	"fmt"
	"github.com/cacheblend/cacheblend/internal/fdlimit"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// procStat returns a process's resident memory (kB) and its number of open
// file descriptors.
func procStat(t *testing.T, pid int) (rssKB, fds int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			_, _ = fmt.Sscanf(strings.TrimSpace(v), "%d", &rssKB)
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return rssKB, len(ents)
}

// TestSlowBodyAttackOnEngineProcess holds 5,000 connections that send a
// chat request's headers and part of its body, then stall, against cb
// engine with its default limits: normal requests (each on a new
// connection) and /health still answer within 1 s, the engine holds at most
// its connection cap (4,096) of descriptors, its memory stays bounded, and
// the blend process reports healthy.
func TestSlowBodyAttackOnEngineProcess(t *testing.T) {
	const attackers, maxConns = 5000, 4096
	raiseFileLimit(t, attackers+1000) // before the stack starts: its processes inherit it
	e := startEnv(t, options{workerArgs: []string{"--layers=4", "--dim=64", "--heads=4", "--kv-heads=2", "--ffn-dim=128"}})
	eps := e.stack.Endpoints()
	if body, err := httpGet(strings.TrimSuffix(eps.Blend.Metrics, "/metrics") + "/health"); err != nil || body != "ok\n" {
		t.Fatalf("blend /health: %q %v", body, err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	normal := func() time.Duration {
		t.Helper()
		t0 := time.Now()
		resp, err := client.Post(e.api+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"cb-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
		if err != nil {
			t.Fatalf("normal request: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("normal request: %d %s", resp.StatusCode, b)
		}
		return time.Since(t0)
	}
	normal() // warm up
	pid := eps.Engine.PID
	rss0, fd0 := procStat(t, pid)
	var base []time.Duration
	for range 5 {
		base = append(base, normal())
	}

	addr := strings.TrimPrefix(e.api, "http://")
	const head = "POST /v1/chat/completions HTTP/1.1\r\nHost: cb\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":"
	conns := make([]net.Conn, attackers)
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var dialErr error
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < attackers; i += 8 {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err == nil {
					_, err = io.WriteString(c, head)
				}
				if err != nil {
					mu.Lock()
					dialErr = err
					mu.Unlock()
					return
				}
				conns[i] = c
			}
		})
	}
	wg.Wait()
	if dialErr != nil {
		t.Fatalf("attacker: %v", dialErr)
	}
	// Let the engine take every connection in (its descriptors stop growing).
	for prev, deadline := -1, time.Now().Add(10*time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		_, fd := procStat(t, pid)
		if fd == prev {
			break
		}
		prev = fd
	}
	var lat []time.Duration
	for range 10 {
		lat = append(lat, normal())
	}
	t0 := time.Now()
	if _, err := httpGet(e.api + "/health"); err != nil {
		t.Fatalf("/health under attack: %v", err)
	}
	healthLat := time.Since(t0)
	rss1, fd1 := procStat(t, pid)
	slices.Sort(base)
	slices.Sort(lat)
	t.Logf("cb engine under %d slow-body connections (default limits): chat request p50 %v max %v (without attack p50 %v); /health %v",
		attackers, lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond),
		base[len(base)/2].Round(100*time.Microsecond), healthLat.Round(100*time.Microsecond))
	t.Logf("cb engine: open fds %d -> %d, RSS %.1f -> %.1f MB", fd0, fd1, float64(rss0)/1024, float64(rss1)/1024)
	if lat[len(lat)-1] > time.Second || healthLat > time.Second {
		t.Errorf("latency under attack: chat %v, /health %v; want < 1 s", lat, healthLat)
	}
	if fd1-fd0 > maxConns+64 {
		t.Errorf("engine descriptors grew by %d, cap %d", fd1-fd0, maxConns)
	}

	for i, c := range conns {
		_ = c.Close()
		conns[i] = nil
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, fd := procStat(t, pid)
		if fd <= fd0+8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine still holds %d descriptors (%d before the attack) after the clients left", fd, fd0)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := httpGet(strings.TrimSuffix(eps.Blend.Metrics, "/metrics") + "/health"); err != nil {
		t.Fatalf("blend /health after the attack: %v", err)
	}
}

// raiseFileLimit makes room for need open files in this process (and the
// processes it starts), or fails the test.
func raiseFileLimit(t *testing.T, need uint64) {
	t.Helper()
	if _, err := fdlimit.Raise(need); err != nil {
		t.Fatal(err)
	}
}
