package metrics

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

var benchValues = [8]float64{0.003, 0.03, 0.07, 0.2, 0.45, 0.9, 3, 12}

// BenchmarkObserve compares observing into an existing series through the contract registry
// (label lookup in the copy-on-write cache included) with a bare client_golang histogram and
// with client_golang's own WithLabelValues, in the same run.
func BenchmarkObserve(b *testing.B) {
	set, err := contract.Instruments()
	if err != nil {
		b.Fatal(err)
	}
	ttft, _ := set.Lookup(NameTTFT)
	b.Run("bare_client_golang_histogram", func(b *testing.B) {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bare_seconds", Buckets: ttft.Buckets})
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			h.Observe(benchValues[i&7])
			i++
		}
	})
	b.Run("client_golang_WithLabelValues", func(b *testing.B) {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vec_seconds", Buckets: ttft.Buckets},
			[]string{"gen_ai_operation_name", "gen_ai_request_model"})
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			h.WithLabelValues("chat", "llama-3-8b").Observe(benchValues[i&7])
			i++
		}
	})
	b.Run("contract_histogram_2_labels", func(b *testing.B) {
		r, err := NewRegistry(prometheus.NewRegistry(), set)
		if err != nil {
			b.Fatal(err)
		}
		h, _ := r.Histogram(NameTTFT)
		h.Observe(0.1, "chat", "llama-3-8b")
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			h.Observe(benchValues[i&7], "chat", "llama-3-8b")
			i++
		}
		if st := r.RecordStats(); st != (RecordStats{}) {
			b.Fatalf("RecordStats %+v", st)
		}
	})
	b.Run("contract_histogram_2_labels_64_models", func(b *testing.B) {
		r, err := NewRegistry(prometheus.NewRegistry(), set)
		if err != nil {
			b.Fatal(err)
		}
		h, _ := r.Histogram(NameTTFT)
		var models [64]string
		for i := range models {
			models[i] = fmt.Sprintf("model-%02d", i)
			h.Observe(0.1, "chat", models[i])
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			h.Observe(benchValues[i&7], "chat", models[i&63])
			i++
		}
		if st := r.RecordStats(); st != (RecordStats{}) {
			b.Fatalf("RecordStats %+v", st)
		}
	})
	b.Run("bare_client_golang_histogram_parallel", func(b *testing.B) {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bare_seconds", Buckets: ttft.Buckets})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				h.Observe(benchValues[i&7])
				i++
			}
		})
	})
	b.Run("contract_histogram_2_labels_parallel", func(b *testing.B) {
		r, err := NewRegistry(prometheus.NewRegistry(), set)
		if err != nil {
			b.Fatal(err)
		}
		h, _ := r.Histogram(NameTTFT)
		h.Observe(0.1, "chat", "llama-3-8b")
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				h.Observe(benchValues[i&7], "chat", "llama-3-8b")
				i++
			}
		})
		if st := r.RecordStats(); st != (RecordStats{}) {
			b.Fatalf("RecordStats %+v", st)
		}
	})
}

// BenchmarkRecordRequest: one whole request record (3 histograms, 2 counters), without and
// with a sampled span context (exemplars).
func BenchmarkRecordRequest(b *testing.B) {
	rec := RequestRecord{Operation: "chat", Model: "llama-3-8b", HasTTFT: true, TTFT: 120 * time.Millisecond,
		E2E: 2 * time.Second, PromptTokens: 1500, OutputTokens: 64}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled,
	}))
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{{"no_span", context.Background()}, {"sampled_span_exemplars", sampled}} {
		b.Run(tc.name, func(b *testing.B) {
			e, err := NewEngineMetrics(prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			e.RecordRequest(tc.ctx, rec)
			b.ReportAllocs()
			for b.Loop() {
				e.RecordRequest(tc.ctx, rec)
			}
			if st := e.Registry().RecordStats(); st != (RecordStats{}) {
				b.Fatalf("RecordStats %+v", st)
			}
		})
	}
}

