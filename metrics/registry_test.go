package metrics

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// handContract is the chapter's hand example: bounds 0.1, 0.5, 1.0 and a label op.
const handContract = `version: 1
instruments:
  - name: x_seconds
    type: histogram
    help: The hand example.
    unit: s
    owners: [engine]
    labels:
      - key: op
        allowed: [chat, text_completion]
    buckets: [0.1, 0.5, 1.0]
  - name: y_total
    type: counter
    help: A counter.
    unit: "{thing}"
    owners: [engine]
    labels:
      - key: kind
        allowed: [a, b]
  - name: z_total
    type: counter
    help: An unlabelled counter.
    unit: "{thing}"
    owners: [engine]
  - name: w_ratio
    type: gauge
    help: A capped gauge.
    unit: "1"
    owners: [engine]
    labels:
      - key: model
        capped: true
      - key: op
        allowed: [chat]
`

func newHandRegistry(t *testing.T, opts ...Option) (*Registry, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := NewRegistry(reg, mustContract(t, handContract), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r, reg
}

// TestHandExampleHistogram: observations 0.05, 0.1, 0.3, 2.0 into bounds 0.1/0.5/1.0 give
// exactly the chapter's six lines in text format 0.0.4 (le means "at most").
func TestHandExampleHistogram(t *testing.T) {
	r, reg := newHandRegistry(t)
	h, err := r.Histogram("x_seconds")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []float64{0.05, 0.1, 0.3, 2.0} {
		if err := h.Observe(v, "chat"); err != nil {
			t.Fatal(err)
		}
	}
	body, ctype := scrape(t, reg, acceptText)
	if !strings.HasPrefix(ctype, "text/plain; version=0.0.4") {
		t.Fatalf("content type %q", ctype)
	}
	var got []string
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, `x_seconds_`) && strings.Contains(line, `op="chat"`) {
			got = append(got, line)
		}
	}
	want := []string{
		`x_seconds_bucket{op="chat",le="0.1"} 2`,
		`x_seconds_bucket{op="chat",le="0.5"} 3`,
		`x_seconds_bucket{op="chat",le="1"} 3`,
		`x_seconds_bucket{op="chat",le="+Inf"} 4`,
		`x_seconds_sum{op="chat"} 2.45`,
		`x_seconds_count{op="chat"} 4`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("exposition lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(body, "# HELP x_seconds The hand example.\n# TYPE x_seconds histogram\n") {
		t.Fatalf("HELP/TYPE lines missing:\n%s", body)
	}
}

func TestRegistryRefusesWhatTheContractLacks(t *testing.T) {
	r, _ := newHandRegistry(t)
	if _, err := r.Counter("nope_total"); !errors.Is(err, ErrUnknownMetric) {
		t.Errorf("unknown metric: %v", err)
	}
	if _, err := r.Counter("x_seconds"); !errors.Is(err, ErrWrongType) {
		t.Errorf("wrong type: %v", err)
	}
	if _, err := r.Histogram("y_total"); !errors.Is(err, ErrWrongType) {
		t.Errorf("wrong type: %v", err)
	}
	h1, _ := r.Histogram("x_seconds")
	h2, err := r.Histogram("x_seconds")
	if err != nil || h1.in != h2.in {
		t.Errorf("second request must share the instrument: %v", err)
	}
	if got := r.Registered(); strings.Join(got, ",") != "x_seconds" {
		t.Errorf("Registered() = %v", got)
	}
	if _, err := NewRegistry(nil, r.Contract()); err == nil {
		t.Error("nil Registerer accepted")
	}
	if _, err := NewRegistry(prometheus.NewRegistry(), nil); err == nil {
		t.Error("nil contract accepted")
	}
	// A facade whose contract lacks its instruments fails to build.
	if _, err := NewEngineMetrics(prometheus.NewRegistry(), WithContract(r.Contract())); !errors.Is(err, ErrUnknownMetric) {
		t.Errorf("engine facade on a foreign contract: %v", err)
	}
}

func TestLabelPolicy(t *testing.T) {
	r, reg := newHandRegistry(t)
	h, _ := r.Histogram("x_seconds")
	g, _ := r.Gauge("w_ratio")
	tests := []struct {
		name   string
		err    error
		reason LabelReason
		label  string
	}{
		{"not allowed", h.Observe(1, "embeddings"), ReasonNotAllowed, "op"},
		{"missing", h.Observe(1), ReasonMissing, ""},
		{"extra", h.Observe(1, "chat", "x"), ReasonExtra, ""},
		{"missing on two labels", g.Set(1, "m"), ReasonMissing, ""},
		{"invalid utf-8 capped", g.Set(1, "\xff", "chat"), ReasonInvalidUTF8, "model"},
		{"allowed checked on capped instrument", g.Set(1, "m", "text_completion"), ReasonNotAllowed, "op"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var le *LabelError
			if !errors.As(tc.err, &le) {
				t.Fatalf("error %v is not a *LabelError", tc.err)
			}
			if le.Reason != tc.reason || le.Label != tc.label {
				t.Fatalf("got %+v", le)
			}
			if le.Error() == "" {
				t.Fatal("empty message")
			}
		})
	}
	// A refused capped value must not have consumed a cap slot; nothing was recorded.
	if n := len(r.caps["model"].admitted); n != 0 {
		t.Errorf("refused values admitted %d cap slots", n)
	}
	if fams := gather(t, reg); fams["w_ratio"] != nil {
		t.Errorf("refused values created series: %v", fams["w_ratio"])
	}
}

