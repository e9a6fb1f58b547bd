package metrics

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

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
		h.Observe(v, "chat")
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

// TestLabelPolicy: record methods refuse label values the contract does not take (counted,
// reported, nothing recorded) and record a capped value that is not valid UTF-8 as _other;
// Series returns the same refusals as errors.
func TestLabelPolicy(t *testing.T) {
	var rf refusals
	r, reg := newHandRegistry(t, rf.opt())
	h, _ := r.Histogram("x_seconds")
	g, _ := r.Gauge("w_ratio")
	c, _ := r.Counter("y_total")
	tests := []struct {
		name   string
		record func()
		reason LabelReason
		label  string
	}{
		{"not allowed", func() { h.Observe(1, "embeddings") }, ReasonNotAllowed, "op"},
		{"not allowed, context", func() { h.ObserveContext(t.Context(), 1, "embeddings") }, ReasonNotAllowed, "op"},
		{"missing", func() { h.Observe(1) }, ReasonMissing, ""},
		{"extra", func() { h.Observe(1, "chat", "x") }, ReasonExtra, ""},
		{"missing on two labels", func() { g.Set(1, "m") }, ReasonMissing, ""},
		{"allowed checked on capped instrument", func() { g.Set(1, "m", "text_completion") }, ReasonNotAllowed, "op"},
		{"counter add", func() { c.Add(1, "c") }, ReasonNotAllowed, "kind"},
		{"counter inc", func() { c.Inc("c") }, ReasonNotAllowed, "kind"},
		{"counter total", func() { c.SetTotal(1, "a", "b") }, ReasonExtra, ""},
		{"invalid utf-8 on an allowed label", func() { c.Inc("\xff") }, ReasonNotAllowed, "kind"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.record()
			var le *LabelError
			if err := rf.one(t, tc.name); !errors.As(err, &le) {
				t.Fatalf("error %v is not a *LabelError", err)
			}
			if le.Reason != tc.reason || le.Label != tc.label {
				t.Fatalf("got %+v", le)
			}
			if le.Error() == "" {
				t.Fatal("empty message")
			}
		})
	}
	if st := r.RecordStats(); st != (RecordStats{Refused: uint64(len(tests))}) {
		t.Errorf("RecordStats %+v, want %d refused", st, len(tests))
	}
	// A refused capped value must not have consumed a cap slot; nothing was recorded.
	if n := len(r.caps["model"].admitted); n != 0 {
		t.Errorf("refused values admitted %d cap slots", n)
	}
	fams := gather(t, reg)
	if fams["w_ratio"] != nil {
		t.Errorf("refused values created series: %v", fams["w_ratio"])
	}
	for _, kind := range []string{"a", "b"} {
		if v := value(fams, "y_total", map[string]string{"kind": kind}); v != 0 {
			t.Errorf("refused records moved y_total{kind=%s} to %v", kind, v)
		}
	}
	// Series refuses with an error.
	var le *LabelError
	if _, err := h.Series("embeddings"); !errors.As(err, &le) || le.Reason != ReasonNotAllowed {
		t.Errorf("Histogram.Series: %v", err)
	}
	if _, err := c.Series(); !errors.As(err, &le) || le.Reason != ReasonMissing {
		t.Errorf("Counter.Series: %v", err)
	}
	if _, err := g.Series("m", "chat", "x"); !errors.As(err, &le) || le.Reason != ReasonExtra {
		t.Errorf("Gauge.Series: %v", err)
	}
	rf.none(t, "Series")

	// A capped value that is not valid UTF-8 is recorded as _other, without a cap slot.
	g.Set(3, "\xff", "chat")
	g.Set(4, "\xfe", "chat")
	rf.none(t, "invalid UTF-8 on a capped label")
	if st := r.RecordStats(); st.InvalidLabelValues != 2 {
		t.Errorf("InvalidLabelValues = %d, want 2", st.InvalidLabelValues)
	}
	if n := len(r.caps["model"].admitted); n != 0 {
		t.Errorf("invalid values admitted %d cap slots", n)
	}
	if v := value(gather(t, reg), "w_ratio", map[string]string{"model": OtherValue, "op": "chat"}); v != 4 {
		t.Errorf("w_ratio{model=_other} = %v, want 4", v)
	}
	gs, err := g.Series("\xff", "chat")
	if err != nil {
		t.Fatalf("Series of an invalid capped value: %v", err)
	}
	gs.Set(5)
	if v := value(gather(t, reg), "w_ratio", map[string]string{"model": OtherValue, "op": "chat"}); v != 5 {
		t.Errorf("series handle of an invalid capped value: w_ratio{model=_other} = %v, want 5", v)
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
					m.RecordRequest(t.Context(), rec)
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
	var rf refusals
	r, reg := newHandRegistry(t, rf.opt())
	c, _ := r.Counter("y_total")
	z, _ := r.Counter("z_total")
	c.SetTotal(5, "a")
	c.SetTotal(7, "a")
	rf.none(t, "rising totals")
	za, err := z.Series()
	if err != nil {
		t.Fatal(err)
	}
	cb, err := c.Series("b")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		record func()
		want   error
	}{
		{"lower total", func() { c.SetTotal(3, "a") }, ErrCounterDecrease},
		{"negative total", func() { c.SetTotal(-1, "b") }, ErrNegative},
		{"NaN total", func() { c.SetTotal(math.NaN(), "a") }, ErrNaN},
		{"negative increment", func() { c.Add(-1, "a") }, ErrNegative},
		{"NaN increment", func() { c.Add(math.NaN(), "a") }, ErrNaN},
		{"infinite increment", func() { c.Add(math.Inf(1), "a") }, ErrInfinite},
		{"unlabelled negative", func() { z.Add(-0.5) }, ErrNegative},
		{"series negative", func() { za.Add(-0.5) }, ErrNegative},
		{"series infinite total", func() { cb.SetTotal(math.Inf(1)) }, ErrInfinite},
	}
	for _, tc := range tests {
		tc.record()
		if err := rf.one(t, tc.name); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	cb.SetTotal(2)
	cb.SetTotal(1)
	if err := rf.one(t, "series lower total"); !errors.Is(err, ErrCounterDecrease) {
		t.Errorf("series lower total: %v", err)
	}
	c.SetTotal(7, "a")
	rf.none(t, "an equal total")
	fams := gather(t, reg)
	if got := value(fams, "y_total", map[string]string{"kind": "a"}); got != 7 {
		t.Errorf("y_total{kind=a} = %v, want 7", got)
	}
	if got := value(fams, "y_total", map[string]string{"kind": "b"}); got != 2 {
		t.Errorf("y_total{kind=b} = %v, want 2", got)
	}
	if got := value(fams, "z_total", nil); got != 0 {
		t.Errorf("z_total = %v, want 0", got)
	}
	h, _ := r.Histogram("x_seconds")
	hs, err := h.Series("chat")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []float64{-1, math.NaN(), math.Inf(1)} {
		h.Observe(v, "chat")
		h.ObserveContext(t.Context(), v, "chat")
		hs.Observe(v)
		hs.ObserveContext(t.Context(), v)
		if errs := rf.take(); len(errs) != 4 {
			t.Errorf("histogram: %v refused %d times, want 4", v, len(errs))
		}
	}
	if n := histCount(gather(t, reg), "x_seconds", map[string]string{"op": "chat"}); n != 0 {
		t.Errorf("histogram recorded %d refused values", n)
	}
	g, _ := r.Gauge("w_ratio")
	g.Set(math.NaN(), "m", "chat")
	if err := rf.one(t, "gauge NaN"); !errors.Is(err, ErrNaN) {
		t.Errorf("gauge NaN: %v", err)
	}
	g.Set(-2, "m", "chat")
	rf.none(t, "gauges may go negative")
	gs, err := g.Series("m", "chat")
	if err != nil {
		t.Fatal(err)
	}
	gs.Set(math.Inf(-1))
	if err := rf.one(t, "gauge series -Inf"); !errors.Is(err, ErrInfinite) {
		t.Errorf("gauge series -Inf: %v", err)
	}
	if v := value(gather(t, reg), "w_ratio", map[string]string{"model": "m", "op": "chat"}); v != -2 {
		t.Errorf("w_ratio = %v, want -2", v)
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
	m.RecordRequest(t.Context(), RequestRecord{Operation: "chat", Model: odd, HasTTFT: true, TTFT: 1e8, E2E: 3e8, OutputTokens: 2})
	m.RecordHTTP("POST", "/v1/\"chat\"", 200, 0.3)
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
				m.RecordRequest(t.Context(), rec)
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
	if st := m.Registry().RecordStats(); st != (RecordStats{}) {
		t.Fatalf("RecordStats %+v", st)
	}
}

// TestHotPathsDoNotAllocate: recording into existing series allocates nothing, through the
// registry and through every facade's hot-path record methods.
func TestHotPathsDoNotAllocate(t *testing.T) {
	e, _ := newEngine(t)
	w, err := NewWorkerMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBlendMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rec := RequestRecord{Operation: "chat", Model: "m", HasTTFT: true, TTFT: 1e8, E2E: 1e9, PromptTokens: 10, OutputTokens: 8}
	e.RecordRequest(t.Context(), rec)
	e.RecordHTTP("POST", "/v1/chat/completions", 200, 0.5)
	bound, err := e.requests.ttft.Series("chat", "m")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	lookup := LookupRecord{Duration: time.Millisecond, PrefixHitTokens: 10, RequestedTokens: 20}
	for name, f := range map[string]func(){
		"RecordRequest":            func() { e.RecordRequest(ctx, rec) },
		"RecordHTTP":               func() { e.RecordHTTP("POST", "/v1/chat/completions", 200, 0.5) },
		"Histogram.Observe":        func() { e.requests.ttft.Observe(0.3, "chat", "m") },
		"Histogram.ObserveContext": func() { e.requests.ttft.ObserveContext(ctx, 0.3, "chat", "m") },
		"HistogramSeries.Observe":  func() { bound.Observe(0.3) },
		"Counter.Add":              func() { e.requests.promptTokens.Add(3, "m") },
		"AddKVTransfer":            func() { w.AddKVTransfer(KVLoad, 10, 1) },
		"LookupFallback":           func() { e.LookupFallback("timeout") },
		"ObserveForward":           func() { w.ObserveForward(ctx, PhaseDecode, time.Millisecond) },
		"ObserveRecomputeRatio":    func() { w.ObserveRecomputeRatio(3, 10) },
		"BlendFailure":             func() { w.BlendFailure(BlendOpStore) },
		"RecordLookup":             func() { b.RecordLookup(ctx, lookup) },
		"RecordRetrieve":           func() { b.RecordRetrieve(ctx, time.Millisecond, false) },
		"AddChunksEvicted":         func() { b.AddChunksEvicted(TierL2, 1) },
	} {
		if n := testing.AllocsPerRun(200, f); n != 0 {
			t.Errorf("%s: %v allocs/op, want 0", name, n)
		}
	}
}
