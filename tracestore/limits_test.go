package tracestore

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/httpserve"
)

// TestCollectorHTTPLimits: a slow OTLP body is cut at ReadTimeout, idle and
// silent connections on the query port are closed, and both servers carry
// the configured cap.
func TestCollectorHTTPLimits(t *testing.T) {
	c := startCollector(t, Config{Limits: httpserve.Limits{ReadTimeout: 200 * time.Millisecond,
		IdleTimeout: 200 * time.Millisecond, ReadHeaderTimeout: 200 * time.Millisecond, MaxConns: 7}})
	for _, s := range c.servers {
		if l := s.Limits(); l.MaxConns != 7 || l.WriteTimeout != DefaultWriteTimeout || l.MaxHeaderBytes != DefaultMaxHeaderBytes {
			t.Fatalf("limits %+v", l)
		}
	}
	slow, err := net.Dial("tcp", c.OTLPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	t0 := time.Now()
	_, _ = io.WriteString(slow, "POST /v1/traces HTTP/1.1\r\nHost: c\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100\r\n\r\nab")
	_ = slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(slow)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || time.Since(t0) > 5*time.Second {
		t.Fatalf("slow body: %d after %v", resp.StatusCode, time.Since(t0))
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("connection after a timed-out body: %v, want closed", err)
	}

	idle, err := net.Dial("tcp", c.QueryAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	silent, err := net.Dial("tcp", c.QueryAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	_, _ = io.WriteString(idle, "GET /api/services HTTP/1.1\r\nHost: c\r\n\r\n")
	ibr := bufio.NewReader(idle)
	resp, err = http.ReadResponse(ibr, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("services: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	for _, r := range []io.Reader{ibr, silent} {
		_ = idle.SetReadDeadline(time.Now().Add(10 * time.Second))
		_ = silent.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := r.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("idle connection: %v, want closed", err)
		}
	}
}