// TestLabelCap: 64 distinct models per label key, then "_other"; at most 65 series.
func TestLabelCap(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		cap  int
	}{
		{"default 64", nil, 64},
		{"configured 3", []Option{WithLabelCap(3)}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m, err := NewEngineMetrics(reg, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			const distinct = 70
			for i := range distinct {
				for range 2 { // twice: the second pass goes through the cached path
					rec := RequestRecord{Operation: "chat", Model: fmt.Sprintf("model-%02d", i), HasTTFT: true,
						TTFT: 1e8, E2E: 5e8, OutputTokens: 3, PromptTokens: 10}
					if err := m.RecordRequest(t.Context(), rec); err != nil {
						t.Fatal(err)
					}
				}
			}
			fams := gather(t, reg)
			for _, name := range []string{NameTTFT, NameTPOT, NameRequestDuration, "cb_engine_prompt_tokens_total"} {
				if n := len(fams[name].GetMetric()); n != tc.cap+1 {
					t.Errorf("%s: %d series, want %d", name, n, tc.cap+1)
				}
			}
			lbl := func(model string) map[string]string {
				return map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": model}
			}
			if got := histCount(fams, NameTTFT, lbl(fmt.Sprintf("model-%02d", tc.cap-1))); got != 2 {
				t.Errorf("last admitted model: count %d, want 2", got)
			}
			if got := histCount(fams, NameTTFT, lbl(fmt.Sprintf("model-%02d", tc.cap))); got != 0 {
				t.Errorf("first overflow model has its own series")
			}
			if got := histCount(fams, NameTTFT, lbl(OtherValue)); got != uint64(2*(distinct-tc.cap)) {
				t.Errorf("_other count %d, want %d", got, 2*(distinct-tc.cap))
			}
			if got := value(fams, "cb_engine_prompt_tokens_total", map[string]string{"gen_ai_request_model": OtherValue}); got != float64(20*(distinct-tc.cap)) {
				t.Errorf("_other prompt tokens %v", got)
			}
		})
	}
}

