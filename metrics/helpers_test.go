package metrics

import (
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const (
	acceptText        = "text/plain; version=0.0.4"
	acceptOpenMetrics = "application/openmetrics-text; version=1.0.0"
)

// mustContract parses a test contract.
func mustContract(t testing.TB, doc string) *contract.InstrumentSet {
	t.Helper()
	set, err := contract.ParseInstruments([]byte(doc))
	if err != nil {
		t.Fatalf("test contract: %v", err)
	}
	return set
}

// scrape serves one GET /metrics through Handler and returns body and content type.
func scrape(t testing.TB, g prometheus.Gatherer, accept string) (string, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	Handler(g, nil).ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d: %s", rec.Code, rec.Body.String())
	}
	return rec.Body.String(), rec.Header().Get("Content-Type")
}

// parseText parses a text 0.0.4 exposition.
func parseText(t testing.TB, body string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse text exposition: %v\n%s", err, body)
	}
	return fams
}

// parseOpenMetrics parses an OpenMetrics 1.0 exposition.
func parseOpenMetrics(t testing.TB, body string) map[string]*dto.MetricFamily {
	t.Helper()
	dec := expfmt.NewDecoder(strings.NewReader(body), expfmt.FmtOpenMetrics_1_0_0)
	fams := map[string]*dto.MetricFamily{}
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); err != nil {
			if errors.Is(err, io.EOF) {
				return fams
			}
			t.Fatalf("parse OpenMetrics exposition: %v\n%s", err, body)
		}
		fams[mf.GetName()] = &mf
	}
}

// gather returns the registry's families by name.
func gather(t testing.TB, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// labelsOf returns a metric's labels as a map.
func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// find returns the metric of family name whose labels equal want (nil if absent).
func find(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	mf := fams[name]
	if mf == nil {
		return nil
	}
	for _, m := range mf.GetMetric() {
		got := labelsOf(m)
		if len(got) != len(want) {
			continue
		}
		ok := true
		for k, v := range want {
			if got[k] != v {
				ok = false
			}
		}
		if ok {
			return m
		}
	}
	return nil
}

// value returns a counter's or gauge's value, NaN when absent.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	m := find(fams, name, labels)
	switch {
	case m == nil:
		return math.NaN()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return math.NaN()
}

// histCount returns a histogram series' count (0 when the series is absent).
func histCount(fams map[string]*dto.MetricFamily, name string, labels map[string]string) uint64 {
	m := find(fams, name, labels)
	if m == nil || m.Histogram == nil {
		return 0
	}
	return m.Histogram.GetSampleCount()
}

// cumulative returns the cumulative count of the bucket with upper bound le.
func cumulative(t testing.TB, m *dto.Metric, le float64) uint64 {
	t.Helper()
	for _, b := range m.GetHistogram().GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount()
		}
	}
	t.Fatalf("no bucket le=%v", le)
	return 0
}

// finiteBounds splits a parsed histogram's buckets into finite bounds and the +Inf count.
func finiteBounds(h *dto.Histogram) (bounds []float64, counts []uint64, inf uint64, hasInf bool) {
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), +1) {
			inf, hasInf = b.GetCumulativeCount(), true
			continue
		}
		bounds = append(bounds, b.GetUpperBound())
		counts = append(counts, b.GetCumulativeCount())
	}
	return bounds, counts, inf, hasInf
}

func labelKeys(m *dto.Metric) []string {
	var keys []string
	for _, l := range m.GetLabel() {
		if l.GetName() != "le" {
			keys = append(keys, l.GetName())
		}
	}
	sort.Strings(keys)
	return keys
}

// refusals collects what a registry refuses, through WithOnRefused.
type refusals struct {
	mu   sync.Mutex
	errs []error
}

// opt returns the option that reports refusals to r.
func (r *refusals) opt() Option { return WithOnRefused(r.add) }

func (r *refusals) add(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

// take returns the refusals since the last take.
func (r *refusals) take() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := r.errs
	r.errs = nil
	return errs
}

// one returns the single refusal since the last take; it fails the test when there was not
// exactly one.
func (r *refusals) one(t testing.TB, what string) error {
	t.Helper()
	errs := r.take()
	if len(errs) != 1 {
		t.Errorf("%s: %d refusals %v, want 1", what, len(errs), errs)
		return nil
	}
	return errs[0]
}

// none fails the test when anything was refused since the last take.
func (r *refusals) none(t testing.TB, what string) {
	t.Helper()
	if errs := r.take(); len(errs) != 0 {
		t.Errorf("%s: refused %v", what, errs)
	}
}
