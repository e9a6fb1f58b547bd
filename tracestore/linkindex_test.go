package tracestore

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

// tagOf returns the tag key of ls as text, "" when absent.
func tagOf(ls LinkedSpan, key string) string {
	for _, kv := range ls.Tags {
		if kv.Key == key {
			return kv.AsString()
		}
	}
	return ""
}

// TestLinkedFrom: a quality check (cb.quality, the root of its own trace, linked to the
// request's cb.model_forward) is found from the request's trace id, whichever arrives
// first, once however often it is re-sent, and not from its own trace.
func TestLinkedFrom(t *testing.T) {
	reqTrace := traceIDOf("req-a")
	tests := []struct {
		name         string
		qualityFirst bool
		resends      int
	}{
		{name: "request trace, then its check"},
		{name: "check before the request trace", qualityFirst: true},
		{name: "check re-sent by the exporter", resends: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(StoreConfig{})
			q := tracetest.Quality{RequestID: "req-a", FirstKL: 0.0031, MeanKL: 0.002, Top1: 0.75, GreedyMatch: 2, Positions: 4}
			if tc.qualityFirst {
				s.Add(q.Traces())
			}
			s.Add(tracetest.Request{RequestID: "req-a"}.Traces())
			s.Add(tracetest.Request{RequestID: "req-b"}.Traces())
			if !tc.qualityFirst {
				s.Add(q.Traces())
			}
			for range tc.resends {
				s.Add(q.Traces())
			}
			got, total, ok := s.LinkedFrom(reqTrace, 0)
			if !ok || total != 1 || len(got) != 1 {
				t.Fatalf("LinkedFrom = %+v, %d, %v; want the one check", got, total, ok)
			}
			ls := got[0]
			if ls.Name != spanname.CBQuality || ls.Service != tracetest.Worker || ls.TraceID != tracetest.QualityTraceID("req-a").String() ||
				len(ls.LinkedSpanIDs) != 1 || ls.LinkedSpanIDs[0] != spanIDOf("req-a", spanname.CBModelForward) {
				t.Fatalf("linked span = %+v", ls)
			}
			for key, want := range map[string]string{"first_kl": "0.0031", "top1": "0.75", "greedy_match": "2", "positions": "4", "request_id": "req-a"} {
				if g := tagOf(ls, key); g != want {
					t.Errorf("tag %s = %q, want %q", key, g, want)
				}
			}
			for _, other := range []string{traceIDOf("req-b"), tracetest.QualityTraceID("req-a").String()} {
				if got, total, ok := s.LinkedFrom(other, 0); !ok || total != 0 || len(got) != 0 {
					t.Errorf("LinkedFrom(%s) = %+v, %d, %v; want none", other, got, total, ok)
				}
			}
			if _, _, ok := s.LinkedFrom("not-hex", 0); ok {
				t.Error("LinkedFrom accepted a malformed id")
			}
			if n := s.links.entries(); n != 1 {
				t.Errorf("link index holds %d entries, want 1", n)
			}
		})
	}
}

// TestLinkedFromLimitAndOrder: several checks of one request come oldest first, capped by
// the limit, with the total.
func TestLinkedFromLimitAndOrder(t *testing.T) {
	s := NewStore(StoreConfig{})
	s.Add(tracetest.Request{RequestID: "r"}.Traces())
	for i := range 5 {
		// Each a distinct trace: the request id is what differs in the check's trace id.
		td := tracetest.Quality{RequestID: "r", Start: t0.Add(time.Duration(5-i) * time.Second)}.Traces()
		sp := td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0)
		sp.SetTraceID(tracetest.TraceID(fmt.Sprint("check-", i)))
		s.Add(td)
	}
	got, total, _ := s.LinkedFrom(traceIDOf("r"), 3)
	if total != 5 || len(got) != 3 {
		t.Fatalf("LinkedFrom(limit 3) = %d spans of %d", len(got), total)
	}
	for i := 1; i < len(got); i++ {
		if got[i].StartUnixMicro < got[i-1].StartUnixMicro {
			t.Fatalf("not oldest first: %+v", got)
		}
	}
	if got[0].TraceID != tracetest.TraceID("check-4").String() {
		t.Fatalf("oldest = %s, want check-4's trace", got[0].TraceID)
	}
}

