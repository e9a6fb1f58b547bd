package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestUpEndpointsFileAndCtrlC runs `cb up` as a user would: it writes the
// endpoints file once all processes are healthy, every URL in it answers,
// the state directory holds the blend server's L2 (created 0700), a
// worker killed and restarted gets its new pid in the rewritten endpoints
// file, and SIGINT stops every process.
func TestUpEndpointsFileAndCtrlC(t *testing.T) {
	dir := t.TempDir()
	eps := filepath.Join(dir, "endpoints.json")
	state := filepath.Join(dir, "state")
	cmd := exec.Command(cbBin, "up", "--api", "127.0.0.1:0", "--ui-addr", "127.0.0.1:0", "--endpoints-file", eps, "--state-dir", state)
	cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=")
	var out syncWriter
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited, done := waitCmd(cmd)
	defer func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
	}()
	var b []byte
	deadline := time.Now().Add(90 * time.Second)
	for {
		var err error
		if b, err = os.ReadFile(eps); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no endpoints file:\n%s", tail(out.String(), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
	var e struct {
		Engine, Worker, Blend struct {
			API, GRPC, Metrics string
			PID                int
		}
		Collector *struct{ OTLP, UI string }
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if e.Engine.API == "" || e.Worker.GRPC == "" || e.Blend.GRPC == "" || e.Collector == nil || e.Collector.UI == "" {
		t.Fatalf("endpoints %s", b)
	}
	for _, u := range []string{e.Engine.API + "/health", e.Engine.Metrics, e.Worker.Metrics, e.Blend.Metrics, e.Collector.UI} {
		resp, err := http.Get(u)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %v %v", u, err, resp)
		}
		resp.Body.Close()
	}
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state directory: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(state, "l2")); err != nil || !fi.IsDir() {
		t.Fatalf("no L2 in the state directory: %v", err)
	}
	// A worker killed and restarted: the endpoints file names its new pid.
	if err := syscall.Kill(e.Worker.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	oldWorker := e.Worker.PID
	for deadline := time.Now().Add(60 * time.Second); e.Worker.PID == oldWorker; {
		if time.Now().After(deadline) {
			t.Fatalf("endpoints file still names the killed worker %d:\n%s", oldWorker, tail(out.String(), 30))
		}
		time.Sleep(50 * time.Millisecond)
		if b, err := os.ReadFile(eps); err == nil {
			_ = json.Unmarshal(b, &e)
		}
	}
	if syscall.Kill(e.Worker.PID, 0) != nil {
		t.Fatalf("the endpoints file's worker pid %d is not running", e.Worker.PID)
	}
	pids := []int{e.Engine.PID, e.Worker.PID, e.Blend.PID}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("cb up exited with %v:\n%s", err, tail(out.String(), 30))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("cb up did not stop on SIGINT")
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("process %d still running after cb up stopped", pid)
		}
	}
	for _, svc := range []string{"cb-engine ", "cb-worker ", "cb-blend  "} {
		if !strings.Contains(out.String(), svc+"|") {
			t.Errorf("no prefixed log lines from %s", svc)
		}
	}
}
