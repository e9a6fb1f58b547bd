package tracestore

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

func protoBody(t testing.TB, td ptrace.Traces) []byte {
	t.Helper()
	b, err := (&ptrace.ProtoMarshaler{}).MarshalTraces(td)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jsonBody(t testing.TB, td ptrace.Traces) []byte {
	t.Helper()
	b, err := (&ptrace.JSONMarshaler{}).MarshalTraces(td)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// gzipBomb compresses n zero bytes (about 1000:1).
func gzipBomb(t testing.TB, n int) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	chunk := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, len(chunk))
		if _, err := zw.Write(chunk[:k]); err != nil {
			t.Fatal(err)
		}
		n -= k
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type post struct {
	method, contentType, encoding string
	body                          []byte
	chunked                       bool // no Content-Length
}

func do(r *Receiver, p post) *httptest.ResponseRecorder {
	if p.method == "" {
		p.method = http.MethodPost
	}
	var body io.Reader = bytes.NewReader(p.body)
	if p.chunked {
		body = io.MultiReader(bytes.NewReader(p.body)) // hides the length from NewRequest
	}
	req := httptest.NewRequest(p.method, "/v1/traces", body)
	if p.contentType != "" {
		req.Header.Set("Content-Type", p.contentType)
	}
	if p.encoding != "" {
		req.Header.Set("Content-Encoding", p.encoding)
	}
	if p.chunked {
		req.ContentLength = -1
	}
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, req)
	return rec
}

func TestReceiver(t *testing.T) {
	td := tracetest.Request{RequestID: "r1"}.Traces()
	pb, js := protoBody(t, td), jsonBody(t, td)
	truncated := pb[:len(pb)/2]
	const limit = 64 << 10
	tests := []struct {
		name       string
		p          post
		wantStatus int
		wantSpans  int
	}{
		{"protobuf", post{contentType: ContentTypeProtobuf, body: pb}, 200, 22},
		{"json", post{contentType: ContentTypeJSON, body: js}, 200, 22},
		{"json with charset", post{contentType: "application/json; charset=utf-8", body: js}, 200, 22},
		{"gzip protobuf", post{contentType: ContentTypeProtobuf, encoding: "gzip", body: gzipped(t, pb)}, 200, 22},
		{"gzip json, chunked", post{contentType: ContentTypeJSON, encoding: "gzip", body: gzipped(t, js), chunked: true}, 200, 22},
		{"empty body is an empty export", post{contentType: ContentTypeProtobuf}, 200, 0},
		{"GET", post{method: http.MethodGet, contentType: ContentTypeProtobuf}, 405, 0},
		{"text/plain", post{contentType: "text/plain", body: js}, 415, 0},
		{"no content type", post{body: pb}, 415, 0},
		{"brotli", post{contentType: ContentTypeProtobuf, encoding: "br", body: pb}, 415, 0},
		{"garbage protobuf", post{contentType: ContentTypeProtobuf, body: []byte("\xff\xff\xff\xff garbage")}, 400, 0},
		{"truncated protobuf", post{contentType: ContentTypeProtobuf, body: truncated}, 400, 0},
		{"garbage json", post{contentType: ContentTypeJSON, body: []byte(`{"resourceSpans": [`)}, 400, 0},
		{"json that is protobuf", post{contentType: ContentTypeJSON, body: pb}, 400, 0},
		{"broken gzip", post{contentType: ContentTypeProtobuf, encoding: "gzip", body: []byte("\x1f\x8b\x08 not gzip")}, 400, 0},
		{"truncated gzip", post{contentType: ContentTypeProtobuf, encoding: "gzip", body: gzipped(t, pb)[:40]}, 400, 0},
		{"too large", post{contentType: ContentTypeProtobuf, body: make([]byte, limit+1)}, 413, 0},
		{"too large, chunked", post{contentType: ContentTypeProtobuf, body: make([]byte, limit+1), chunked: true}, 413, 0},
		{"gzip bomb", post{contentType: ContentTypeProtobuf, encoding: "gzip", body: gzipBomb(t, 8<<20)}, 413, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store := NewStore(StoreConfig{})
			r := NewReceiver(store, ReceiverConfig{MaxBodyBytes: limit})
			if tc.name == "gzip bomb" && len(tc.p.body) > limit {
				t.Fatalf("the bomb itself (%d bytes) must fit the limit to test decompression", len(tc.p.body))
			}
			rec := do(r, tc.p)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d; body %q", rec.Code, tc.wantStatus, rec.Body.String())
			}
			if got := store.Stats().Spans; got != tc.wantSpans {
				t.Fatalf("stored %d spans, want %d", got, tc.wantSpans)
			}
			ct := rec.Header().Get("Content-Type")
			body := rec.Body.Bytes()
			if rec.Code == 200 {
				resp := ptraceotlp.NewExportResponse()
				var err error
				if ct == ContentTypeJSON {
					err = resp.UnmarshalJSON(body)
				} else {
					err = resp.UnmarshalProto(body)
				}
				if err != nil || ct != mediaType(tc.p.contentType) {
					t.Fatalf("200 body is not an ExportTraceServiceResponse in %s (got %s): %v", tc.p.contentType, ct, err)
				}
				return
			}
			st := &spb.Status{}
			var err error
			if ct == ContentTypeProtobuf {
				err = proto.Unmarshal(body, st)
			} else {
				err = protojson.Unmarshal(body, st)
			}
			if err != nil || st.Message == "" || st.Code == 0 {
				t.Fatalf("error body is not a google.rpc.Status (%s): %q: %v", ct, body, err)
			}
			if tc.wantStatus == 405 && rec.Header().Get("Allow") != "POST" {
				t.Fatalf("405 without Allow: POST")
			}
		})
	}
}

