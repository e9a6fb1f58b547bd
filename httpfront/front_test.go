package httpfront

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFront: routes, errors, key and body checks, and the lifecycle of one front.
func TestFront(t *testing.T) {
	var recorded []string
	ok := func(w *StatusWriter, _ *http.Request, _ string, _ time.Time) {
		WriteJSON(w, http.StatusOK, map[string]string{"ok": "1"})
	}
	var f *Front
	f = New(Config{Component: "test", Addr: "127.0.0.1:0", Settings: Settings{APIKey: "k", MaxBodyBytes: 8}}, Handlers{
		Generate: func(w *StatusWriter, r *http.Request, op, _ string, _ time.Time) {
			body, apiErr := f.ReadRequest(w, r)
			if apiErr != nil {
				apiErr.Write(w)
				return
			}
			WriteJSON(w, http.StatusOK, map[string]string{"op": op, "body": string(body)})
		},
		Documents: ok, Models: ok, Health: ok,
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "m 1\n") }),
		Record:  func(method, route string, status int, _ float64) { recorded = append(recorded, method+" "+route) },
	})
	if err := f.Start(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if err := f.Start(t.Context(), nil); err == nil || !strings.HasPrefix(err.Error(), "test: ") {
		t.Fatalf("second Start: %v", err)
	}
	base := "http://" + f.Addr()
	for _, tc := range []struct {
		name, method, path, ct, key, body string
		status                            int
		want                              string
	}{
		{"chat", "POST", "/v1/chat/completions", "application/json", "k", "{}", 200, `"op":"chat"`},
		{"no key", "POST", "/v1/completions", "application/json", "", "{}", 401, "API key"},
		{"not json", "POST", "/v1/completions", "text/plain", "k", "{}", 415, "error"},
		{"too large", "POST", "/v1/completions", "application/json", "k", "{\"a\":123456}", 413, "error"},
		{"unknown path", "GET", "/nope", "", "", "", 404, "error"},
		{"wrong method", "GET", "/v1/chat/completions", "", "", "", 405, "error"},
		{"model", "GET", "/v1/models/x", "", "", "", 200, "ok"},
		{"metrics", "GET", "/metrics", "", "", "", 200, "m 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
			if tc.ct != "" {
				req.Header.Set("Content-Type", tc.ct)
			}
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
				t.Fatalf("%d %s, want %d with %q", resp.StatusCode, b, tc.status, tc.want)
			}
			if tc.status == 405 && resp.Header.Get("Allow") != http.MethodPost {
				t.Fatalf("Allow %q", resp.Header.Get("Allow"))
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ran := false
	if first, err := f.Shutdown(ctx, func() { ran = true }); !first || err != nil || !ran || !f.ShuttingDown() {
		t.Fatalf("Shutdown: first %v err %v alongside ran %v", first, err, ran)
	}
	if first, _ := f.Shutdown(ctx, nil); first {
		t.Fatal("second Shutdown did something")
	}
	if want := []string{"POST /v1/chat/completions", "GET unmatched", "GET /v1/models/{model}"}; !containsAll(recorded, want) {
		t.Fatalf("recorded %v, want %v among them", recorded, want)
	}
}

func containsAll(have, want []string) bool {
	seen := map[string]bool{}
	for _, h := range have {
		seen[h] = true
	}
	for _, w := range want {
		if !seen[w] {
			return false
		}
	}
	return true
}

// Every answer of a front carries an X-Request-Id: the handler's own when it
// set one, else a fresh one (health, metrics, a handler that writes
// nothing, a flush first, the front's own 404).
func TestRequestIDOnEveryAnswer(t *testing.T) {
	f := New(Config{Component: "test", Addr: "127.0.0.1:0"}, Handlers{
		Generate: func(w *StatusWriter, _ *http.Request, _, _ string, _ time.Time) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Flush()
			io.WriteString(w, "data: [DONE]\n\n")
		},
		Documents: func(w *StatusWriter, _ *http.Request, _ string, _ time.Time) {
			w.Header().Set("X-Request-Id", "docs-own")
			WriteJSON(w, http.StatusOK, map[string]string{"ok": "1"})
		},
		Models: func(w *StatusWriter, _ *http.Request, _ string, _ time.Time) {}, // writes nothing
		Health: func(w *StatusWriter, _ *http.Request, _ string, _ time.Time) {
			WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		},
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "m 1\n") }),
		Record:  func(string, string, int, float64) {},
	})
	if err := f.Start(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = f.Shutdown(ctx, nil)
	})
	base := "http://" + f.Addr()
	seen := map[string]bool{}
	for _, tc := range []struct {
		name, method, path string
		own                string // the handler's id, "" for a fresh one
	}{
		{"health", "GET", "/health", ""},
		{"metrics", "GET", "/metrics", ""},
		{"handler's own id kept", "POST", "/v1/documents", "docs-own"},
		{"handler wrote nothing", "GET", "/v1/models", ""},
		{"flush first", "POST", "/v1/chat/completions", ""},
		{"404", "GET", "/nope", ""},
		{"HEAD health", "HEAD", "/health", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader("{}"))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			ids := resp.Header.Values("X-Request-Id")
			switch {
			case len(ids) != 1:
				t.Fatalf("X-Request-Id %q, want exactly one", ids)
			case tc.own != "" && ids[0] != tc.own:
				t.Fatalf("X-Request-Id %q, want the handler's %q", ids[0], tc.own)
			case tc.own == "" && (!strings.HasPrefix(ids[0], "req-") || seen[ids[0]]):
				t.Fatalf("X-Request-Id %q, want a fresh req- id", ids[0])
			}
			seen[ids[0]] = true
		})
	}
}
