package engine

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/internal/enginetest"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// storeAnswer is a StoreStatus hook of the blend double answering states
// (one per document, in order) with l2 and diskFull.
func storeAnswer(l2, diskFull bool, states ...*cbv1.StoreState) func(*cbv1.StoreStatusRequest) (*cbv1.StoreStatusResponse, error) {
	return func(r *cbv1.StoreStatusRequest) (*cbv1.StoreStatusResponse, error) {
		if len(r.GetRequestIds()) != len(states) {
			return nil, status.Errorf(codes.InvalidArgument, "asked for %d ids, the test has %d states", len(r.GetRequestIds()), len(states))
		}
		return &cbv1.StoreStatusResponse{L2: l2, DiskFull: diskFull, States: states}, nil
	}
}

const enospc = "no space left on device"

// POST /v1/documents says per document where its chunks are held, from the
// blend server's StoreStatus: stored (every tier), memory_only (an L2 write
// failed: not durable), failed (no tier holds it), unconfirmed (the blend
// server did not answer); and fails the whole request only when nothing was
// kept: 507 insufficient_storage on a full disk, else 503 store_failed with
// Retry-After.
func TestDocumentsStoreStatus(t *testing.T) {
	stored := &cbv1.StoreState{State: "stored"}
	memOnly := &cbv1.StoreState{State: "memory_only", Error: enospc}
	failed := &cbv1.StoreState{State: "failed", Error: enospc}
	type doc struct{ status, l2, errHas string }
	for _, tc := range []struct {
		name       string
		hook       func(*cbv1.StoreStatusRequest) (*cbv1.StoreStatusResponse, error)
		wantStatus int
		wantCode   string
		retryAfter bool
		want       []doc
	}{
		{name: "default double: every store durable", wantStatus: 200,
			want: []doc{{status: DocStored}, {status: DocStored}}},
		{name: "stored with an L2", hook: storeAnswer(true, false, stored, stored), wantStatus: 200,
			want: []doc{{status: DocStored, l2: "stored"}, {status: DocStored, l2: "stored"}}},
		{name: "second held in memory only (disk full)", hook: storeAnswer(true, true, stored, memOnly), wantStatus: 200,
			want: []doc{{status: DocStored, l2: "stored"}, {status: DocMemoryOnly, l2: "failed: " + enospc, errHas: "not durable"}}},
		{name: "one failed, one stored: 200, each says", hook: storeAnswer(true, true, failed, stored), wantStatus: 200,
			want: []doc{{status: DocFailed, l2: "failed: " + enospc, errHas: enospc}, {status: DocStored, l2: "stored"}}},
		{name: "nothing kept, disk full: 507", hook: storeAnswer(true, true, failed, failed),
			wantStatus: http.StatusInsufficientStorage, wantCode: "insufficient_storage"},
		{name: "nothing kept, disk not full: 503 with Retry-After", hook: storeAnswer(false, false, failed, failed),
			wantStatus: http.StatusServiceUnavailable, wantCode: "store_failed", retryAfter: true},
		{name: "blend server older than StoreStatus: the worker's report", wantStatus: 200,
			hook: func(*cbv1.StoreStatusRequest) (*cbv1.StoreStatusResponse, error) {
				return nil, status.Error(codes.Unimplemented, "unknown method StoreStatus")
			},
			want: []doc{{status: DocStored}, {status: DocStored}}},
		{name: "blend server fails the query: unconfirmed", wantStatus: 200,
			hook: func(*cbv1.StoreStatusRequest) (*cbv1.StoreStatusResponse, error) {
				return nil, status.Error(codes.Unavailable, "down")
			},
			want: []doc{{status: DocUnconfirmed}, {status: DocUnconfirmed}}},
		{name: "unknown state: unconfirmed", hook: storeAnswer(true, false, stored, &cbv1.StoreState{State: "unknown"}), wantStatus: 200,
			want: []doc{{status: DocStored, l2: "stored"}, {status: DocUnconfirmed}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := newEnv(t, envOpts{worker: enginetest.NewWorker(64, 16, 2048), blend: &enginetest.Blend{Stores: tc.hook}})
			resp := send(t, http.MethodPost, ev.base+api.RouteDocuments, `{"documents":["first document text","second document text"]}`, jsonHeader)
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.wantStatus, raw)
			}
			if id := resp.Header.Get(api.HeaderRequestID); id == "" {
				t.Errorf("no %s on the answer", api.HeaderRequestID)
			}
			if tc.wantStatus != 200 {
				var eb api.ErrorBody
				if err := json.Unmarshal(raw, &eb); err != nil || eb.Error.Code == nil || *eb.Error.Code != tc.wantCode || eb.Error.Type != "server_error" {
					t.Fatalf("error body %s, want code %s", raw, tc.wantCode)
				}
				if got := resp.Header.Get("Retry-After"); (got != "") != tc.retryAfter {
					t.Fatalf("Retry-After %q, want one: %v", got, tc.retryAfter)
				}
				return
			}
			var out struct {
				Data []struct {
					Status string `json:"status"`
					L2     string `json:"l2"`
					Error  string `json:"error"`
				} `json:"data"`
			}
			if err := json.Unmarshal(raw, &out); err != nil || len(out.Data) != len(tc.want) {
				t.Fatalf("body %s: %v", raw, err)
			}
			for i, w := range tc.want {
				d := out.Data[i]
				if d.Status != w.status || d.L2 != w.l2 || (w.errHas == "") != (d.Error == "") || !strings.Contains(d.Error, w.errHas) {
					t.Errorf("document %d: %+v, want status %q l2 %q error containing %q", i, d, w.status, w.l2, w.errHas)
				}
			}
		})
	}
}

