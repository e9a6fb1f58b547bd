package tracestore

import (
	"testing"

	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

// TestSummaryLookupStatistics: the request index carries cb.request's lookup outcome and
// the lookup statistics, for a request with a lookup and for one served without.
func TestSummaryLookupStatistics(t *testing.T) {
	s := NewStore(StoreConfig{})
	s.Add(tracetest.Request{RequestID: "reuse"}.Traces())
	s.Add(tracetest.Request{RequestID: "baseline", Lookup: "skipped"}.Traces())
	rows, total := s.Requests(10, 0)
	if total != 2 {
		t.Fatalf("%d requests", total)
	}
	by := map[string]RequestSummary{}
	for _, r := range rows {
		by[r.RequestID] = r
	}
	v := func(p *int64) int64 {
		if p == nil {
			return -1
		}
		return *p
	}
	r := by["reuse"]
	if r.Lookup != "done" || v(r.HitTokens) != 768 || v(r.PrefixCoverageTokens) != 256 || v(r.NNonPrefixTokens) != 768 ||
		v(r.PrefixHitTokens) != 256 || v(r.NonPrefixHitTokens) != 512 || v(r.RequestedTokens) != 1024 {
		t.Fatalf("reuse summary %+v", r)
	}
	b := by["baseline"]
	if b.Lookup != "skipped" || v(b.HitTokens) != 0 || v(b.PrefixCoverageTokens) != 0 || v(b.NNonPrefixTokens) != 1024 ||
		b.HitRate == nil || *b.HitRate != 0 {
		t.Fatalf("baseline summary %+v", b)
	}
}
