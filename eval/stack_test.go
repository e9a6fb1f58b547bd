package eval

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/model"
)

// fakeEngine is an engine API that streams one content token per chat
// completion after a delay (full prefills slower than requests with reuse)
// and reports usage.cacheblend as its answer says.
type fakeEngine struct {
	// answer returns the delay before the first token and the usage
	// extension of a request carrying "cacheblend" settings cb; usage nil:
	// none is sent.
	answer func(cb map[string]any) (time.Duration, map[string]any)
	// status, when set, answers every chat request with it.
	status int

	mu       sync.Mutex
	systems  []string         // the requests' system messages, in order
	settings []map[string]any // their "cacheblend" settings
	docs     []string         // ingested document texts
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		return
	case "/v1/documents":
		var body struct {
			Documents []struct{ Text string } `json:"documents"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		for _, d := range body.Documents {
			f.docs = append(f.docs, d.Text)
		}
		f.mu.Unlock()
		io.WriteString(w, `{"object":"list","data":[]}`)
		return
	case "/v1/chat/completions":
	default:
		http.NotFound(w, r)
		return
	}
	var body struct {
		Messages []struct {
			Role, Content string
		} `json:"messages"`
		Stream     bool           `json:"stream"`
		CacheBlend map[string]any `json:"cacheblend"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || !body.Stream || len(body.Messages) != 2 {
		http.Error(w, fmt.Sprintf("bad request %+v %v", body, err), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.systems = append(f.systems, body.Messages[0].Content)
	f.settings = append(f.settings, body.CacheBlend)
	f.mu.Unlock()
	if f.status != 0 {
		http.Error(w, `{"error":{"message":"no"}}`, f.status)
		return
	}
	delay, usage := f.answer(body.CacheBlend)
	w.Header().Set("Content-Type", "text/event-stream")
	time.Sleep(delay)
	io.WriteString(w, "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
	u := map[string]any{"prompt_tokens": 100, "completion_tokens": 1}
	if usage != nil {
		u["cacheblend"] = usage
	}
	b, _ := json.Marshal(map[string]any{"id": "c1", "choices": []any{}, "usage": u})
	fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
}

func isFull(cb map[string]any) bool { return cb["reuse"] == false }

// A reuse request that hits the documents and a full prefill that hits
// nothing, with the full prefill 20 ms slower.
func goodAnswer(cb map[string]any) (time.Duration, map[string]any) {
	if isFull(cb) {
		return 20 * time.Millisecond, map[string]any{"prefix_hit_tokens": 0, "non_prefix_hit_tokens": 0, "recomputed_tokens": 100}
	}
	return time.Millisecond, map[string]any{"prefix_hit_tokens": 4, "non_prefix_hit_tokens": 80, "recomputed_tokens": 16}
}

func smallModel(t *testing.T) *model.Model {
	t.Helper()
	m, err := model.New(model.Config{Layers: 2, Dim: 32, Heads: 2, KVHeads: 1, FFNDim: 64, MaxPositions: 2048, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Run with a stack: every configuration timed on it with its own settings,
// every request unique, full prefills interleaved with the requests with
// reuse, the speedup the ratio of the medians; a stack that does not reuse
// as asked fails the run.
func TestRunOnStack(t *testing.T) {
	tests := []struct {
		name    string
		answer  func(map[string]any) (time.Duration, map[string]any)
		status  int
		wantErr error  // errors.Is, when set
		errText string // contained in the error, when set
	}{
		{name: "reused", answer: goodAnswer},
		{name: "no non-prefix reuse", wantErr: ErrNotReused, errText: "reused no token off the prefix",
			answer: func(cb map[string]any) (time.Duration, map[string]any) {
				if isFull(cb) {
					return goodAnswer(cb)
				}
				return 0, map[string]any{"prefix_hit_tokens": 90, "non_prefix_hit_tokens": 0, "recomputed_tokens": 10}
			}},
		{name: "full prefill hit the cache", wantErr: ErrNotReused, errText: "full prefill reused",
			answer: func(cb map[string]any) (time.Duration, map[string]any) {
				return 0, map[string]any{"prefix_hit_tokens": 32, "non_prefix_hit_tokens": 50}
			}},
		{name: "no usage extension", errText: "no usage.cacheblend",
			answer: func(map[string]any) (time.Duration, map[string]any) { return 0, nil }},
		{name: "refused", status: http.StatusBadRequest, errText: "http_400: HTTP 400: no", answer: goodAnswer},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeEngine{answer: tc.answer, status: tc.status}
			srv := httptest.NewServer(f)
			defer srv.Close()
			st := &Stack{API: srv.URL, Repeats: 2, Warmup: 1}
			cfg := Config{Ratios: []float64{0, 0.3}, Prompts: 2, Docs: 2, Positions: 2, Stack: st}
			rep, err := Run(context.Background(), smallModel(t), "small", BuiltinPrompts(), cfg)
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) || tc.errText != "" && (err == nil || !strings.Contains(err.Error(), tc.errText)) {
				t.Fatalf("error %v, want %v containing %q", err, tc.wantErr, tc.errText)
			}
			if tc.errText != "" {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rep.Stack == nil || rep.Stack.Repeats != 2 || rep.Stack.PromptTokens != 100 || len(rep.Points) != 3 {
				t.Fatalf("report %+v", rep)
			}
			for _, p := range rep.Points {
				if p.Requests != 4 || p.NonPrefixHitTokens != 80 || p.PrefixHitTokens != 4 ||
					p.FullTTFTMs < 20 || p.BlendTTFTMs <= 0 || p.TTFTSpeedup != p.FullTTFTMs/p.BlendTTFTMs || p.Speedup() != p.TTFTSpeedup {
					t.Fatalf("point %+v", p)
				}
			}
			// 1 warm-up pair, then 3 configurations × 2 prompts × 2 repeats.
			if len(f.systems) != 2*(1+12) {
				t.Fatalf("%d requests, want 26", len(f.systems))
			}
			seen := map[string]bool{}
			for _, s := range f.systems {
				if seen[s] {
					t.Fatalf("system message %q sent twice: a prefix-cache hit", s)
				}
				seen[s] = true
			}
			var order []bool // per pair: the full prefill went first
			var wantSettings []string
			for i := 2; i < len(f.settings); i += 2 {
				a, b := f.settings[i], f.settings[i+1]
				if isFull(a) == isFull(b) {
					t.Fatalf("pair %d: %v and %v, want one full prefill and one with reuse", i/2, a, b)
				}
				order = append(order, isFull(a))
				if isFull(a) {
					a = b
				}
				wantSettings = append(wantSettings, fmt.Sprint(a))
			}
			if !strings.Contains(fmt.Sprint(order), "true") || !strings.Contains(fmt.Sprint(order), "false") {
				t.Fatalf("pairs always in the same order: %v", order)
			}
			want := []string{"map[recompute_ratio:0 selection:deviation]", "map[recompute_ratio:0.3 selection:deviation]", "map[recompute_ratio:0.3 selection:random]"}
			for i, s := range wantSettings {
				if w := want[i/4]; s != w {
					t.Fatalf("request %d with reuse sent %s, want %s", i, s, w)
				}
			}
			if len(f.docs) != 8 || len(f.docs[0]) != MaxDocTokens {
				t.Fatalf("%d documents ingested, the first of %d bytes: want the 8 sample documents cut to %d byte tokens", len(f.docs), len(f.docs[0]), MaxDocTokens)
			}
			var tab strings.Builder
			if err := rep.WriteTable(&tab); err != nil || !strings.Contains(tab.String(), "TTFT speedup") || !strings.Contains(tab.String(), "median of 4 requests") {
				t.Fatalf("table %v:\n%s", err, tab.String())
			}
		})
	}
}

func TestConfigurations(t *testing.T) {
	tests := []struct {
		name   string
		ratios []float64
		want   string
	}{
		{name: "defaults", ratios: DefaultRatios, want: "[{0 hkvd} {0.05 hkvd} {0.05 random} {0.15 hkvd} {0.15 random} {0.3 hkvd} {0.3 random} {1 hkvd}]"},
		{name: "unsorted with a duplicate", ratios: []float64{1, 0.5, 1}, want: "[{0.5 hkvd} {0.5 random} {1 hkvd}]"},
		{name: "none", want: "[]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var cs []string
			for _, c := range configurations(tc.ratios) {
				cs = append(cs, fmt.Sprintf("{%g %v}", c.ratio, c.rule))
			}
			if got := "[" + strings.Join(cs, " ") + "]"; got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}
