package demo

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/cacheblend/cacheblend/tracestore"
	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

// fakeEngine serves the engine API the demo uses (/health, /v1/documents, streamed
// /v1/chat/completions) and records each request's trace, as the stack would, into a real
// trace store: a reuse request's trace, and, when it asked for a quality check and the
// worker "takes" it, a cb.quality trace linked to it.
type fakeEngine struct {
	store *tracestore.Store
	// take decides whether the worker takes the check of the n-th request with reuse
	// (1-based); failed makes the check record a failure.
	take   func(n int) bool
	failed func(n int) bool
	// outputs returns the streamed chunks of the n-th request with reuse or baseline.
	outputs func(n int, baseline bool) []string

	mu     sync.Mutex
	n      int              // requests with reuse so far
	bodies []map[string]any // every chat body received
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health", "/v1/documents":
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("{}"))
		return
	case "/v1/chat/completions":
	default:
		http.NotFound(w, r)
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ext, _ := body["cacheblend"].(map[string]any)
	baseline := ext["reuse"] == false
	check := ext["quality_check"] == true
	tp := strings.Split(r.Header.Get("Traceparent"), "-")
	var tid pcommon.TraceID
	if len(tp) != 4 {
		http.Error(w, "no traceparent", http.StatusBadRequest)
		return
	}
	if _, err := hex.Decode(tid[:], []byte(tp[1])); err != nil {
		http.Error(w, "bad traceparent", http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	if !baseline {
		f.n++
	}
	n := f.n
	f.mu.Unlock()
	rid := fmt.Sprintf("req-%d", n)
	if baseline {
		rid += "-full"
	}
	now := time.Now()
	req := tracetest.Request{RequestID: rid, Trace: tid, Start: now}
	if baseline {
		req.Lookup = "skipped"
	}
	f.store.Add(req.Traces())
	taken := check && !baseline && f.take(n)
	if taken {
		f.store.Add(tracetest.Quality{RequestID: rid, RequestTrace: tid, Start: now.Add(200 * time.Millisecond),
			FirstKL: 0.001 * float64(n), MeanKL: 0.002, Top1: 0.75, GreedyMatch: 3, Positions: 4, Failed: f.failed(n)}.Traces())
	}
	w.Header().Set("X-Request-Id", rid)
	w.Header().Set("Content-Type", "text/event-stream")
	for _, c := range f.outputs(n, baseline) {
		b, _ := json.Marshal(map[string]any{"id": rid, "choices": []any{map[string]any{"delta": map[string]any{"content": c}}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	nonPrefix := 700
	if baseline {
		nonPrefix = 0
	}
	usage := map[string]any{"prompt_tokens": 1024, "completion_tokens": 3,
		"cacheblend": map[string]any{"non_prefix_hit_tokens": nonPrefix, "quality_sampled": taken}}
	b, _ := json.Marshal(map[string]any{"id": rid, "choices": []any{}, "usage": usage})
	fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
}

// TestRunQualityColumn runs the demo against a fake engine whose traces land in a real
// trace store: every request with reuse asks for the quality check; the report carries the
// cb.quality figures of the checks taken (found by request_id and the link to the
// request's trace), says why for the others, compares the greedy outputs, and prints the
// column and the mean KL.
func TestRunQualityColumn(t *testing.T) {
	store := tracestore.NewStore(tracestore.StoreConfig{})
	// A decoy: a check of another request that happens to carry req-1's request id
	// (a restarted engine reusing ids) but links elsewhere: never taken for req-1.
	decoy := tracetest.Quality{RequestID: "req-1", RequestTrace: tracetest.TraceID("elsewhere"), Start: time.Now().Add(time.Minute), FirstKL: 9, Positions: 4}.Traces()
	decoy.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).SetTraceID(tracetest.TraceID("decoy"))
	store.Add(decoy)
	eng := &fakeEngine{
		store:  store,
		take:   func(n int) bool { return n != 2 },
		failed: func(n int) bool { return n == 3 },
		outputs: func(n int, baseline bool) []string {
			if n == 4 && !baseline {
				return []string{"a", "b", "x"}
			}
			return []string{"a", "b", "c"}
		},
	}
	api := httptest.NewServer(eng)
	defer api.Close()
	query := httptest.NewServer(tracestore.NewQueryHandler(store, nil))
	defer query.Close()

	rep, err := Run(context.Background(), Config{API: api.URL, QueryURL: query.URL, Requests: 4, DocsPerRequest: 2, MaxTokens: 3, TraceWait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range eng.bodies {
		ext, _ := b["cacheblend"].(map[string]any)
		if b["temperature"] != 0.0 || ext == nil || (ext["reuse"] == false) == (ext["quality_check"] == true) {
			t.Fatalf("request body %v: want greedy, and either the baseline or a quality check", b)
		}
	}
	tests := []struct {
		row      int
		firstKL  float64
		note     string
		same     bool
		match    int
		cellWant string
	}{
		{row: 0, firstKL: 0.001, same: true, match: 3, cellWant: "0.0010 3/4"},
		{row: 1, note: "dropped: ", same: true, match: 3, cellWant: "dropped"},
		{row: 2, note: "failed: the check failed: quality check: snapshot gone", same: true, match: 3, cellWant: "failed"},
		{row: 3, firstKL: 0.004, same: false, match: 2, cellWant: "0.0040 3/4"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint("request ", tc.row+1), func(t *testing.T) {
			q := rep.Requests[tc.row]
			if tc.note == "" {
				if q.Quality == nil || math.Abs(q.Quality.FirstKL-tc.firstKL) > 1e-12 || q.Quality.Top1Agree() != 3 ||
					q.Quality.GreedyMatch != 3 || q.Quality.Positions != 4 || q.Quality.Selected != 77 || q.Quality.RecompRatio != 0.15 ||
					q.Quality.TraceID != tracetest.QualityTraceID(q.RequestID).String() || q.QualityNote != "" {
					t.Fatalf("quality = %+v, note %q; want first KL %v from %s's check", q.Quality, q.QualityNote, tc.firstKL, q.RequestID)
				}
			} else if q.Quality != nil || !strings.HasPrefix(q.QualityNote, tc.note) {
				t.Fatalf("quality = %+v, note %q; want none, note %q…", q.Quality, q.QualityNote, tc.note)
			}
			if q.SameOutput != tc.same || q.MatchChunks != tc.match || q.OutputChunks != 3 {
				t.Fatalf("output same %v, %d/%d chunks agree; want %v, %d/3", q.SameOutput, q.MatchChunks, q.OutputChunks, tc.same, tc.match)
			}
			if got := qualityCell(q); got != tc.cellWant {
				t.Fatalf("quality cell %q, want %q", got, tc.cellWant)
			}
		})
	}
	if rep.QualityChecks != 2 || rep.MeanFirstKL == nil || math.Abs(*rep.MeanFirstKL-0.0025) > 1e-12 || rep.Top1Agree != 6 || rep.Top1Positions != 8 || rep.SameOutputs != 3 {
		t.Fatalf("totals: %d checks, mean KL %v, top-1 %d/%d, same outputs %d", rep.QualityChecks, rep.MeanFirstKL, rep.Top1Agree, rep.Top1Positions, rep.SameOutputs)
	}
	var sb strings.Builder
	rep.Print(&sb)
	out := sb.String()
	for _, want := range []string{"KL · top-1", "0.0010 3/4", "dropped", "same", "2/3",
		"quality: mean first-token KL 0.0025 over 2 checks, top-1 6/8; greedy output = the full prefill's in 3/4",
		"2. quality dropped: the worker did not take the check"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	path := t.TempDir() + "/demo.json"
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	for _, want := range []string{`"first_kl": 0.001`, `"quality_note": "dropped: `, `"same_output": true`, `"match_chunks": 2`, `"mean_first_kl": 0.0025`, `"quality_checks": 2`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON lacks %s", want)
		}
	}
}

// TestQualityNotes: why a request has no quality figures.
func TestQualityNotes(t *testing.T) {
	store := tracestore.NewStore(tracestore.StoreConfig{})
	query := httptest.NewServer(tracestore.NewQueryHandler(store, nil))
	defer query.Close()
	sampled := chatResult{requestID: "r", traceID: tracetest.TraceID("r").String(), sent: time.Now(), qualitySampled: true, nonPrefixHit: 5}
	tests := []struct {
		name string
		cfg  Config
		r    chatResult
		want string
	}{
		{name: "no trace query URL", cfg: Config{}, r: sampled, want: "not run: no trace query URL"},
		{name: "workers cannot check", cfg: Config{QueryURL: query.URL, QualityOff: "tensor-parallel"}, r: sampled, want: "not run: tensor-parallel"},
		{name: "nothing blended", cfg: Config{QueryURL: query.URL}, r: chatResult{nonPrefixHit: 0}, want: "not sampled: nothing was reused off the prefix"},
		{name: "the worker did not take it", cfg: Config{QueryURL: query.URL}, r: chatResult{nonPrefixHit: 9}, want: "dropped: "},
		{name: "taken, but no span within the wait", cfg: Config{QueryURL: query.URL, TraceWait: 300 * time.Millisecond}, r: sampled,
			want: "not found: no cb.quality span linked to trace " + sampled.traceID + " within 300ms"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			qr, err := newQualityReader(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if qr.on() != (tc.cfg.QueryURL != "" && tc.cfg.QualityOff == "") {
				t.Fatalf("on() = %v", qr.on())
			}
			c, note := qr.read(context.Background(), tc.r)
			if c != nil || !strings.HasPrefix(note, tc.want) {
				t.Fatalf("read = %+v, %q; want none, %q…", c, note, tc.want)
			}
		})
	}
}

func TestCompareOutputs(t *testing.T) {
	tests := []struct {
		name        string
		reuse, full []string
		same        bool
		match       int
	}{
		{name: "equal", reuse: []string{"a", "b"}, full: []string{"a", "b"}, same: true, match: 2},
		{name: "differ at the first", reuse: []string{"x", "b"}, full: []string{"a", "b"}, match: 0},
		{name: "baseline longer", reuse: []string{"a"}, full: []string{"a", "b"}, match: 1},
		{name: "same text, other chunks", reuse: []string{"ab"}, full: []string{"a", "b"}, same: true, match: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r Result
			r.compareOutputs(tc.reuse, tc.full)
			if r.SameOutput != tc.same || r.MatchChunks != tc.match || r.OutputChunks != len(tc.reuse) {
				t.Fatalf("same %v, %d/%d; want %v, %d/%d", r.SameOutput, r.MatchChunks, r.OutputChunks, tc.same, tc.match, len(tc.reuse))
			}
		})
	}
}