// TestCountersNeverGoDown: lower totals, negative, NaN and infinite increments are refused.
func TestCountersNeverGoDown(t *testing.T) {
	r, reg := newHandRegistry(t)
	c, _ := r.Counter("y_total")
	z, _ := r.Counter("z_total")
	if err := c.SetTotal(5, "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetTotal(7, "a"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"lower total", c.SetTotal(3, "a"), ErrCounterDecrease},
		{"negative total", c.SetTotal(-1, "b"), ErrNegative},
		{"NaN total", c.SetTotal(math.NaN(), "a"), ErrNaN},
		{"negative increment", c.Add(-1, "a"), ErrNegative},
		{"NaN increment", c.Add(math.NaN(), "a"), ErrNaN},
		{"infinite increment", c.Add(math.Inf(1), "a"), ErrInfinite},
		{"unlabelled negative", z.Add(-0.5), ErrNegative},
	}
	for _, tc := range tests {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if err := c.SetTotal(7, "a"); err != nil {
		t.Errorf("an equal total must be accepted: %v", err)
	}
	fams := gather(t, reg)
	if got := value(fams, "y_total", map[string]string{"kind": "a"}); got != 7 {
		t.Errorf("y_total{kind=a} = %v, want 7", got)
	}
	if got := value(fams, "z_total", nil); got != 0 {
		t.Errorf("z_total = %v, want 0", got)
	}
	h, _ := r.Histogram("x_seconds")
	for _, v := range []float64{-1, math.NaN(), math.Inf(1)} {
		if err := h.Observe(v, "chat"); err == nil {
			t.Errorf("histogram accepted %v", v)
		}
	}
	g, _ := r.Gauge("w_ratio")
	if err := g.Set(math.NaN(), "m", "chat"); !errors.Is(err, ErrNaN) {
		t.Errorf("gauge NaN: %v", err)
	}
	if err := g.Set(-2, "m", "chat"); err != nil {
		t.Errorf("gauges may go negative: %v", err)
	}
}

// TestSeriesExistAtZero: unlabelled series and allowed-only combinations exist before any event.
func TestSeriesExistAtZero(t *testing.T) {
	r, reg := newHandRegistry(t)
	if _, err := r.Histogram("x_seconds"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Counter("y_total"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Counter("z_total"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Gauge("w_ratio"); err != nil {
		t.Fatal(err)
	}
	fams := gather(t, reg)
	for _, kind := range []string{"a", "b"} {
		if v := value(fams, "y_total", map[string]string{"kind": kind}); v != 0 {
			t.Errorf("y_total{kind=%s} = %v, want 0", kind, v)
		}
	}
	if v := value(fams, "z_total", nil); v != 0 {
		t.Errorf("z_total = %v", v)
	}
	for _, op := range []string{"chat", "text_completion"} {
		if m := find(fams, "x_seconds", map[string]string{"op": op}); m == nil || m.Histogram.GetSampleCount() != 0 {
			t.Errorf("x_seconds{op=%s} not at zero: %v", op, m)
		}
	}
	if fams["w_ratio"] != nil {
		t.Error("capped instruments have no series before an event")
	}
}

// TestLabelValuesAreEscaped: ", \ and newline survive the exposition in both formats.
func TestLabelValuesAreEscaped(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewEngineMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	odd := "we\"ird\\model\nname"
	if err := m.RecordRequest(t.Context(), RequestRecord{Operation: "chat", Model: odd, HasTTFT: true, TTFT: 1e8, E2E: 3e8, OutputTokens: 2}); err != nil {
		t.Fatal(err)
	}
	if err := m.RecordHTTP("POST", "/v1/\"chat\"", 200, 0.3); err != nil {
		t.Fatal(err)
	}
	body, _ := scrape(t, reg, acceptText)
	if !strings.Contains(body, `gen_ai_request_model="we\"ird\\model\nname"`) {
		t.Fatalf("escaped value not found in:\n%s", body)
	}
	parsed := parseText(t, body)
	lbl := map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": odd}
	if got := histCount(parsed, NameTTFT, lbl); got != 1 {
		t.Errorf("text round trip: TTFT count %d for %q", got, odd)
	}
	if find(parsed, NameHTTPDuration, map[string]string{"http_request_method": "POST", "http_route": "/v1/\"chat\"", "http_response_status_code": "200"}) == nil {
		t.Error("text round trip lost the route")
	}
	omBody, _ := scrape(t, reg, acceptOpenMetrics)
	om := parseOpenMetrics(t, omFamily(omBody, NameTTFT))
	if got := histCount(om, NameTTFT, lbl); got != 1 {
		t.Errorf("OpenMetrics round trip: TTFT count %d", got)
	}
}

func TestPromlintClean(t *testing.T) {
	regs := allFacades(t)
	for name, reg := range regs {
		problems, err := testutil.GatherAndLint(reg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, p := range problems {
			t.Errorf("%s: promlint: %s: %s", name, p.Metric, p.Text)
		}
	}
}

// TestConcurrentRecording exercises the lock-free cache under the race detector.
func TestConcurrentRecording(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewEngineMetrics(reg, WithLabelCap(8))
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 4, 300
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				rec := RequestRecord{Operation: "chat", Model: fmt.Sprintf("m%d", (w*each+i)%16), HasTTFT: true,
					TTFT: 1e7, E2E: 1e8, OutputTokens: 4}
				if err := m.RecordRequest(t.Context(), rec); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			scrape(t, reg, acceptText)
		}
	})
	wg.Wait()
	var total uint64
	for _, mt := range gather(t, reg)[NameTTFT].GetMetric() {
		total += mt.GetHistogram().GetSampleCount()
	}
	if total != workers*each {
		t.Fatalf("recorded %d, want %d", total, workers*each)
	}
	if n := len(gather(t, reg)[NameTTFT].GetMetric()); n != 9 {
		t.Fatalf("%d series with cap 8, want 9", n)
	}
}

// TestHotPathsDoNotAllocate: observing into existing series allocates nothing.
func TestHotPathsDoNotAllocate(t *testing.T) {
	e, _ := newEngine(t)
	rec := RequestRecord{Operation: "chat", Model: "m", HasTTFT: true, TTFT: 1e8, E2E: 1e9, PromptTokens: 10, OutputTokens: 8}
	if err := e.RecordRequest(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	if err := e.RecordHTTP("POST", "/v1/chat/completions", 200, 0.5); err != nil {
		t.Fatal(err)
	}
	bound, err := e.ttft.Series("chat", "m")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for name, f := range map[string]func(){
		"RecordRequest":            func() { _ = e.RecordRequest(ctx, rec) },
		"RecordHTTP":               func() { _ = e.RecordHTTP("POST", "/v1/chat/completions", 200, 0.5) },
		"Histogram.Observe":        func() { _ = e.ttft.Observe(0.3, "chat", "m") },
		"Histogram.ObserveContext": func() { _ = e.ttft.ObserveContext(ctx, 0.3, "chat", "m") },
		"HistogramSeries.Observe":  func() { _ = bound.Observe(0.3) },
		"Counter.Add":              func() { _ = e.promptTokens.Add(3, "m") },
		"AddKVTransfer":            func() { _ = e.AddKVTransfer("load", 10, 1) },
	} {
		if n := testing.AllocsPerRun(200, f); n != 0 {
			t.Errorf("%s: %v allocs/op, want 0", name, n)
		}
	}
}
