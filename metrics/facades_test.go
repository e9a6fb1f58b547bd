package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/trace"
)

// exercise drives every method of the four facades once, so that every instrument (also the
// ones with capped labels, which have no series before an event) appears in the exposition,
// and checks that none of it was refused.
func exercise(t testing.TB, e *EngineMetrics, w *WorkerMetrics, b *BlendMetrics, p *ProcessMetrics) {
	t.Helper()
	ctx := context.Background()
	e.RecordRequest(ctx, RequestRecord{Operation: "chat", Model: "m1", HasTTFT: true, TTFT: 2e8, E2E: 1e9, PromptTokens: 100, OutputTokens: 5})
	e.RecordRequest(ctx, RequestRecord{Operation: "text_completion", Model: "m1", E2E: 3e7, ErrorType: "queue_full"})
	e.RecordHTTP("POST", "/v1/chat/completions", 200, 1.0)
	e.SetEngine(EngineStats{Waiting: 2, Running: 3, KVFree: 10, KVUsed: 5, KVCached: 1, KVTotal: 16, Evictions: 4, Preemptions: 1, BatchTokens: 64, PrefixHitRatio: 0.25})
	e.LookupFallback("timeout")
	w.ObserveForward(ctx, PhasePrefill, 30*time.Millisecond)
	w.ObserveRecomputeRatio(15, 100)
	w.Step()
	w.BlendFailure(BlendOpStore)
	w.AddKVTransfer(KVStore, 8192, 32)
	w.AddKVTransfer(KVLoad, 4096, 16)
	b.RecordLookup(ctx, LookupRecord{Duration: 2 * time.Millisecond, PrefixHitTokens: 256, NonPrefixHitTokens: 300, RequestedTokens: 1000, FingerprintHits: 3, StorageHits: 2, StaleChunks: 1})
	b.ObserveFingerprintMatch(ctx, time.Millisecond)
	b.ObserveSparsePrefetch(ctx, time.Millisecond)
	b.RecordL2Load(1<<20, time.Millisecond)
	b.AddL2CorruptChunks(1)
	b.RecordRetrieve(ctx, 3*time.Millisecond, false)
	b.RecordScatter(ctx, time.Millisecond, 300)
	b.RecordStore(2)
	b.AddFingerprintsUnregistered(1)
	b.AddChunksEvicted(TierL1, 2)
	b.SetEventBusTotals(10, 1)
	b.SetStorage(StorageStats{L1Bytes: 1 << 20, L1Chunks: 4, Fingerprints: 40})
	p.Refresh()
	for name, r := range map[string]*Registry{"engine": e.Registry(), "worker": w.Registry(), "blend": b.Registry(), "process": p.Registry()} {
		if st := r.RecordStats(); st != (RecordStats{}) {
			t.Fatalf("%s: %+v after exercising every method with valid records", name, st)
		}
	}
}

// allFacades builds the four facades, each on its own registry as in four processes, and
// exercises every method.
func allFacades(t testing.TB) map[string]*prometheus.Registry {
	t.Helper()
	regs := map[string]*prometheus.Registry{}
	for _, o := range []string{contract.OwnerEngine, contract.OwnerWorker, contract.OwnerBlend, contract.OwnerProcess, contract.OwnerGateway} {
		regs[o] = prometheus.NewRegistry()
	}
	e, err := NewEngineMetrics(regs[contract.OwnerEngine])
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkerMetrics(regs[contract.OwnerWorker])
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBlendMetrics(regs[contract.OwnerBlend])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewStorageMetrics(regs[contract.OwnerBlend]); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFleetTrust(regs[contract.OwnerBlend]); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{contract.OwnerEngine, contract.OwnerWorker} {
		hs, err := NewHandoffSecurityMetrics(regs[o])
		if err != nil {
			t.Fatal(err)
		}
		hs.Refused(RefusedBadSignature)
	}
	p, err := NewProcessMetrics(regs[contract.OwnerProcess], BuildInfo{Service: "cb-engine", Version: "v0.1.0"},
		func() TraceTotals { return TraceTotals{SpansDropped: 3, ExportErrors: 1} })
	if err != nil {
		t.Fatal(err)
	}
	exercise(t, e, w, b, p)
	g, err := NewGatewayMetrics(regs[contract.OwnerGateway])
	if err != nil {
		t.Fatal(err)
	}
	exerciseGateway(t, g)
	return regs
}

var dtoKind = map[dto.MetricType]contract.Kind{
	dto.MetricType_COUNTER:   contract.Counter,
	dto.MetricType_GAUGE:     contract.Gauge,
	dto.MetricType_HISTOGRAM: contract.Histogram,
}

