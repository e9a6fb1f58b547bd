package tracestore

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

// TestReceiverLimitsFollowTheStore: the body limit never exceeds the store's byte budget,
// and the in-flight limit is at least two bodies of the largest size.
func TestReceiverLimitsFollowTheStore(t *testing.T) {
	tests := []struct {
		name                   string
		storeBytes             int64
		cfg                    ReceiverConfig
		wantBody, wantInFlight int64
	}{
		{"defaults", 0, ReceiverConfig{}, DefaultMaxBodyBytes, 4 * DefaultMaxBodyBytes},
		{"body capped at a small budget", 1 << 20, ReceiverConfig{}, 1 << 20, 4 << 20},
		{"explicit, within the budget", 0, ReceiverConfig{MaxBodyBytes: 1 << 20, MaxInFlightBytes: 3 << 20}, 1 << 20, 3 << 20},
		{"in-flight raised to two bodies", 0, ReceiverConfig{MaxBodyBytes: 1 << 20, MaxInFlightBytes: 1}, 1 << 20, 2 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReceiver(NewStore(StoreConfig{MaxBytes: tc.storeBytes}), tc.cfg)
			if body, inFlight := r.Limits(); body != tc.wantBody || inFlight != tc.wantInFlight {
				t.Fatalf("limits = %d, %d; want %d, %d", body, inFlight, tc.wantBody, tc.wantInFlight)
			}
		})
	}
	r := NewReceiver(NewStore(StoreConfig{MaxBytes: 1 << 20}), ReceiverConfig{})
	if rec := do(r, post{contentType: ContentTypeProtobuf, body: make([]byte, 1<<20+1)}); rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over the store's budget: status %d, want 413", rec.Code)
	}
}

// TestReceiverInFlightLimit: while other requests hold the in-flight bytes, a request gets
// 429 with Retry-After (retryable for OTLP exporters), is counted, and holds nothing after.
func TestReceiverInFlightLimit(t *testing.T) {
	td := tracetest.Request{RequestID: "busy"}.Traces()
	pb := protoBody(t, td)
	gz := gzipped(t, pb)
	tests := []struct {
		name string
		p    post
		free int64 // in-flight bytes left for the request
		want int
	}{
		{"known length, room", post{contentType: ContentTypeProtobuf, body: pb}, int64(len(pb)), 200},
		{"known length, no room", post{contentType: ContentTypeProtobuf, body: pb}, int64(len(pb)) - 1, 429},
		{"chunked, no room", post{contentType: ContentTypeProtobuf, body: pb, chunked: true}, int64(len(pb)) / 2, 429},
		{"gzip, room for the body, not for what it inflates to", post{contentType: ContentTypeProtobuf, encoding: "gzip", body: gz}, int64(len(gz)) + 10, 429},
		{"gzip, room for both", post{contentType: ContentTypeProtobuf, encoding: "gzip", body: gz}, int64(len(gz) + len(pb) + 1), 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReceiver(NewStore(StoreConfig{}), ReceiverConfig{MaxBodyBytes: 1 << 20})
			others := r.maxInFlight - tc.free
			r.inFlight.Store(others) // held by other requests
			rec := do(r, tc.p)
			if rec.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.want, rec.Body.String())
			}
			if got := r.inFlight.Load(); got != others {
				t.Fatalf("in flight after the request = %d, want %d (released)", got, others)
			}
			if tc.want == 429 {
				if rec.Header().Get("Retry-After") == "" || r.Stats().TooManyRequests != 1 {
					t.Fatalf("429 without Retry-After or count: %v %+v", rec.Header(), r.Stats())
				}
				if r.store.Stats().Spans != 0 {
					t.Fatal("a refused request stored spans")
				}
			}
		})
	}
}

// TestStatsAPIExposesBudget: /api/stats carries the byte budget and the eviction and drop
// counters next to the existing ones.
func TestStatsAPIExposesBudget(t *testing.T) {
	s := NewStore(StoreConfig{MaxTraces: 1, MaxBytes: 1 << 20})
	s.Add(tracetest.Request{RequestID: "a"}.Traces())
	s.Add(tracetest.Request{RequestID: "b"}.Traces())
	rec := httptest.NewRecorder()
	NewQueryHandler(s, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/stats", nil))
	var env struct {
		Data struct {
			Store map[string]float64 `json:"store"`
		} `json:"data"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil {
		t.Fatal(err)
	}
	st := env.Data.Store
	for _, k := range []string{"bytes", "maxBytes", "evictedTraces", "evictedSpans", "evictedBytes", "rejectedBytes",
		"truncatedTraces", "droppedAttributes", "droppedEvents", "droppedLinks", "truncatedValues"} {
		if _, ok := st[k]; !ok {
			t.Fatalf("/api/stats store lacks %q: %v", k, st)
		}
	}
	if st["maxBytes"] != 1<<20 || st["bytes"] <= 0 || st["evictedBytes"] <= 0 || st["evictedTraces"] != 1 {
		t.Fatalf("store stats = %v", st)
	}
}
