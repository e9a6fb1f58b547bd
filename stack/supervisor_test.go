package stack

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if out := os.Getenv(upChildEnv); out != "" {
		os.Exit(upChild(out)) // a cb up that TestSIGKILLedUpLeavesNoKeys kills
	}
	if os.Getenv(fakeEnv) != "" {
		os.Exit(fakeCB(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestParseReady(t *testing.T) {
	tests := []struct {
		name, line string
		ok         bool
		svc, key   string
	}{
		{"ready with values", "READY cb-engine api=http://127.0.0.1:8000 metrics=x", true, "cb-engine", "api"},
		{"bare", "READY cb-blend", true, "cb-blend", ""},
		{"log line", `{"msg":"READY"}`, false, "", ""},
		{"too short", "READY", false, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := parseReady(tc.line)
			if ok != tc.ok || r.Service != tc.svc {
				t.Fatalf("parseReady = %+v, %v", r, ok)
			}
			if tc.key != "" && r.Values[tc.key] == "" {
				t.Fatalf("missing %s in %v", tc.key, r.Values)
			}
		})
	}
}

func TestSupervisorReadyRestartShutdown(t *testing.T) {
	var logs syncBuf
	readies := make(chan Ready, 8)
	s := NewSupervisor(Config{Logs: &logs, MinBackoff: 50 * time.Millisecond, StopTimeout: 2 * time.Second,
		OnReady: func(r Ready) { readies <- r }})
	r, err := s.Start(context.Background(), Spec{Name: "svc", Path: "/bin/sh",
		Args: []string{"-c", `echo "hello from stderr" >&2; echo "READY svc port=123"; exec sleep 60`}})
	if err != nil {
		t.Fatal(err)
	}
	<-readies
	if r.Service != "svc" || r.Values["port"] != "123" || r.PID == 0 {
		t.Fatalf("ready %+v", r)
	}
	if err := s.Signal("svc", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case r2 := <-readies:
		if r2.PID == r.PID {
			t.Fatal("restart kept the pid")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("not restarted")
	}
	st := s.Status()
	if len(st) != 1 || st[0].Restarts != 1 {
		t.Fatalf("status %+v", st)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, want := range []string{"svc       | hello from stderr", "process died; restarting", "signal: killed"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
}

func TestSupervisorNotReady(t *testing.T) {
	s := NewSupervisor(Config{Logs: &syncBuf{}, ReadyTimeout: 500 * time.Millisecond})
	defer s.Shutdown(context.Background())
	_, err := s.Start(context.Background(), Spec{Name: "dies", Path: "/bin/sh", Args: []string{"-c", "exit 3"}})
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("err = %v", err)
	}
	_, err = s.Start(context.Background(), Spec{Name: "slow", Path: "/bin/sh", Args: []string{"-c", "exec sleep 30"}})
	if !errors.Is(err, ErrNotReady) {
		t.Fatalf("err = %v", err)
	}
}
