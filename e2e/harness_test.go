package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/demo"
	"github.com/cacheblend/cacheblend/stack"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// cbBin is the cb binary built once for the package.
var cbBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cb-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cbBin = filepath.Join(dir, "cb")
	build := exec.Command("go", "build", "-o", cbBin, "github.com/cacheblend/cacheblend/cmd/cb")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build cb:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// syncWriter serializes the children's log lines into the test log buffer.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// env is a running stack for one test.
type env struct {
	t        *testing.T
	stack    *stack.Stack
	col      *tracestore.Collector
	api      string
	queryURL string
	logs     *syncWriter
	// model is the served model name chat sends ("" = cb-llama).
	model string
}

// options of startEnv.
type options struct {
	// otlpEndpoint/protocol: export to this backend instead of the
	// embedded collector (queryURL must then be given).
	otlpEndpoint, otlpProtocol, queryURL string
	engineArgs, workerArgs, blendArgs    []string
	extraEnv                             []string
	// engineEnv is added to the engine's environment only (after
	// extraEnv), e.g. OTEL_SDK_DISABLED=true for an engine that does not
	// trace: the processes are started through a wrapper script that sets
	// it for `cb engine`.
	engineEnv []string
	// tp, above 1, runs the worker as that many tensor-parallel ranks.
	tp int
	// stateDir is the stack's state directory (stack.UpConfig.StateDir):
	// the blend server's L2; "" for none.
	stateDir string
	// onReady is called every time a process announces itself ready (its
	// restarts included), from a supervisor goroutine.
	onReady func(stack.Ready)
	// model is a GGUF model file the stack serves (stack.UpConfig.ModelPath,
	// as cb up --model), and modelName its general.name (env.model).
	model, modelName string
	// redisURL joins the blend server to this fleet tier
	// (stack.UpConfig.RedisURL: cb blend gets it in CB_BLEND_REDIS_URL,
	// never in argv), with e2eFleetKey as the fleet key
	// (CB_BLEND_FLEET_KEY); "" for none.
	redisURL string
}

// e2eFleetKey is the fleet key of the tests' fleet tiers (every node of a
// fleet has the same; at least 32 bytes).
const e2eFleetKey = "e2e-fleet-key-0123456789abcdef0123456789abcdef"

// startEnv starts the collector (unless o.otlpEndpoint is set) and the
// three processes; everything is stopped when the test ends.
func startEnv(t *testing.T, o options) *env {
	t.Helper()
	e := &env{t: t, logs: &syncWriter{}}
	exe := cbBin
	if len(o.engineEnv) > 0 {
		exe = engineEnvWrapper(t, o.engineEnv)
	}
	cfg := stack.UpConfig{
		Exe:        exe,
		APIAddr:    "127.0.0.1:0",
		EngineArgs: o.engineArgs, WorkerArgs: o.workerArgs, BlendArgs: o.blendArgs,
		Env:        append([]string{"OTEL_BSP_SCHEDULE_DELAY=100"}, o.extraEnv...),
		Supervisor: stack.Config{Logs: e.logs, ReadyTimeout: 90 * time.Second, OnReady: o.onReady},
		TP:         o.tp,
		StateDir:   o.stateDir,
		ModelPath:  o.model,
	}
	if o.redisURL != "" {
		cfg.RedisURL, cfg.FleetKey = o.redisURL, e2eFleetKey
	}
	e.model = o.modelName
	if o.otlpEndpoint == "" {
		col, err := tracestore.New(tracestore.Config{OTLPAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0"}, component.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		e.col = col
		if err := e.col.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		cfg.OTLPEndpoint = "http://" + e.col.OTLPAddr() + "/v1/traces"
		cfg.OTLPProtocol = "http/protobuf"
		e.queryURL = "http://" + e.col.QueryAddr()
	} else {
		cfg.OTLPEndpoint, cfg.OTLPProtocol, e.queryURL = o.otlpEndpoint, o.otlpProtocol, o.queryURL
	}
	st, err := stack.Up(context.Background(), cfg)
	if err != nil {
		if e.col != nil {
			e.col.Shutdown(context.Background())
		}
		t.Fatalf("stack up: %v\nlogs:\n%s", err, e.logs.String())
	}
	e.stack = st
	e.api = st.Endpoints().Engine.API
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Errorf("stack shutdown: %v", err)
		}
		if e.col != nil {
			e.col.Shutdown(ctx)
		}
		if t.Failed() {
			t.Logf("process logs:\n%s", tail(e.logs.String(), 80))
		}
	})
	return e
}

