package httpserve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start serves h with l on a free loopback port until the test ends.
func start(t *testing.T, h http.Handler, l Limits) (*Server, string) {
	t.Helper()
	s := New("test", h, l, slog.New(slog.DiscardHandler))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// closedWithin reports whether the server closes c within d (a read
// returns EOF or a reset, not a timeout).
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// get sends a GET on c and returns the status code.
func get(t *testing.T, c net.Conn, path string) int {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	_ = c.SetDeadline(time.Time{})
	return resp.StatusCode
}

func waitStats(t *testing.T, s *Server, what string, ok func(Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok(s.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %+v", what, s.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	_, _ = io.WriteString(w, "ok")
})

func TestDefaults(t *testing.T) {
	l := Limits{MaxConns: 7, ReadTimeout: -1}.WithDefaults(Limits{IdleTimeout: time.Minute, ReadTimeout: time.Hour})
	want := Limits{ReadHeaderTimeout: DefaultReadHeaderTimeout, ReadTimeout: time.Hour, WriteTimeout: DefaultWriteTimeout,
		IdleTimeout: time.Minute, MaxHeaderBytes: DefaultMaxHeaderBytes, MaxConns: 7}
	if l != want {
		t.Fatalf("WithDefaults = %+v, want %+v", l, want)
	}
	s := New("x", okHandler, Limits{}, nil)
	if got := s.Limits(); got.MaxConns != DefaultMaxConns && uint64(got.MaxConns) != max(1, fdLimit()/2) {
		t.Fatalf("MaxConns %d", got.MaxConns)
	}
}

func TestEvictsOldestSlowConnectionAtCap(t *testing.T) {
	s, addr := start(t, okHandler, Limits{MaxConns: 3})
	var slow []net.Conn
	for i := range 3 {
		c := dial(t, addr)
		// Headers and part of a declared body, then nothing.
		fmt.Fprintf(c, "POST /slow%d HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc", i)
		slow = append(slow, c)
		waitStats(t, s, "accepted", func(st Stats) bool { return st.Accepted == uint64(i+1) })
	}
	// A normal request takes the oldest slow connection's place.
	if code := get(t, dial(t, addr), "/"); code != http.StatusOK {
		t.Fatalf("normal request at the cap: %d", code)
	}
	if !closedWithin(slow[0], 2*time.Second) {
		t.Fatal("oldest slow connection still open")
	}
	for _, c := range slow[1:] {
		if closedWithin(c, 50*time.Millisecond) {
			t.Fatal("a newer slow connection was closed")
		}
	}
	if st := s.Stats(); st.Evicted != 1 || st.Refused != 0 || st.Open > 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestIdleEvictedBeforeReading(t *testing.T) {
	s, addr := start(t, okHandler, Limits{MaxConns: 2})
	idle := dial(t, addr)
	if code := get(t, idle, "/"); code != http.StatusOK {
		t.Fatal(code)
	}
	waitStats(t, s, "idle", func(Stats) bool { s.mu.Lock(); defer s.mu.Unlock(); return s.idle.Len() == 1 })
	slow := dial(t, addr)
	fmt.Fprintf(slow, "GET / HTTP/1.1\r\nHost: x\r\n")
	waitStats(t, s, "two open", func(st Stats) bool { return st.Open == 2 })
	if code := get(t, dial(t, addr), "/"); code != http.StatusOK {
		t.Fatal(code)
	}
	if !closedWithin(idle, 2*time.Second) {
		t.Fatal("idle connection not evicted")
	}
	if closedWithin(slow, 50*time.Millisecond) {
		t.Fatal("the reading connection was evicted before the idle one")
	}
}

func TestRefusesWhenEveryConnectionIsServed(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 2)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		entered <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "done")
	})
	s, addr := start(t, h, Limits{MaxConns: 2})
	defer close(release)
	busy := []net.Conn{dial(t, addr), dial(t, addr)}
	fmt.Fprintf(busy[0], "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	fmt.Fprintf(busy[1], "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
	<-entered
	<-entered
	// Refused with a reset: it may come back as the dial's own error.
	t0 := time.Now()
	c, err := net.Dial("tcp", addr)
	switch {
	case err == nil:
		t.Cleanup(func() { c.Close() })
		if !closedWithin(c, 2*time.Second) {
			t.Fatal("connection beyond the cap not refused")
		}
	case !errors.Is(err, syscall.ECONNRESET):
		t.Fatal(err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("refused after %v", d)
	}
	// The refusal is counted as the connection is closed: wait for it.
	waitStats(t, s, "one refusal", func(st Stats) bool { return st.Refused == 1 && st.Evicted == 0 && st.Open == 2 })
}

func TestSlowBodyTimesOut(t *testing.T) {
	got := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		got <- err
		if err != nil {
			w.WriteHeader(http.StatusRequestTimeout)
		}
	})
	s, addr := start(t, h, Limits{ReadTimeout: 200 * time.Millisecond})
	c := dial(t, addr)
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
	select {
	case err := <-got:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("body read: %v, want a timeout", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("body read not cut by ReadTimeout")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("response %v %v", resp, err)
	}
	_ = resp.Body.Close()
	if !closedWithin(c, 2*time.Second) {
		t.Fatal("connection kept after a timed-out body")
	}
	waitStats(t, s, "closed", func(st Stats) bool { return st.Open == 0 })
}