// BenchmarkRender renders /metrics of a process holding every contract instrument, with 64
// models on every model-labelled instrument (both operations, success and one error type) and
// 64 routes on the HTTP histogram.
func BenchmarkRender(b *testing.B) {
	reg := prometheus.NewRegistry()
	e, err := NewEngineMetrics(reg)
	if err != nil {
		b.Fatal(err)
	}
	w, err := NewWorkerMetrics(reg)
	if err != nil {
		b.Fatal(err)
	}
	bl, err := NewBlendMetrics(reg)
	if err != nil {
		b.Fatal(err)
	}
	p, err := NewProcessMetrics(reg, BuildInfo{Service: "cb-engine", Version: "v1"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	exercise(b, e, w, bl, p)
	for i := range 64 {
		model := fmt.Sprintf("model-%02d", i)
		for _, op := range []string{"chat", "text_completion"} {
			for _, errType := range []string{"", "timeout"} {
				rec := RequestRecord{Operation: op, Model: model, HasTTFT: true, TTFT: time.Duration(i+1) * 7 * time.Millisecond,
					E2E: time.Duration(i+1) * 90 * time.Millisecond, PromptTokens: 100, OutputTokens: 10, ErrorType: errType}
				e.RecordRequest(context.Background(), rec)
			}
		}
		e.RecordHTTP("POST", fmt.Sprintf("/v1/route-%02d", i), 200, 0.01*float64(i))
	}
	for _, tc := range []struct{ name, accept string }{{"text_0.0.4", acceptText}, {"openmetrics", acceptOpenMetrics}} {
		b.Run(tc.name, func(b *testing.B) {
			h := Handler(reg, nil)
			req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			req.Header.Set("Accept", tc.accept)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			b.SetBytes(int64(rec.Body.Len()))
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatal(rec.Code)
				}
			}
		})
	}
}

// BenchmarkObserveInterleaved measures the contract path against a bare client_golang
// histogram under identical conditions: both run alternately in chunks of 4096 observations,
// and the fastest chunk of each is reported (robust against a loaded machine), with their
// ratio. b.N counts chunk pairs.
func BenchmarkObserveInterleaved(b *testing.B) {
	set, err := contract.Instruments()
	if err != nil {
		b.Fatal(err)
	}
	ttft, _ := set.Lookup(NameTTFT)
	bare := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bare_seconds", Buckets: ttft.Buckets})
	r, err := NewRegistry(prometheus.NewRegistry(), set)
	if err != nil {
		b.Fatal(err)
	}
	h, _ := r.Histogram(NameTTFT)
	var models [64]string
	for i := range models {
		models[i] = fmt.Sprintf("model-%02d", i)
		h.Observe(0.1, "chat", models[i])
	}
	bound, err := h.Series("chat", models[0])
	if err != nil {
		b.Fatal(err)
	}
	e, err := NewEngineMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	rec := RequestRecord{Operation: "chat", Model: models[0], HasTTFT: true, TTFT: 120 * time.Millisecond,
		E2E: 2 * time.Second, PromptTokens: 1500, OutputTokens: 64}
	bareTPOT := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bare_tpot_seconds", Buckets: ttft.Buckets})
	bareDur := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bare_dur_seconds", Buckets: ttft.Buckets})
	barePrompt := prometheus.NewCounter(prometheus.CounterOpts{Name: "bare_prompt_total"})
	bareGen := prometheus.NewCounter(prometheus.CounterOpts{Name: "bare_gen_total"})
	ctx := context.Background()
	const chunk = 4096
	type path struct {
		name string
		run  func()
		best time.Duration
	}
	paths := []*path{
		{name: "bare", run: func() {
			for i := range chunk {
				bare.Observe(benchValues[i&7])
			}
		}},
		{name: "bound_series", run: func() {
			for i := range chunk {
				bound.Observe(benchValues[i&7])
			}
		}},
		{name: "lookup_1_model", run: func() {
			for i := range chunk {
				h.Observe(benchValues[i&7], "chat", models[0])
			}
		}},
		{name: "lookup_64_models", run: func() {
			for i := range chunk {
				h.Observe(benchValues[i&7], "chat", models[i&63])
			}
		}},
		// What RecordRequest records (3 observations, 2 counter adds) on bare client_golang.
		{name: "bare_request_equivalent", run: func() {
			for range chunk {
				bareDur.Observe(rec.E2E.Seconds())
				bare.Observe(rec.TTFT.Seconds())
				bareTPOT.Observe(((rec.E2E - rec.TTFT) / time.Duration(rec.OutputTokens-1)).Seconds())
				barePrompt.Add(float64(rec.PromptTokens))
				bareGen.Add(float64(rec.OutputTokens))
			}
		}},
		{name: "record_request", run: func() {
			for range chunk {
				e.RecordRequest(ctx, rec)
			}
		}},
	}
	for _, p := range paths {
		p.best = time.Hour
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, p := range paths {
			start := time.Now()
			p.run()
			if d := time.Since(start); d < p.best {
				p.best = d
			}
		}
	}
	ns := func(i int) float64 { return float64(paths[i].best.Nanoseconds()) / chunk }
	for i, p := range paths {
		b.ReportMetric(ns(i), p.name+"-ns/op")
	}
	for i := 1; i <= 3; i++ {
		b.ReportMetric(ns(i)/ns(0), paths[i].name+"-x-bare")
	}
	b.ReportMetric(ns(5)/ns(4), "record_request-x-bare_equivalent")
}