// TestNamesAndBucketsMatchTheContract: the union of the four facades' expositions (parsed back
// with expfmt) is exactly instruments.yaml: names, TYPE, HELP, label keys and bucket bounds,
// character for character, and each facade registers exactly the instruments it owns.
func TestNamesAndBucketsMatchTheContract(t *testing.T) {
	set, err := contract.Instruments()
	if err != nil {
		t.Fatal(err)
	}
	union := map[string]*dto.MetricFamily{}
	for owner, reg := range allFacades(t) {
		// OpenMetrics: UNIT is the contract's unit word (TestOpenMetricsParses parses it all).
		omBody, _ := scrape(t, reg, acceptOpenMetrics)
		for _, in := range set.Owned(owner) {
			family := strings.TrimSuffix(in.Name, "_total")
			line := "# UNIT " + family + " " + in.PromUnit() + "\n"
			if has := strings.Contains(omBody, "# UNIT "+family+" "); has != (in.PromUnit() != "") ||
				in.PromUnit() != "" && !strings.Contains(omBody, line) {
				t.Errorf("%s: OpenMetrics UNIT line wrong, want %q", in.Name, line)
			}
		}
		body, _ := scrape(t, reg, acceptText)
		fams := parseText(t, body)
		var got []string
		for name, mf := range fams {
			got = append(got, name)
			if prev, ok := union[name]; ok && (prev.GetHelp() != mf.GetHelp() || prev.GetType() != mf.GetType()) {
				t.Errorf("%s: two facades expose it differently", name)
			}
			union[name] = mf
		}
		var want []string
		for _, in := range set.Owned(owner) {
			want = append(want, in.Name)
		}
		sort.Strings(got)
		sort.Strings(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s facade exposes %v\nwant %v", owner, got, want)
		}
	}
	for name := range union {
		if _, ok := set.Lookup(name); !ok {
			t.Errorf("%s: exposed but not in the contract", name)
		}
	}
	for _, in := range set.Instruments {
		mf, ok := union[in.Name]
		if !ok {
			t.Errorf("%s: in the contract but not exposed", in.Name)
			continue
		}
		if dtoKind[mf.GetType()] != in.Type {
			t.Errorf("%s: TYPE %v, contract %s", in.Name, mf.GetType(), in.Type)
		}
		if mf.GetHelp() != in.Help {
			t.Errorf("%s: HELP %q, contract %q", in.Name, mf.GetHelp(), in.Help)
		}
		wantKeys := in.LabelKeys()
		sort.Strings(wantKeys)
		if len(mf.GetMetric()) == 0 {
			t.Errorf("%s: no series", in.Name)
		}
		for _, m := range mf.GetMetric() {
			if got := labelKeys(m); !slices.Equal(got, wantKeys) && len(got)+len(wantKeys) > 0 {
				t.Errorf("%s: label keys %v, contract %v", in.Name, got, wantKeys)
			}
			if in.Type != contract.Histogram {
				continue
			}
			bounds, _, _, hasInf := finiteBounds(m.GetHistogram())
			if !slices.Equal(bounds, in.Buckets) || !hasInf {
				t.Errorf("%s: buckets %v (+Inf %v), contract %v", in.Name, bounds, hasInf, in.Buckets)
			}
		}
	}
	// The bucket lines themselves, character for character (le as the exposition formats it).
	body, _ := scrape(t, mustEngineRegistry(t), acceptText)
	ttft, _ := set.Lookup(NameTTFT)
	var les []string
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, NameTTFT+"_bucket{") {
			i := strings.Index(line, `le="`)
			les = append(les, line[i+4:i+4+strings.Index(line[i+4:], `"`)])
		}
	}
	var want []string
	for _, b := range ttft.Buckets {
		want = append(want, strconvFormat(b))
	}
	want = append(want, "+Inf")
	if !slices.Equal(les, want) {
		t.Errorf("TTFT le values %q, want %q", les, want)
	}
}

func mustEngineRegistry(t testing.TB) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	e, err := NewEngineMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	e.RecordRequest(context.Background(), RequestRecord{Operation: "chat", Model: "m", HasTTFT: true, TTFT: 1e8, E2E: 2e8, OutputTokens: 2})
	return reg
}