func TestReceiverPartialSuccess(t *testing.T) {
	td := tracetest.Request{RequestID: "r1"}.Traces()
	td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().AppendEmpty().SetName("no ids")
	store := NewStore(StoreConfig{})
	r := NewReceiver(store, ReceiverConfig{})
	rec := do(r, post{contentType: ContentTypeProtobuf, body: protoBody(t, td)})
	if rec.Code != 200 {
		t.Fatalf("status %d", rec.Code)
	}
	resp := ptraceotlp.NewExportResponse()
	if err := resp.UnmarshalProto(rec.Body.Bytes()); err != nil {
		t.Fatal(err)
	}
	if resp.PartialSuccess().RejectedSpans() != 1 || resp.PartialSuccess().ErrorMessage() == "" {
		t.Fatalf("partial success = %d %q", resp.PartialSuccess().RejectedSpans(), resp.PartialSuccess().ErrorMessage())
	}
	st := r.Stats()
	if st.Requests != 1 || st.Accepted != 1 {
		t.Fatalf("receiver stats = %+v", st)
	}
}

func TestReceiverStatsCount(t *testing.T) {
	r := NewReceiver(NewStore(StoreConfig{}), ReceiverConfig{MaxBodyBytes: 10})
	do(r, post{method: http.MethodPut, contentType: ContentTypeJSON})
	do(r, post{contentType: "text/xml"})
	do(r, post{contentType: ContentTypeJSON, body: []byte("nope")})
	do(r, post{contentType: ContentTypeJSON, body: []byte(strings.Repeat(" ", 11))})
	do(r, post{contentType: ContentTypeJSON, body: []byte("{}")})
	want := ReceiverStats{Requests: 5, Accepted: 1, BadRequest: 1, TooLarge: 1, UnsupportedMediaType: 1, MethodNotAllowed: 1}
	if got := r.Stats(); got != want {
		t.Fatalf("stats = %+v, want %+v", got, want)
	}
}

// FuzzOTLPReceiver sends arbitrary bodies, content types and encodings to the receiver:
// it must never panic or answer 5xx.
func FuzzOTLPReceiver(f *testing.F) {
	td := tracetest.Request{RequestID: "f"}.Traces()
	pb, js := protoBody(f, td), jsonBody(f, td)
	f.Add(pb, uint8(0), false)
	f.Add(js, uint8(1), false)
	f.Add(gzipped(f, pb), uint8(0), true)
	f.Add(gzipped(f, js), uint8(1), true)
	f.Add(pb[:len(pb)/3], uint8(0), false)
	f.Add([]byte(`{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz","spanId":"0102030405060708"}]}]}]}`), uint8(1), false)
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, uint8(0), false)
	f.Add([]byte{}, uint8(2), false)
	cts := []string{ContentTypeProtobuf, ContentTypeJSON, "text/plain", "", "application/json; charset=\"", "application/x-protobuf;x=y"}
	f.Fuzz(func(t *testing.T, body []byte, ct uint8, gz bool) {
		store := NewStore(StoreConfig{MaxTraces: 50, MaxSpans: 500})
		r := NewReceiver(store, ReceiverConfig{MaxBodyBytes: 1 << 20})
		p := post{contentType: cts[int(ct)%len(cts)], body: body}
		if gz {
			p.encoding = "gzip"
		}
		rec := do(r, p)
		if rec.Code >= 500 {
			t.Fatalf("status %d for %d-byte body: %s", rec.Code, len(body), rec.Body.String())
		}
		// Whatever was accepted must be queryable.
		for _, row := range must(store.Requests(0, 0)) {
			if _, ok := store.Breakdown(row.TraceID); !ok {
				t.Fatalf("trace %s in the index but not found", row.TraceID)
			}
		}
	})
}

func must[T any](v T, _ int) T { return v }

func BenchmarkReceiverProtobuf(b *testing.B) {
	td := tracetest.Request{RequestID: "bench"}.Traces()
	pb := protoBody(b, td)
	r := NewReceiver(NewStore(StoreConfig{MaxTraces: 100}), ReceiverConfig{})
	b.ReportAllocs()
	b.SetBytes(int64(len(pb)))
	for b.Loop() {
		if rec := do(r, post{contentType: ContentTypeProtobuf, body: pb}); rec.Code != 200 {
			b.Fatal(rec.Code)
		}
	}
}