// TestLinkIndexBoundedByEviction: the index holds one entry per stored link; evicting
// the linking traces (MaxTraces, MaxBytes) removes their entries, so it never grows past
// what the store holds.
func TestLinkIndexBoundedByEviction(t *testing.T) {
	tests := []struct {
		name string
		cfg  StoreConfig
	}{
		{name: "MaxTraces 8", cfg: StoreConfig{MaxTraces: 8}},
		{name: "MaxBytes 256 KiB", cfg: StoreConfig{MaxBytes: 256 << 10}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(tc.cfg)
			for i := range 300 {
				id := fmt.Sprint("req-", i)
				s.Add(tracetest.Request{RequestID: id, Start: t0.Add(time.Duration(i) * time.Second)}.Traces())
				s.Add(tracetest.Quality{RequestID: id, Start: t0.Add(time.Duration(i)*time.Second + 500*time.Millisecond)}.Traces())
				s.mu.RLock()
				stored := 0
				for _, rec := range s.traces {
					if len(rec.spans) == 1 && rec.spans[0].name == spanname.CBQuality {
						stored++
					}
				}
				n := s.links.entries()
				s.mu.RUnlock()
				if n != stored {
					t.Fatalf("after %d requests: link index holds %d entries, the store %d checks", i+1, n, stored)
				}
				if st := s.Stats(); st.Bytes > st.MaxBytes {
					t.Fatalf("store holds %d bytes, over its budget %d", st.Bytes, st.MaxBytes)
				}
			}
			if st := s.Stats(); st.EvictedTraces == 0 {
				t.Fatal("nothing evicted: the test did not exercise eviction")
			}
			if got, total, _ := s.LinkedFrom(traceIDOf("req-0"), 0); total != 0 || len(got) != 0 {
				t.Fatalf("the evicted check of req-0 is still found: %+v", got)
			}
			if _, total, _ := s.LinkedFrom(traceIDOf("req-299"), 0); total != 1 {
				t.Fatalf("the last check: %d found, want 1", total)
			}
		})
	}
}

// TestLinkedAPI: GET /api/traces/{id}/linked answers with the linking spans in Jaeger's
// envelope; an unknown trace has none (200), a malformed id or limit is a 400.
func TestLinkedAPI(t *testing.T) {
	store := NewStore(StoreConfig{})
	store.Add(tracetest.Request{RequestID: "req-a"}.Traces())
	store.Add(tracetest.Quality{RequestID: "req-a"}.Traces())
	srv := httptest.NewServer(NewQueryHandler(store, nil))
	defer srv.Close()
	c, err := jaeger.NewClient(srv.URL, jaeger.ClientConfig{HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tests := []struct {
		name       string
		path       string
		params     url.Values
		wantStatus int
		wantSpans  int
	}{
		{name: "request with a check", path: "/api/traces/" + traceIDOf("req-a") + "/linked", wantStatus: http.StatusOK, wantSpans: 1},
		{name: "limit", path: "/api/traces/" + traceIDOf("req-a") + "/linked", params: url.Values{"limit": {"1"}}, wantStatus: http.StatusOK, wantSpans: 1},
		{name: "unknown trace", path: "/api/traces/" + traceIDOf("nope") + "/linked", wantStatus: http.StatusOK},
		{name: "malformed id", path: "/api/traces/xyz/linked", wantStatus: http.StatusBadRequest},
		{name: "malformed limit", path: "/api/traces/" + traceIDOf("req-a") + "/linked", params: url.Values{"limit": {"-1"}}, wantStatus: http.StatusBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []LinkedSpan
			status, err := c.Get(ctx, tc.path, tc.params, &got)
			if status != tc.wantStatus {
				t.Fatalf("status %d (%v), want %d", status, err, tc.wantStatus)
			}
			if tc.wantStatus != http.StatusOK {
				if err == nil {
					t.Fatal("no error for a bad request")
				}
				return
			}
			if err != nil || len(got) != tc.wantSpans {
				t.Fatalf("got %+v, %v; want %d spans", got, err, tc.wantSpans)
			}
			if tc.wantSpans > 0 && (got[0].Name != spanname.CBQuality || tagOf(got[0], "first_kl") != "0.0031") {
				t.Fatalf("linked span = %+v", got[0])
			}
		})
	}
}