func newEngine(t testing.TB, opts ...Option) (*EngineMetrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	e, err := NewEngineMetrics(reg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e, reg
}

// TestTPOTHandExample: TTFT 0.2 s, E2E 1.0 s, 5 tokens gives TPOT 0.8/4 = 0.2 s in le="0.2" and
// not in le="0.15"; one token gives no TPOT; failures carry error_type and give no TTFT/TPOT.
func TestTPOTHandExample(t *testing.T) {
	e, reg := newEngine(t)
	ctx := t.Context()
	e.RecordRequest(ctx, RequestRecord{Operation: "chat", Model: "m", HasTTFT: true, TTFT: 200 * time.Millisecond, E2E: time.Second, OutputTokens: 5, PromptTokens: 7})
	lbl := map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": "m"}
	fams := gather(t, reg)
	tpot := find(fams, NameTPOT, lbl)
	if tpot == nil || tpot.Histogram.GetSampleCount() != 1 {
		t.Fatalf("TPOT series %v", tpot)
	}
	if got := cumulative(t, tpot, 0.2); got != 1 {
		t.Errorf("le=0.2: %d, want 1", got)
	}
	if got := cumulative(t, tpot, 0.15); got != 0 {
		t.Errorf("le=0.15: %d, want 0", got)
	}
	if got := tpot.Histogram.GetSampleSum(); got != 0.2 {
		t.Errorf("TPOT sum %v, want 0.2", got)
	}
	if got := find(fams, NameTTFT, lbl).Histogram.GetSampleSum(); got != 0.2 {
		t.Errorf("TTFT sum %v, want 0.2", got)
	}
	if got := value(fams, "cb_engine_generation_tokens_total", map[string]string{"gen_ai_request_model": "m"}); got != 5 {
		t.Errorf("generation tokens %v", got)
	}

	// One token: TTFT, no TPOT.
	e.RecordRequest(ctx, RequestRecord{Operation: "chat", Model: "m", HasTTFT: true, TTFT: 100 * time.Millisecond, E2E: 100 * time.Millisecond, OutputTokens: 1})
	fams = gather(t, reg)
	if got := histCount(fams, NameTPOT, lbl); got != 1 {
		t.Errorf("one-token request changed TPOT count to %d", got)
	}
	if got := histCount(fams, NameTTFT, lbl); got != 2 {
		t.Errorf("TTFT count %d, want 2", got)
	}

	// Failure after a first token: error_type on the duration, no TTFT or TPOT.
	e.RecordRequest(ctx, RequestRecord{Operation: "chat", Model: "m", HasTTFT: true, TTFT: 50 * time.Millisecond, E2E: 2 * time.Second, OutputTokens: 9, ErrorType: "timeout"})
	fams = gather(t, reg)
	if histCount(fams, NameTTFT, lbl) != 2 || histCount(fams, NameTPOT, lbl) != 1 {
		t.Error("a failed request recorded TTFT or TPOT")
	}
	failed := map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": "m", "error_type": "timeout"}
	if got := histCount(fams, NameRequestDuration, failed); got != 1 {
		t.Errorf("failed duration count %d, want 1", got)
	}
	ok := map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": "m", "error_type": ""}
	if got := histCount(fams, NameRequestDuration, ok); got != 2 {
		t.Errorf("successful duration count %d, want 2", got)
	}
}

// TestRecordRequestRefusals: bad records are refused whole — counted, reported to the
// OnRefused handler, nothing recorded; an HTTP method or status outside the contract is
// recorded as _OTHER / _other instead.
func TestRecordRequestRefusals(t *testing.T) {
	var rf refusals
	e, reg := newEngine(t, rf.opt())
	tests := []struct {
		name string
		rec  RequestRecord
		want error
	}{
		{"ttft after e2e", RequestRecord{Operation: "chat", Model: "m", HasTTFT: true, TTFT: 2e9, E2E: 1e9}, ErrInvalidRecord},
		{"negative e2e", RequestRecord{Operation: "chat", Model: "m", E2E: -1}, ErrNegative},
		{"negative tokens", RequestRecord{Operation: "chat", Model: "m", E2E: 1, OutputTokens: -1}, ErrNegative},
	}
	for _, tc := range tests {
		e.RecordRequest(t.Context(), tc.rec)
		if err := rf.one(t, tc.name); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	var le *LabelError
	e.RecordRequest(t.Context(), RequestRecord{Operation: "embeddings", Model: "m", E2E: 1e9})
	if err := rf.one(t, "unknown operation"); !errors.As(err, &le) || le.Label != "gen_ai_operation_name" || le.Reason != ReasonNotAllowed {
		t.Errorf("unknown operation: %v", err)
	}
	e.RecordRequest(t.Context(), RequestRecord{Operation: "chat", Model: "m", E2E: 1e9, ErrorType: "oops"})
	if err := rf.one(t, "unknown error type"); !errors.As(err, &le) || le.Label != "error_type" {
		t.Errorf("unknown error type: %v", err)
	}
	e.LookupFallback("bored")
	if err := rf.one(t, "unknown fallback reason"); !errors.As(err, &le) || le.Label != "reason" || le.Value != "bored" ||
		!slices.Equal(le.Want, []string{"error", "timeout", "unavailable", "queue_full"}) {
		t.Errorf("unknown fallback reason: %v", err)
	}
	// KV transfer is the worker's (the engine moves no KV of its own).
	w, err := NewWorkerMetrics(reg, rf.opt())
	if err != nil {
		t.Fatal(err)
	}
	w.AddKVTransfer(KVDirection(7), 1, 1)
	if err := rf.one(t, "forged direction"); !errors.As(err, &le) || le.Label != "direction" || le.Value != "KVDirection(7)" {
		t.Errorf("forged direction: %v", err)
	}
	w.AddKVTransfer(KVLoad, -1, 1)
	if err := rf.one(t, "negative bytes"); !errors.Is(err, ErrNegative) {
		t.Errorf("negative bytes: %v", err)
	}
	if st := w.Registry().RecordStats(); st != (RecordStats{Refused: 2}) {
		t.Errorf("worker RecordStats %+v, want 2 refused", st)
	}
	e.RecordHTTP("GET", "/", 200, math.NaN())
	if err := rf.one(t, "NaN duration"); !errors.Is(err, ErrNaN) {
		t.Errorf("NaN duration: %v", err)
	}
	if st := e.Registry().RecordStats(); st != (RecordStats{Refused: 7}) {
		t.Errorf("RecordStats %+v, want 7 refused", st)
	}
	e.RecordHTTP("GET", "/", 99, 0.1)
	e.RecordHTTP("BREW", "/pot", 418, 0.1)
	rf.none(t, "status 99 and method BREW")
	if st := e.Registry().RecordStats(); st != (RecordStats{Refused: 7, InvalidLabelValues: 1}) {
		t.Errorf("RecordStats %+v, want 7 refused, 1 invalid label value", st)
	}
	fams := gather(t, reg)
	for _, name := range []string{NameTTFT, NameRequestDuration, "cb_engine_prompt_tokens_total"} {
		if n := len(fams[name].GetMetric()); n != 0 {
			t.Errorf("%s: refused records created %d series", name, n)
		}
	}
	for _, dir := range []string{"load", "store"} {
		if v := value(fams, "cb_kv_transfer_tokens_total", map[string]string{"direction": dir}); v != 0 {
			t.Errorf("refused kv transfers counted %v %s tokens", v, dir)
		}
	}
	if v := value(fams, "cb_engine_lookup_fallbacks_total", map[string]string{"reason": "bored"}); !math.IsNaN(v) {
		t.Error("an unknown fallback reason has a series")
	}
	if find(fams, NameHTTPDuration, map[string]string{"http_request_method": "_OTHER", "http_route": "/pot", "http_response_status_code": "418"}) == nil {
		t.Error("unknown method not recorded as _OTHER")
	}
	if find(fams, NameHTTPDuration, map[string]string{"http_request_method": "GET", "http_route": "/", "http_response_status_code": OtherValue}) == nil {
		t.Error("status 99 not recorded as _other")
	}
	if n := len(fams[NameHTTPDuration].GetMetric()); n != 2 {
		t.Errorf("%d HTTP series, want 2 (the NaN duration is refused)", n)
	}
}

// TestHistogramCountEqualsRequests: 500 seeded requests; count, sum, +Inf == count, buckets
// non-decreasing, for every latency histogram.
func TestHistogramCountEqualsRequests(t *testing.T) {
	e, reg := newEngine(t)
	rng := rand.New(rand.NewPCG(7, 11))
	type acc struct {
		n   uint64
		sum float64
	}
	want := map[string]*acc{NameTTFT: {}, NameTPOT: {}, NameRequestDuration: {}}
	for range 500 {
		ttft := time.Duration(rng.Int64N(int64(3 * time.Second)))
		e2e := ttft + time.Duration(rng.Int64N(int64(20*time.Second)))
		n := rng.IntN(300)
		errType := ""
		if rng.IntN(10) == 0 {
			errType = "internal"
		}
		rec := RequestRecord{Operation: "chat", Model: "m", TTFT: ttft, HasTTFT: n > 0, E2E: e2e, OutputTokens: n, ErrorType: errType}
		e.RecordRequest(t.Context(), rec)
		want[NameRequestDuration].n++
		want[NameRequestDuration].sum += e2e.Seconds()
		if errType == "" && n > 0 {
			want[NameTTFT].n++
			want[NameTTFT].sum += ttft.Seconds()
			if n >= 2 {
				want[NameTPOT].n++
				want[NameTPOT].sum += ((e2e - ttft) / time.Duration(n-1)).Seconds()
			}
		}
	}
	body, _ := scrape(t, reg, acceptText)
	fams := parseText(t, body)
	for name, w := range want {
		var n uint64
		var sum float64
		for _, m := range fams[name].GetMetric() {
			h := m.GetHistogram()
			_, counts, inf, hasInf := finiteBounds(h)
			if !hasInf || inf != h.GetSampleCount() {
				t.Errorf("%s %v: +Inf %d (present %v) != count %d", name, labelsOf(m), inf, hasInf, h.GetSampleCount())
			}
			for i := 1; i < len(counts); i++ {
				if counts[i] < counts[i-1] {
					t.Errorf("%s: cumulative buckets decrease: %v", name, counts)
				}
			}
			if len(counts) > 0 && counts[len(counts)-1] > inf {
				t.Errorf("%s: last bucket above +Inf", name)
			}
			n += h.GetSampleCount()
			sum += h.GetSampleSum()
		}
		if n != w.n || math.Abs(sum-w.sum) > 1e-9*math.Max(1, w.sum) {
			t.Errorf("%s: count %d sum %v, want %d %v", name, n, sum, w.n, w.sum)
		}
	}
}

// TestEngineGauges: gauges start at zero, come from the engine stats, and the KV blocks by
// state sum to the pool; inconsistent or decreasing stats are refused with nothing changed.
func TestEngineGauges(t *testing.T) {
	var rf refusals
	e, reg := newEngine(t, rf.opt())
	fams := gather(t, reg)
	for _, name := range []string{"cb_engine_requests_waiting", "cb_engine_requests_running", "cb_engine_kv_pool_blocks",
		"cb_engine_batch_tokens", "cb_engine_prefix_cache_hit_ratio", "cb_engine_kv_evictions_total", "cb_engine_preemptions_total"} {
		if v := value(fams, name, nil); v != 0 {
			t.Errorf("%s starts at %v, want 0", name, v)
		}
	}
	for _, st := range []string{"free", "used", "cached"} {
		if v := value(fams, "cb_engine_kv_blocks", map[string]string{"state": st}); v != 0 {
			t.Errorf("kv_blocks{%s} starts at %v", st, v)
		}
	}
	stats := EngineStats{Waiting: 7, Running: 3, KVFree: 100, KVUsed: 20, KVCached: 8, KVTotal: 128, Evictions: 5, Preemptions: 2, BatchTokens: 512, PrefixHitRatio: 0.4}
	e.SetEngine(stats)
	rf.none(t, "SetEngine")
	check := func(stage string) {
		t.Helper()
		fams := gather(t, reg)
		if v := value(fams, "cb_engine_requests_waiting", nil); v != 7 {
			t.Errorf("%s: waiting %v, want the queue depth 7", stage, v)
		}
		if v := value(fams, "cb_engine_requests_running", nil); v != 3 {
			t.Errorf("%s: running %v, want 3", stage, v)
		}
		var sum float64
		for _, m := range fams["cb_engine_kv_blocks"].GetMetric() {
			sum += m.GetGauge().GetValue()
		}
		if pool := value(fams, "cb_engine_kv_pool_blocks", nil); sum != pool || pool != 128 {
			t.Errorf("%s: kv blocks sum %v, pool %v", stage, sum, pool)
		}
		if v := value(fams, "cb_engine_kv_evictions_total", nil); v != 5 {
			t.Errorf("%s: evictions %v", stage, v)
		}
		if v := value(fams, "cb_engine_prefix_cache_hit_ratio", nil); v != 0.4 {
			t.Errorf("%s: prefix hit ratio %v", stage, v)
		}
	}
	check("after SetEngine")
	bad := []struct {
		name string
		s    EngineStats
		want error
	}{
		{"blocks do not sum", EngineStats{KVFree: 1, KVUsed: 1, KVCached: 1, KVTotal: 4, Evictions: 5, Preemptions: 2}, ErrInvalidRecord},
		{"evictions go down", EngineStats{Waiting: 1, KVTotal: 0, Evictions: 4, Preemptions: 2}, ErrCounterDecrease},
		{"preemptions go down", EngineStats{Waiting: 1, Evictions: 6, Preemptions: 1}, ErrCounterDecrease},
		{"negative", EngineStats{Waiting: -1, Evictions: 5, Preemptions: 2}, ErrNegative},
		{"ratio above one", EngineStats{Evictions: 5, Preemptions: 2, PrefixHitRatio: 1.5}, ErrInvalidRecord},
		{"ratio NaN", EngineStats{Evictions: 5, Preemptions: 2, PrefixHitRatio: math.NaN()}, ErrInvalidRecord},
	}
	for _, tc := range bad {
		e.SetEngine(tc.s)
		if err := rf.one(t, tc.name); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	check("after refused stats")
	if st := e.Registry().RecordStats(); st.Refused != uint64(len(bad)) {
		t.Errorf("Refused = %d, want %d", st.Refused, len(bad))
	}
}

// TestExemplars: a sampled span context in ctx puts its trace id on the latency histograms in
// OpenMetrics; an unsampled one does not; text 0.0.4 never shows exemplars.
func TestExemplars(t *testing.T) {
	e, reg := newEngine(t)
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sampled := trace.ContextWithSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled,
	}))
	e.RecordRequest(sampled, RequestRecord{Operation: "chat", Model: "m", HasTTFT: true, TTFT: 3e8, E2E: 1e9, OutputTokens: 3})
	unsampledTID, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	unsampled := trace.ContextWithSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: unsampledTID, SpanID: sid,
	}))
	e.RecordRequest(unsampled, RequestRecord{Operation: "text_completion", Model: "m", HasTTFT: true, TTFT: 3e8, E2E: 1e9, OutputTokens: 3})
	body, ctype := scrape(t, reg, acceptOpenMetrics)
	if !strings.HasPrefix(ctype, "application/openmetrics-text") {
		t.Fatalf("content type %q", ctype)
	}
	if strings.Contains(body, unsampledTID.String()) {
		t.Error("an unsampled span context produced an exemplar")
	}
	for _, name := range []string{NameTTFT, NameTPOT, NameRequestDuration} {
		fams := parseOpenMetrics(t, omFamily(body, name))
		found := false
		for _, m := range fams[name].GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				if ex := b.GetExemplar(); ex != nil {
					l := map[string]string{}
					for _, p := range ex.GetLabel() {
						l[p.GetName()] = p.GetValue()
					}
					if l["trace_id"] == tid.String() && l["span_id"] == sid.String() {
						found = true
					}
				}
			}
		}
		if !found {
			t.Errorf("%s: no exemplar with trace_id %s in OpenMetrics:\n%s", name, tid, body)
		}
	}
	if !strings.Contains(body, "# UNIT "+NameTTFT+" seconds") {
		t.Error("OpenMetrics UNIT line missing")
	}
	text, _ := scrape(t, reg, acceptText)
	if strings.Contains(text, "trace_id") {
		t.Error("text format 0.0.4 must not carry exemplars")
	}
	// Worker and blend duration histograms take exemplars the same way.
	wreg := prometheus.NewRegistry()
	w, err := NewWorkerMetrics(wreg)
	if err != nil {
		t.Fatal(err)
	}
	w.ObserveForward(sampled, PhaseCheck, 4*time.Millisecond)
	if wbody, _ := scrape(t, wreg, acceptOpenMetrics); !strings.Contains(wbody, `trace_id="`+tid.String()+`"`) {
		t.Error("worker forward histogram has no exemplar")
	}
	breg := prometheus.NewRegistry()
	bm, err := NewBlendMetrics(breg)
	if err != nil {
		t.Fatal(err)
	}
	bm.RecordRetrieve(sampled, 2*time.Millisecond, false)
	if bbody, _ := scrape(t, breg, acceptOpenMetrics); !strings.Contains(omFamily(bbody, "lmcache_blend_retrieve_duration_seconds"), `trace_id="`+tid.String()+`"`) {
		t.Error("blend retrieve histogram has no exemplar")
	}
}

func TestHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	e, err := NewEngineMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	h := Handler(reg, func() {
		calls++
		e.SetEngine(EngineStats{Waiting: calls, KVTotal: 0})
	})
	for i, accept := range []string{"", acceptText, acceptOpenMetrics} {
		rec := httptestRecorder(h, accept)
		want := "text/plain; version=0.0.4"
		if accept == acceptOpenMetrics {
			want = "application/openmetrics-text; version=1.0.0"
		}
		if !strings.HasPrefix(rec.Header().Get("Content-Type"), want) {
			t.Errorf("Accept %q: content type %q", accept, rec.Header().Get("Content-Type"))
		}
		if !strings.Contains(rec.Body.String(), "cb_engine_requests_waiting "+strconvItoa(i+1)) {
			t.Errorf("before hook did not refresh the gauge before scrape %d", i+1)
		}
	}
	if calls != 3 {
		t.Errorf("before called %d times, want 3", calls)
	}
}

// TestFacadesShareOneRegistry: all four facades on one Registerer (e.g. `cb up` in one
// process) work; the KV transfer counters engine and worker both own are shared.
func TestFacadesShareOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	e, err := NewEngineMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkerMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBlendMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProcessMetrics(reg, BuildInfo{Service: "cb-worker", Version: "dev"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	exercise(t, e, w, b, p)
	g, err := NewGatewayMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	exerciseGateway(t, g)
	if _, err := NewFleetTrust(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStorageMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewHandoffSecurityMetrics(reg); err != nil {
		t.Fatal(err)
	}
	fams := gather(t, reg)
	if v := value(fams, "cb_kv_transfer_bytes_total", map[string]string{"direction": "load"}); v != 4096 {
		t.Errorf("load bytes %v", v)
	}
	if v := value(fams, "cb_kv_transfer_bytes_total", map[string]string{"direction": "store"}); v != 8192 {
		t.Errorf("store bytes %v", v)
	}
	set, _ := contract.Instruments()
	if len(fams) != len(set.Instruments) {
		t.Errorf("%d families, contract has %d", len(fams), len(set.Instruments))
	}
	if v := value(fams, "cb_build_info", map[string]string{"service": "cb-worker", "version": "dev"}); v != 1 {
		t.Errorf("build info %v", v)
	}
}

func TestWorkerBlendProcess(t *testing.T) {
	regs := allFacades(t)
	w := gather(t, regs[contract.OwnerWorker])
	if v := value(w, "cb_worker_steps_total", nil); v != 1 {
		t.Errorf("steps %v", v)
	}
	rr := find(w, "cb_worker_recompute_ratio", nil)
	if rr == nil || rr.Histogram.GetSampleSum() != 0.15 || cumulative(t, rr, 0.15) != 1 || cumulative(t, rr, 0.1) != 0 {
		t.Errorf("recompute ratio %v", rr)
	}
	b := gather(t, regs[contract.OwnerBlend])
	for name, want := range map[string]float64{
		"lmcache_blend_lookup_requests_total":         1,
		"lmcache_blend_lookup_requested_tokens_total": 1000,
		"lmcache_blend_l2_read_bytes_total":           1 << 20,
		"lmcache_blend_event_bus_published_total":     10,
		"lmcache_blend_event_bus_dropped_total":       1,
		"lmcache_blend_l1_chunks":                     4,
		"lmcache_blend_scattered_tokens_total":        300,
	} {
		if v := value(b, name, nil); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if v := value(b, "lmcache_blend_lookup_hit_tokens_total", map[string]string{"leg": "non_prefix"}); v != 300 {
		t.Errorf("non-prefix hit tokens %v", v)
	}
	thr := find(b, "lmcache_blend_l2_load_throughput_gbps", nil)
	if got := thr.GetHistogram().GetSampleSum(); math.Abs(got-1.048576) > 1e-9 {
		t.Errorf("l2 throughput %v GB/s, want 1.048576", got)
	}
	p := gather(t, regs[contract.OwnerProcess])
	if v := value(p, "cb_trace_spans_dropped_total", nil); v != 3 {
		t.Errorf("dropped spans %v", v)
	}

	// Lower running totals are refused and move nothing.
	var rf refusals
	breg := prometheus.NewRegistry()
	bm, err := NewBlendMetrics(breg, rf.opt())
	if err != nil {
		t.Fatal(err)
	}
	bm.SetEventBusTotals(10, 5)
	rf.none(t, "first bus totals")
	bm.SetEventBusTotals(11, 4)
	if err := rf.one(t, "dropped going down"); !errors.Is(err, ErrCounterDecrease) {
		t.Errorf("dropped going down: %v", err)
	}
	if v := value(gather(t, breg), "lmcache_blend_event_bus_published_total", nil); v != 10 {
		t.Errorf("a refused pair moved published to %v", v)
	}
	bm.SetEventBusTotals(12, 5)
	rf.none(t, "after a refusal")
	preg := prometheus.NewRegistry()
	pm, err := NewProcessMetrics(preg, BuildInfo{Service: "cb-blend"}, nil, rf.opt())
	if err != nil {
		t.Fatal(err)
	}
	pm.SetTraceTotals(TraceTotals{SpansDropped: 4, ExportErrors: 2})
	rf.none(t, "first trace totals")
	pm.SetTraceTotals(TraceTotals{SpansDropped: 9, ExportErrors: 1})
	if err := rf.one(t, "export errors going down"); !errors.Is(err, ErrCounterDecrease) {
		t.Errorf("export errors going down: %v", err)
	}
	if v := value(gather(t, preg), "cb_trace_spans_dropped_total", nil); v != 4 {
		t.Errorf("a refused pair moved spans_dropped to %v", v)
	}
	if st := pm.Registry().RecordStats(); st.Refused != 1 {
		t.Errorf("process Refused = %d, want 1", st.Refused)
	}
	var le *LabelError
	if _, err := NewProcessMetrics(prometheus.NewRegistry(), BuildInfo{Service: "cb-router"}, nil); !errors.As(err, &le) {
		t.Errorf("unknown service: %v", err)
	}
	wreg := prometheus.NewRegistry()
	wm, err := NewWorkerMetrics(wreg, rf.opt())
	if err != nil {
		t.Fatal(err)
	}
	wm.ObserveRecomputeRatio(1, 0)
	if err := rf.one(t, "zero reused tokens"); !errors.Is(err, ErrInvalidRecord) {
		t.Errorf("zero reused tokens: %v", err)
	}
	wm.ObserveRecomputeRatio(-1, 10)
	if err := rf.one(t, "negative imp count"); !errors.Is(err, ErrNegative) {
		t.Errorf("negative imp count: %v", err)
	}
	wm.ObserveForward(t.Context(), ForwardPhase(9), time.Millisecond)
	if err := rf.one(t, "forged phase"); !errors.As(err, &le) || le.Label != "phase" || le.Value != "ForwardPhase(9)" {
		t.Errorf("forged phase: %v", err)
	}
	wm.ObserveForward(t.Context(), PhaseDecode, -time.Millisecond)
	if err := rf.one(t, "negative duration"); !errors.Is(err, ErrNegative) {
		t.Errorf("negative duration: %v", err)
	}
	wm.BlendFailure(BlendOp(3))
	if err := rf.one(t, "forged op"); !errors.As(err, &le) || le.Label != "op" || le.Value != "BlendOp(3)" {
		t.Errorf("forged op: %v", err)
	}
	wf := gather(t, wreg)
	for _, ph := range forwardPhaseNames {
		if n := histCount(wf, "cb_worker_forward_duration_seconds", map[string]string{"phase": ph}); n != 0 {
			t.Errorf("refused observations recorded %d into phase %s", n, ph)
		}
	}
	if n := histCount(wf, "cb_worker_recompute_ratio", nil); n != 0 {
		t.Errorf("refused ratios recorded %d", n)
	}
	bm.AddChunksEvicted(Tier(3), 1)
	if err := rf.one(t, "forged tier"); !errors.As(err, &le) || le.Label != "tier" || le.Value != "Tier(3)" {
		t.Errorf("forged tier: %v", err)
	}
	bm.AddChunksEvicted(TierL2, -1)
	if err := rf.one(t, "negative eviction"); !errors.Is(err, ErrNegative) {
		t.Errorf("negative eviction: %v", err)
	}
	for name, f := range map[string]func(){
		"RecordLookup":                func() { bm.RecordLookup(t.Context(), LookupRecord{StaleChunks: -1}) },
		"ObserveFingerprintMatch":     func() { bm.ObserveFingerprintMatch(t.Context(), -1) },
		"ObserveSparsePrefetch":       func() { bm.ObserveSparsePrefetch(t.Context(), -1) },
		"RecordL2Load":                func() { bm.RecordL2Load(-1, time.Millisecond) },
		"AddL2CorruptChunks":          func() { bm.AddL2CorruptChunks(-1) },
		"RecordRetrieve":              func() { bm.RecordRetrieve(t.Context(), -1, true) },
		"RecordScatter":               func() { bm.RecordScatter(t.Context(), time.Millisecond, -1) },
		"RecordStore":                 func() { bm.RecordStore(-1) },
		"AddFingerprintsUnregistered": func() { bm.AddFingerprintsUnregistered(-1) },
		"SetStorage":                  func() { bm.SetStorage(StorageStats{L1Bytes: -1}) },
	} {
		f()
		if err := rf.one(t, name); !errors.Is(err, ErrNegative) {
			t.Errorf("%s: %v, want ErrNegative", name, err)
		}
	}
	bf := gather(t, breg)
	for _, name := range []string{"lmcache_blend_lookup_requests_total", "lmcache_blend_retrieve_requests_total",
		"lmcache_blend_retrieve_failures_total", "lmcache_blend_store_requests_total", "lmcache_blend_l2_read_bytes_total",
		"lmcache_blend_l2_corrupt_chunks_total", "lmcache_blend_fingerprints_unregistered_total", "lmcache_blend_l1_bytes"} {
		if v := value(bf, name, nil); v != 0 {
			t.Errorf("%s = %v after refused records only", name, v)
		}
	}
	if st := bm.Registry().RecordStats(); st.Refused != 13 {
		t.Errorf("blend Refused = %d, want 13", st.Refused)
	}
}

// TestEnumsMatchTheContract: every typed label's constants spell the contract's allowed
// values, in order; String names a value that is not a constant.
func TestEnumsMatchTheContract(t *testing.T) {
	set, err := contract.Instruments()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		metric, label string
		names         []string
	}{
		{"cb_worker_forward_duration_seconds", "phase", forwardPhaseNames[:]},
		{"cb_kv_transfer_bytes_total", "direction", kvDirectionNames[:]},
		{"cb_kv_transfer_tokens_total", "direction", kvDirectionNames[:]},
		{"cb_worker_blend_failures_total", "op", blendOpNames[:]},
		{"lmcache_blend_chunks_evicted_total", "tier", tierNames[:]},
		{"cb_engine_lookup_fallbacks_total", "reason", fallbackReasons[:]},
		{"cb_kv_handoff_bytes_total", "direction", handoffDirectionNames[:]},
		{"cb_worker_kv_handoffs", "state", handoffStateNames[:]},
	} {
		in, ok := set.Lookup(tc.metric)
		if !ok {
			t.Fatalf("%s not in the contract", tc.metric)
		}
		l, ok := in.Label(tc.label)
		if !ok || len(in.Labels) != 1 {
			t.Fatalf("%s: want exactly the label %s", tc.metric, tc.label)
		}
		if !slices.Equal(l.Allowed, tc.names) {
			t.Errorf("%s{%s}: contract %q, constants %q", tc.metric, tc.label, l.Allowed, tc.names)
		}
	}
	for got, want := range map[string]string{
		PhasePrefill.String(): "prefill", PhaseFullRecomp.String(): "full_recomp", PhaseCheck.String(): "check",
		PhasePartial.String(): "partial", PhaseDecode.String(): "decode", ForwardPhase(5).String(): "ForwardPhase(5)",
		KVLoad.String(): "load", KVStore.String(): "store", KVDirection(200).String(): "KVDirection(200)",
		BlendOpRegister.String(): "register", BlendOpRetrieve.String(): "retrieve", BlendOpStore.String(): "store",
		BlendOp(3).String(): "BlendOp(3)", TierL1.String(): "l1", TierL2.String(): "l2", Tier(2).String(): "Tier(2)",
		HandoffSent.String(): "sent", HandoffReceived.String(): "received", HandoffDirection(2).String(): "HandoffDirection(2)",
		HandoffKept.String(): "kept", HandoffPulling.String(): "pulling", HandoffState(2).String(): "HandoffState(2)",
	} {
		if got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

// TestConstructorsResolveFixedSeries: a contract lacking one of the values a facade resolves
// up front fails the constructor (a startup error), not a later record.
func TestConstructorsResolveFixedSeries(t *testing.T) {
	for _, tc := range []struct {
		name, from, to string
		build          func(*contract.InstrumentSet) error
	}{
		{"worker phase", "allowed: [prefill, full_recomp, check, partial, decode]", "allowed: [prefill, full_recomp, check, partial]",
			func(set *contract.InstrumentSet) error {
				_, err := NewWorkerMetrics(prometheus.NewRegistry(), WithContract(set))
				return err
			}},
		{"worker op", "allowed: [register, retrieve, store]", "allowed: [register, retrieve]",
			func(set *contract.InstrumentSet) error {
				_, err := NewWorkerMetrics(prometheus.NewRegistry(), WithContract(set))
				return err
			}},
		{"worker direction", "allowed: [load, store]", "allowed: [load, unload]",
			func(set *contract.InstrumentSet) error {
				_, err := NewWorkerMetrics(prometheus.NewRegistry(), WithContract(set))
				return err
			}},
		{"engine reason", "allowed: [error, timeout, unavailable, queue_full]", "allowed: [error, timeout, unavailable]",
			func(set *contract.InstrumentSet) error {
				_, err := NewEngineMetrics(prometheus.NewRegistry(), WithContract(set))
				return err
			}},
		{"blend tier", "allowed: [l1, l2]", "allowed: [l1, l3]",
			func(set *contract.InstrumentSet) error {
				_, err := NewBlendMetrics(prometheus.NewRegistry(), WithContract(set))
				return err
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := string(contract.InstrumentsYAML())
			if !strings.Contains(doc, tc.from) {
				t.Fatalf("contract has no %q", tc.from)
			}
			set := mustContract(t, strings.Replace(doc, tc.from, tc.to, 1))
			var le *LabelError
			if err := tc.build(set); !errors.As(err, &le) || le.Reason != ReasonNotAllowed {
				t.Errorf("constructor on a contract without a resolved value: %v, want a *LabelError", err)
			}
		})
	}
}

// TestOnRefusedRunsWithoutLocks: the handler runs after the facade released its locks, so it
// may record into the same facade, even through the method that refused (this would deadlock
// otherwise).
func TestOnRefusedRunsWithoutLocks(t *testing.T) {
	var (
		e                      *EngineMetrics
		b                      *BlendMetrics
		p                      *ProcessMetrics
		eCalls, bCalls, pCalls int
		err                    error
	)
	e, err = NewEngineMetrics(prometheus.NewRegistry(), WithOnRefused(func(error) {
		if eCalls++; eCalls == 1 {
			e.SetEngine(EngineStats{Evictions: 1})
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	b, err = NewBlendMetrics(prometheus.NewRegistry(), WithOnRefused(func(error) {
		if bCalls++; bCalls == 1 {
			b.SetEventBusTotals(30, 30)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	p, err = NewProcessMetrics(prometheus.NewRegistry(), BuildInfo{Service: "cb-engine"}, nil, WithOnRefused(func(error) {
		if pCalls++; pCalls == 1 {
			p.SetTraceTotals(TraceTotals{SpansDropped: 30, ExportErrors: 30})
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	e.SetEngine(EngineStats{KVTotal: 1})
	b.SetEventBusTotals(20, 20)
	b.SetEventBusTotals(5, 5)
	p.SetTraceTotals(TraceTotals{SpansDropped: 20, ExportErrors: 20})
	p.SetTraceTotals(TraceTotals{SpansDropped: 5, ExportErrors: 5})
	if eCalls != 1 || bCalls != 1 || pCalls != 1 {
		t.Errorf("handler calls: engine %d, blend %d, process %d; want 1 each", eCalls, bCalls, pCalls)
	}
}

// TestFreshFacadesStartAtZero: before any event, every instrument without a capped label is
// served, at zero; cb_build_info is 1.
func TestFreshFacadesStartAtZero(t *testing.T) {
	set, err := contract.Instruments()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if _, err := NewEngineMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewWorkerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewBlendMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStorageMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFleetTrust(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewHandoffSecurityMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewProcessMetrics(reg, BuildInfo{Service: "cb-blend", Version: "v1"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := NewGatewayMetrics(reg); err != nil {
		t.Fatal(err)
	}
	fams := parseText(t, func() string { b, _ := scrape(t, reg, acceptText); return b }())
	for _, in := range set.Instruments {
		capped := false
		for _, l := range in.Labels {
			capped = capped || l.Capped
		}
		mf := fams[in.Name]
		if in.Name == "cb_build_info" {
			if v := value(fams, in.Name, map[string]string{"service": "cb-blend", "version": "v1"}); v != 1 {
				t.Errorf("cb_build_info = %v", v)
			}
			continue
		}
		if capped {
			if mf != nil {
				t.Errorf("%s: series before any event: %v", in.Name, mf)
			}
			continue
		}
		want := 1
		for _, l := range in.Labels {
			want *= len(l.Allowed)
		}
		if mf == nil || len(mf.GetMetric()) != want {
			t.Errorf("%s: %d series before any event, want %d", in.Name, len(mf.GetMetric()), want)
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetCounter().GetValue() != 0 || m.GetGauge().GetValue() != 0 || m.GetHistogram().GetSampleCount() != 0 {
				t.Errorf("%s %v: not zero", in.Name, labelsOf(m))
			}
		}
	}
}

// FuzzModelLabel: any model name is recorded, as its own series or as "_other" (beyond the cap
// or not valid UTF-8), never refused, and survives both expositions; the scrape never breaks.
func FuzzModelLabel(f *testing.F) {
	for _, s := range []string{"llama-3-8b", "", "a\"b", "x\\y\nz", "\xff\xfe", "_other", "日本語", "{}=,\t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, model string) {
		reg := prometheus.NewRegistry()
		e, err := NewEngineMetrics(reg, WithLabelCap(1))
		if err != nil {
			t.Fatal(err)
		}
		e.RecordRequest(context.Background(), RequestRecord{Operation: "chat", Model: "m1", E2E: 1}) // fill the cap
		e.RecordRequest(context.Background(), RequestRecord{Operation: "chat", Model: model, HasTTFT: true, TTFT: 1e6, E2E: 2e6, OutputTokens: 2})
		if st := e.Registry().RecordStats(); st.Refused != 0 {
			t.Fatalf("model %q refused: %+v", model, st)
		}
		want := model
		if model != "m1" { // beyond the cap, or not valid UTF-8
			want = OtherValue
		}
		lbl := map[string]string{"gen_ai_operation_name": "chat", "gen_ai_request_model": want}
		text, _ := scrape(t, reg, acceptText)
		if got := histCount(parseText(t, text), NameTTFT, lbl); got != 1 {
			t.Fatalf("text: TTFT count %d for %q (recorded as %q)", got, model, want)
		}
		om, _ := scrape(t, reg, acceptOpenMetrics)
		if got := histCount(parseOpenMetrics(t, omFamily(om, NameTTFT)), NameTTFT, lbl); got != 1 {
			t.Fatalf("OpenMetrics: TTFT count %d for %q", got, model)
		}
	})
}

// omFamily cuts one family's block out of an OpenMetrics exposition (the expfmt OpenMetrics
// parser validates a full grammar and is slow on large bodies).
func omFamily(body, name string) string {
	var out []string
	in := false
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "# HELP ") {
			in = strings.HasPrefix(l, "# HELP "+name+" ")
		}
		if in && l != "" && l != "# EOF" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n") + "\n# EOF\n"
}

// TestOpenMetricsParses: every facade's OpenMetrics exposition parses with expfmt and carries
// every contract family with its unit.
func TestOpenMetricsParses(t *testing.T) {
	set, err := contract.Instruments()
	if err != nil {
		t.Fatal(err)
	}
	for owner, reg := range allFacades(t) {
		body, _ := scrape(t, reg, acceptOpenMetrics)
		fams := parseOpenMetrics(t, body)
		for _, in := range set.Owned(owner) {
			mf, ok := fams[strings.TrimSuffix(in.Name, "_total")]
			if !ok {
				mf, ok = fams[in.Name]
			}
			if !ok {
				t.Errorf("%s: %s missing from OpenMetrics", owner, in.Name)
				continue
			}
			if mf.GetUnit() != in.PromUnit() {
				t.Errorf("%s: UNIT %q, contract %q", in.Name, mf.GetUnit(), in.PromUnit())
			}
		}
	}
}

// TestTenThousandModelsStayCapped records requests for 10,000 distinct
// model names, some with quotes, backslashes and newlines: every engine
// instrument keeps at most 64 + 1 (_other) model series, and the text
// exposition still parses.
func TestTenThousandModelsStayCapped(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewEngineMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10000 {
		model := fmt.Sprintf("model-%d", i)
		switch i % 1000 {
		case 1:
			model = fmt.Sprintf("quote\"d-%d", i)
		case 2:
			model = fmt.Sprintf("back\\slash-%d", i)
		case 3:
			model = fmt.Sprintf("new\nline-%d", i)
		}
		m.RecordRequest(context.Background(), RequestRecord{Operation: "chat", Model: model,
			TTFT: 10 * time.Millisecond, HasTTFT: true, E2E: 50 * time.Millisecond, OutputTokens: 3, PromptTokens: 5})
	}
	fams := gather(t, reg)
	checked := 0
	for name, f := range fams {
		models := map[string]bool{}
		for _, mt := range f.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "gen_ai_request_model" {
					models[lp.GetValue()] = true
				}
			}
		}
		if len(models) == 0 {
			continue
		}
		checked++
		if len(models) > 65 || !models["_other"] {
			t.Errorf("%s: %d model series (want at most 64 + _other)", name, len(models))
		}
	}
	if checked < 3 {
		t.Fatalf("only %d instruments carry the model label", checked)
	}
	// The text exposition parses back.
	rec := httptest.NewRecorder()
	Handler(reg, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	p := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := p.TextToMetricFamilies(strings.NewReader(rec.Body.String())); err != nil {
		t.Fatalf("exposition does not parse: %v", err)
	}
}
