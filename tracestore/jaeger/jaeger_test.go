package jaeger

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestQueryValuesRoundTrip(t *testing.T) {
	now := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
	q := Query{
		Service: "cb-engine", Operation: "chat m1", Tags: map[string]string{"request_id": "r1", "n": "3"},
		Start: now.Add(-time.Hour), End: now, MinDuration: 1500 * time.Microsecond, MaxDuration: 2 * time.Second, Limit: 7,
	}
	got, err := ParseQuery(q.Values(), now)
	if err != nil {
		t.Fatal(err)
	}
	got.Start, got.End = got.Start.UTC(), got.End.UTC()
	if !reflect.DeepEqual(got, q) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, q)
	}
	ids := Query{TraceIDs: []string{"abc", "00000000000000000000000000000def"}}
	if got, err := ParseQuery(ids.Values(), now); err != nil || !reflect.DeepEqual(got.TraceIDs, ids.TraceIDs) {
		t.Fatalf("trace ids: %+v, %v", got, err)
	}
}

func TestParseQuery(t *testing.T) {
	now := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		raw     string
		want    Query
		wantErr bool
	}{
		{raw: "", want: Query{}},
		{raw: "service=a&lookback=2h", want: Query{Service: "a", Start: now.Add(-2 * time.Hour)}},
		{raw: "lookback=2d&end=" + itoa(now.UnixMicro()), want: Query{Start: now.Add(-48 * time.Hour), End: now}},
		{raw: "lookback=custom", want: Query{}},
		{raw: `tags={"a":"x","n":5,"b":true}`, want: Query{Tags: map[string]string{"a": "x", "n": "5", "b": "true"}}},
		{raw: "tag=a:x&tag=b:y:z", want: Query{Tags: map[string]string{"a": "x", "b": "y:z"}}},
		{raw: "tags=[1]", wantErr: true},
		{raw: "tag=novalue", wantErr: true},
		{raw: "start=-5", wantErr: true},
		{raw: "end=soon", wantErr: true},
		{raw: "lookback=1y", wantErr: true},
		{raw: "minDuration=fast", wantErr: true},
		{raw: "maxDuration=-1s", wantErr: true},
		{raw: "limit=ten", wantErr: true},
		{raw: "traceID=xyz", wantErr: true},
		{raw: "traceID=" + strings.Repeat("a", 33), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.raw, func(t *testing.T) {
			v, err := url.ParseQuery(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseQuery(v, now)
			if tc.wantErr {
				if !errors.Is(err, ErrBadQuery) {
					t.Fatalf("err = %v, want ErrBadQuery", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !got.Start.IsZero() {
				got.Start = got.Start.UTC()
			}
			if !got.End.IsZero() {
				got.End = got.End.UTC()
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestNormalizeIDs(t *testing.T) {
	if got := NormalizeTraceID("ABC"); got != "00000000000000000000000000000abc" {
		t.Fatal(got)
	}
	if got := NormalizeSpanID("F"); got != "000000000000000f" {
		t.Fatal(got)
	}
	s := Span{TraceID: "abc", References: []Reference{{RefType: FollowsFrom, SpanID: "9"}, {RefType: ChildOf, TraceID: "0abc", SpanID: "7"}}}
	if s.ParentSpanID() != "7" {
		t.Fatalf("parent = %q", s.ParentSpanID())
	}
}

func TestClientErrors(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/api/services", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream down", http.StatusBadGateway)
	})
	mux.HandleFunc("/api/traces", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"data":null,"errors":[{"code":400,"msg":"parameter 'service' is required"}]}`))
	})
	mux.HandleFunc("/api/traces/{id}", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"data":null,"errors":[{"code":404,"msg":"trace not found"}]}`))
	})
	mux.HandleFunc("/prefix/api/services/{svc}/operations", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"data":["` + r.PathValue("svc") + `"]}`))
	})
	mux.HandleFunc("/big/api/services", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"data":["` + strings.Repeat("x", 2000) + `"]}`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()
	c, _ := NewClient(srv.URL, ClientConfig{HTTPClient: srv.Client()})
	if _, err := c.Services(ctx); err == nil || !strings.Contains(err.Error(), "upstream down") {
		t.Fatalf("502 text: %v", err)
	}
	if _, err := c.FindTraces(ctx, Query{}); err == nil || !strings.Contains(err.Error(), "service' is required") {
		t.Fatalf("error envelope: %v", err)
	}
	if _, err := c.Trace(ctx, "abc"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("404: %v", err)
	}
	pc, _ := NewClient(srv.URL+"/prefix/", ClientConfig{HTTPClient: srv.Client()})
	if ops, err := pc.Operations(ctx, "a b/c"); err != nil || len(ops) != 1 || ops[0] != "a b/c" {
		t.Fatalf("prefix + escaped service: %v %v", ops, err)
	}
	bc, _ := NewClient(srv.URL+"/big", ClientConfig{HTTPClient: srv.Client(), MaxResponseBytes: 1000})
	if _, err := bc.Services(ctx); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("size limit: %v", err)
	}
}

func TestDecodeTraces(t *testing.T) {
	one := `{"traceID":"1","spans":[{"traceID":"1","spanID":"2","tags":[{"key":"n","type":"int64","value":9007199254740993}]}],"processes":{}}`
	for name, in := range map[string]string{"envelope": `{"data":[` + one + `]}`, "array": `[` + one + `]`, "single": one} {
		ts, err := DecodeTraces([]byte(in))
		if err != nil || len(ts) != 1 || ts[0].Spans[0].Tags[0].AsString() != "9007199254740993" {
			t.Fatalf("%s: %+v %v", name, ts, err)
		}
	}
	for _, in := range []string{"", "{}", "[", `{"data": 5}`} {
		if _, err := DecodeTraces([]byte(in)); err == nil {
			t.Fatalf("DecodeTraces(%q) accepted", in)
		}
	}
}

// FuzzParseQuery: arbitrary query strings never panic, and accepted ones re-encode.
func FuzzParseQuery(f *testing.F) {
	f.Add(`service=a&tags={"k":"v"}&lookback=1h&limit=3`)
	f.Add("tag=a:b&start=1&end=2&minDuration=1ms")
	f.Add("traceID=abc&traceID=def")
	now := time.Unix(1_700_000_000, 0)
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		q, err := ParseQuery(v, now)
		if err != nil {
			return
		}
		if _, err := ParseQuery(q.Values(), now); err != nil {
			t.Fatalf("re-encoded query rejected: %v (%q)", err, q.Values().Encode())
		}
	})
}
