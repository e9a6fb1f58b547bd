package engine_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/engine"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/worker"
)

var smallModel = model.Config{Layers: 4, Dim: 64, Heads: 4, KVHeads: 2, FFNDim: 128, MaxPositions: 2048, Threads: 2}

// startWorker runs a real cb worker (small model, no blend server).
func startWorker(t *testing.T) *worker.Worker {
	t.Helper()
	w, err := worker.New(worker.Config{Model: smallModel, ShmDir: t.TempDir(), NumBlocks: 128},
		worker.Deps{Deps: component.Deps{Registerer: prometheus.NewRegistry()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Shutdown(context.Background()) })
	return w
}

// workersKey is the stack key of the engines on real workers.
var workersKey = []byte("real workers' stack key, 32 bytes")

// startEngine runs an engine of role on w; a prefill engine's allow-list
// is decode.
func startEngine(t *testing.T, w *worker.Worker, role string, decode ...string) string {
	t.Helper()
	conn, err := rpc.Dial(w.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cfg := engine.Config{Addr: "127.0.0.1:0", Role: role, WorkerAdvertise: w.Addr(), DecodeEngines: decode}
	if role != engine.RoleBoth {
		cfg.StackKey = workersKey
	}
	e, err := engine.New(cfg,
		engine.Deps{Deps: component.Deps{Registerer: prometheus.NewRegistry()}, Worker: cbv1.NewWorkerServiceClient(conn)})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.Shutdown(ctx)
	})
	base := "http://" + e.Addr()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("engine not healthy")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// complete posts a completion and returns its text and the hand-over
// report headers.
func complete(t *testing.T, base, decode, prompt string, params map[string]any) (string, http.Header) {
	t.Helper()
	body := map[string]any{"model": "cb-llama", "prompt": prompt, "max_tokens": 24, "ignore_eos": true}
	for k, v := range params {
		body[k] = v
	}
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	if decode != "" {
		req.Header.Set(api.HeaderDecodeEngine, decode)
		req.Header.Set(api.HeaderDecodeAuth, api.DecodeAuth(workersKey, decode, "test", time.Now().Add(api.HandoffTTL)))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	var out api.Completion
	if err := json.Unmarshal(data, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("%s: %v", data, err)
	}
	return out.Choices[0].Text, resp.Header
}

// TestDisaggregatedEqualsOneEngine: with real workers and the real model, a
// request prefilled by one engine and decoded by another answers exactly as
// one engine does: greedy, seeded sampling, and with the decode side's
// prefix cache deduplicating the blocks of a second prompt.
func TestDisaggregatedEqualsOneEngine(t *testing.T) {
	one := startEngine(t, startWorker(t), engine.RoleBoth)
	decode := startEngine(t, startWorker(t), engine.RoleDecode)
	prefill := startEngine(t, startWorker(t), engine.RolePrefill, decode)
	doc := strings.Repeat("Blocks of sixteen tokens hash into a chain; equal prefixes share them. ", 5)
	greedy := map[string]string{} // prompt -> one engine's greedy answer
	for _, tc := range []struct {
		name   string
		prompt string
		params map[string]any
		dedup  bool
	}{
		{"greedy", doc + "Q1?", map[string]any{"temperature": 0}, false},
		{"seeded sampling", doc + "Q2?", map[string]any{"temperature": 0.9, "top_p": 0.95, "seed": 11}, true},
		{"greedy, shared prefix", doc + "Q3?", map[string]any{"temperature": 0}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, _ := complete(t, one, "", tc.prompt, tc.params)
			got, hdr := complete(t, prefill, decode, tc.prompt, tc.params)
			if got != want {
				t.Fatalf("disaggregated %q\none engine    %q", got, want)
			}
			if tc.params["temperature"] == 0 {
				greedy[tc.prompt] = want
			}
			rep, ok := api.ParseKVReport(hdr)
			if !ok || rep.BlocksSent == 0 || (rep.BlocksDeduped > 0) != tc.dedup {
				t.Fatalf("report %+v (%v), want dedup %v", rep, ok, tc.dedup)
			}
			t.Logf("%s: %d bytes, %d blocks sent, %d deduped", tc.name, rep.Bytes, rep.BlocksSent, rep.BlocksDeduped)
		})
	}
	// The greedy answers of the two prompts differ, and neither is one
	// character repeated: the comparisons above can fail.
	a, b := greedy[doc+"Q1?"], greedy[doc+"Q3?"]
	for _, s := range []string{a, b} {
		if len(s) == 0 || strings.Count(s, s[:1]) == len(s) {
			t.Fatalf("trivial greedy answer %q", s)
		}
	}
	if a == b {
		t.Fatalf("two prompts, one greedy answer %q: comparing answers proves nothing", a)
	}
}