// engineEnvWrapper writes a script that runs cb with env added to the
// environment of `cb engine` only (stack.UpConfig.Env reaches every process).
// exec keeps the process id, so the supervisor's signals reach cb itself.
func engineEnvWrapper(t *testing.T, env []string) string {
	t.Helper()
	var sb strings.Builder
	sb.WriteString("#!/bin/sh\nif [ \"$1\" = engine ]; then\n")
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, " '\"$=") {
			t.Fatalf("engineEnv %q: want KEY=value", kv)
		}
		fmt.Fprintf(&sb, "  export %s='%s'\n", k, strings.ReplaceAll(v, "'", `'\''`))
	}
	fmt.Fprintf(&sb, "fi\nexec '%s' \"$@\"\n", cbBin)
	path := filepath.Join(t.TempDir(), "cb-engine-env")
	if err := os.WriteFile(path, []byte(sb.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// post sends a JSON request to the engine and decodes the JSON answer.
func (e *env) post(path string, hdr map[string]string, body, out any) int {
	e.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, e.api+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(data, out); err != nil {
			e.t.Fatalf("%s: %v: %s", path, err, data)
		}
	}
	if resp.StatusCode != http.StatusOK {
		e.t.Logf("%s: %d %s", path, resp.StatusCode, data)
	}
	return resp.StatusCode
}

// ingest stores the sample documents.
func (e *env) ingest() {
	e.t.Helper()
	var docs []map[string]string
	for _, d := range demo.Documents() {
		docs = append(docs, map[string]string{"id": d.ID, "text": d.Text})
	}
	if code := e.post("/v1/documents", nil, map[string]any{"documents": docs}, nil); code != http.StatusOK {
		e.t.Fatalf("ingest: %d", code)
	}
}

// chat sends a non-streamed chat completion with a traceparent header.
func (e *env) chat(traceparent, content string, maxTokens int) map[string]any {
	e.t.Helper()
	var out map[string]any
	hdr := map[string]string{}
	if traceparent != "" {
		hdr["traceparent"] = traceparent
	}
	code := e.post("/v1/chat/completions", hdr, map[string]any{
		"model": e.modelName(), "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true,
		"messages": []map[string]string{{"role": "user", "content": content}},
	}, &out)
	if code != http.StatusOK {
		e.t.Fatalf("chat: status %d", code)
	}
	return out
}

// modelName is the served model name requests carry.
func (e *env) modelName() string {
	if e.model != "" {
		return e.model
	}
	return "cb-llama"
}

// trace waits until the trace has every span named in want (from the
// backend's query API) and returns it.
func (e *env) trace(traceID string, want ...string) *tracecheck.Trace {
	e.t.Helper()
	jc, err := jaeger.NewClient(e.queryURL, jaeger.ClientConfig{HTTPClient: &http.Client{Timeout: 10 * time.Second}})
	if err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	var last string
	seen := -1 // spans at the previous poll
	for time.Now().Before(deadline) {
		jt, err := jc.Trace(context.Background(), traceID)
		if err == nil {
			trs, err := tracecheck.FromJaeger(jt)
			if err != nil {
				e.t.Fatal(err)
			}
			have := map[string]bool{}
			for _, s := range trs[0].Spans {
				have[s.Name] = true
			}
			missing := []string{}
			for _, w := range want {
				if !have[w] {
					missing = append(missing, w)
				}
			}
			// Complete when every wanted span is there and the trace has
			// stopped growing: spans of one trace arrive in several export
			// batches (a process's SERVER span ends, and is exported, after
			// its children), and a check of a half-exported trace fails.
			if len(missing) == 0 && len(trs[0].Spans) == seen {
				return &trs[0]
			}
			seen = len(trs[0].Spans)
			last = fmt.Sprintf("missing %v (%d spans, still arriving)", missing, seen)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.t.Fatalf("trace %s not complete: %s", traceID, last)
	return nil
}

// ragPrompt builds a RAG prompt of the sample documents in the given order.
func ragPrompt(order ...int) string {
	docs := demo.Documents()
	var picked []demo.Document
	for _, i := range order {
		picked = append(picked, docs[i])
	}
	return demo.Prompt(picked, "Question: what do these documents have in common?")
}

// rawChat posts a raw chat completion body and returns status and body.
func (e *env) rawChat(body string) (int, string) {
	resp, err := http.Post(e.api+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// rawChatTraced posts a raw chat completion body with a traceparent header
// and returns status and body.
func (e *env) rawChatTraced(traceparent, body string) (int, string) {
	req, err := http.NewRequest(http.MethodPost, e.api+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// httpGet returns the body of a GET that answers 200.
func httpGet(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// waitCmd waits for the started cmd in a goroutine: exited receives Wait's
// result (buffered: nobody has to read it), done is closed after it. A
// test's cleanup selects on done instead of reading cmd.ProcessState,
// which Wait writes on the other goroutine.
func waitCmd(cmd *exec.Cmd) (exited <-chan error, done <-chan struct{}) {
	ex, dn := make(chan error, 1), make(chan struct{})
	go func() {
		ex <- cmd.Wait()
		close(dn)
	}()
	return ex, dn
}