func TestIdleAndHeaderTimeoutsCloseConnections(t *testing.T) {
	s, addr := start(t, okHandler, Limits{IdleTimeout: 150 * time.Millisecond, ReadHeaderTimeout: 150 * time.Millisecond})
	idle := dial(t, addr)
	if code := get(t, idle, "/"); code != http.StatusOK {
		t.Fatal(code)
	}
	silent := dial(t, addr) // never sends a byte
	t0 := time.Now()
	if !closedWithin(idle, 3*time.Second) || !closedWithin(silent, 3*time.Second) {
		t.Fatal("idle or silent connection not closed")
	}
	if d := time.Since(t0); d < 100*time.Millisecond {
		t.Fatalf("closed after %v, before the timeouts", d)
	}
	waitStats(t, s, "closed", func(st Stats) bool { return st.Open == 0 })
}

// TestLongStreamOutlivesTimeouts: a response written for longer than
// ReadTimeout and WriteTimeout, its write deadline extended before each
// write, is not cut, and its request context is not cancelled.
func TestLongStreamOutlivesTimeouts(t *testing.T) {
	const wt = 100 * time.Millisecond
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rc := http.NewResponseController(w)
		for i := range 8 {
			time.Sleep(50 * time.Millisecond)
			if r.Context().Err() != nil {
				_, _ = io.WriteString(w, "cancelled\n")
				return
			}
			_ = rc.SetWriteDeadline(time.Now().Add(wt))
			_, _ = fmt.Fprintf(w, "event %d\n", i)
			_ = rc.Flush()
		}
	})
	_, addr := start(t, h, Limits{ReadTimeout: wt, WriteTimeout: wt})
	c := dial(t, addr)
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || strings.Count(string(body), "event") != 8 || strings.Contains(string(body), "cancelled") {
		t.Fatalf("stream %q, %v", body, err)
	}
}

func TestShutdownWithHeldConnections(t *testing.T) {
	var inside atomic.Int32 // handlers running: reading bodies that never come
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside.Add(1)
		defer inside.Add(-1)
		okHandler.ServeHTTP(w, r)
	})
	s := New("x", h, Limits{MaxConns: 4}, slog.New(slog.DiscardHandler))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	for range 6 {
		c := dial(t, ln.Addr().String())
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n")
	}
	waitStats(t, s, "six accepted, two evicted", func(st Stats) bool { return st.Accepted == 6 && st.Evicted == 2 })
	// Accepted counts a connection when the listener hands it to net/http,
	// before net/http tracks it: a Shutdown in between found no connection
	// to wait for and returned nil. Requests inside the handler are tracked.
	waitStats(t, s, "four requests in their handler", func(Stats) bool { return inside.Load() >= 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown with requests reading: %v", err)
	}
	_ = s.Close()
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		t.Fatal(err)
	}
	waitStats(t, s, "all closed", func(st Stats) bool { return st.Open == 0 })
	if st := s.Stats(); st.Evicted != 2 {
		t.Fatalf("stats %+v", st)
	}
}