// A document beyond the model's positions is a 400 with OpenAI's
// context_length_exceeded code, like a prompt that does not fit.
func TestDocumentOverContextLength(t *testing.T) {
	ev := newEnv(t, envOpts{worker: enginetest.NewWorker(64, 16, 32), blend: &enginetest.Blend{}})
	long := strings.Repeat("many words here ", 40)
	resp := send(t, http.MethodPost, ev.base+api.RouteDocuments, `{"documents":["short","`+long+`"]}`, jsonHeader)
	raw, _ := io.ReadAll(resp.Body)
	var eb api.ErrorBody
	if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(raw, &eb) != nil || eb.Error.Code == nil ||
		*eb.Error.Code != api.CodeContextLengthExceeded || eb.Error.Param == nil || *eb.Error.Param != "documents" {
		t.Fatalf("%d %s, want 400 %s about documents", resp.StatusCode, raw, api.CodeContextLengthExceeded)
	}
	if resp.Header.Get(api.HeaderRequestID) == "" {
		t.Errorf("no %s on the error", api.HeaderRequestID)
	}
}

// The error a prefill engine records for a decode engine's error answer
// keeps the decode engine's code (and type) when its body carries one, else
// the status's default code: never empty.
func TestRelayedErrorCode(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		body     string
		code     string
		typ      string
		errLabel string
	}{
		{"decode engine's code kept", 400, `{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`,
			api.CodeContextLengthExceeded, "invalid_request_error", api.ErrorTypeInvalidRequest},
		{"429 with its code", 429, `{"error":{"message":"full","type":"rate_limit_error","param":null,"code":"queue_full"}}`,
			"queue_full", "rate_limit_error", api.ErrorTypeQueueFull},
		{"null code: the status's default", 503, `{"error":{"message":"x","type":"server_error","param":null,"code":null}}`,
			api.CodeServerError, "server_error", api.ErrorTypeWorkerUnavailable},
		{"not JSON: the status's default", 502, `<html>bad gateway</html>`, api.CodeServerError, "server_error", api.ErrorTypeWorkerUnavailable},
		{"4xx without a body", 404, ``, api.CodeInvalidRequest, "server_error", api.ErrorTypeNotFound},
		{"overlong code ignored", 500, `{"error":{"message":"x","type":"server_error","code":"` + strings.Repeat("c", 200) + `"}}`,
			api.CodeServerError, "server_error", api.ErrorTypeInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := relayedError(tc.status, []byte(tc.body))
			if e.Status != tc.status || e.Code != tc.code || e.Type != tc.typ || e.ErrorType != tc.errLabel {
				t.Fatalf("%+v, want status %d code %q type %q error_type %q", e, tc.status, tc.code, tc.typ, tc.errLabel)
			}
		})
	}
}
