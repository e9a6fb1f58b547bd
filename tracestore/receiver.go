package tracestore

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// DefaultMaxBodyBytes is the default limit of an OTLP request body, both as received and
// after decompression.
const DefaultMaxBodyBytes = 16 << 20

// Content types of OTLP/HTTP.
const (
	ContentTypeProtobuf = "application/x-protobuf"
	ContentTypeJSON     = "application/json"
)

// ReceiverConfig holds the optional settings of a [Receiver]. The zero value is usable.
type ReceiverConfig struct {
	// MaxBodyBytes caps a request body as received and again after decompression (a gzip
	// bomb stops at the cap); larger requests get 413. 0 means DefaultMaxBodyBytes (16 MiB).
	MaxBodyBytes int64
}

// ReceiverStats counts the receiver's responses. The counters only go up.
type ReceiverStats struct {
	Requests uint64 `json:"requests"`
	// Accepted counts 200 responses (including partial successes).
	Accepted uint64 `json:"accepted"`
	// BadRequest counts 400 responses: a body that is not valid OTLP, or a broken gzip stream.
	BadRequest uint64 `json:"badRequest"`
	// TooLarge counts 413 responses.
	TooLarge uint64 `json:"tooLarge"`
	// UnsupportedMediaType counts 415 responses: a content type other than protobuf or
	// JSON, or a content encoding other than gzip or identity.
	UnsupportedMediaType uint64 `json:"unsupportedMediaType"`
	// MethodNotAllowed counts 405 responses.
	MethodNotAllowed uint64 `json:"methodNotAllowed"`
}

// Receiver is the OTLP/HTTP trace receiver: an http.Handler for POST /v1/traces that
// decodes an ExportTraceServiceRequest (protobuf or JSON, optionally gzip-compressed) with
// the collector's pdata and adds its spans to a [Store]. It answers as the OTLP/HTTP
// specification says: 200 with an ExportTraceServiceResponse in the request's encoding
// (with partial_success when spans were rejected); 4xx with a google.rpc.Status body: 400
// for a body that does not decode, 405 for a method other than POST, 413 over the size
// limit, 415 for an unsupported content type or encoding. Bad input never causes a 5xx or
// a panic. Safe for concurrent use.
type Receiver struct {
	store   *Store
	maxBody int64

	requests, accepted, badRequest, tooLarge, unsupported, badMethod atomic.Uint64
}

// NewReceiver returns a receiver that stores into store.
func NewReceiver(store *Store, cfg ReceiverConfig) *Receiver {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return &Receiver{store: store, maxBody: cfg.MaxBodyBytes}
}

// Stats returns the response counters.
func (r *Receiver) Stats() ReceiverStats {
	return ReceiverStats{
		Requests:             r.requests.Load(),
		Accepted:             r.accepted.Load(),
		BadRequest:           r.badRequest.Load(),
		TooLarge:             r.tooLarge.Load(),
		UnsupportedMediaType: r.unsupported.Load(),
		MethodNotAllowed:     r.badMethod.Load(),
	}
}

var (
	errTooLarge = errors.New("request body too large")
	errEncoding = errors.New("unsupported content encoding")
)

// ServeHTTP implements http.Handler.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.requests.Add(1)
	ct := mediaType(req.Header.Get("Content-Type"))
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		r.fail(w, ct, http.StatusMethodNotAllowed, "method %s not allowed; use POST", req.Method)
		return
	}
	if ct != ContentTypeProtobuf && ct != ContentTypeJSON {
		r.fail(w, ct, http.StatusUnsupportedMediaType,
			"unsupported content type %q; use %s or %s", req.Header.Get("Content-Type"), ContentTypeProtobuf, ContentTypeJSON)
		return
	}
	body, err := r.readBody(w, req)
	switch {
	case errors.Is(err, errTooLarge):
		r.fail(w, ct, http.StatusRequestEntityTooLarge, "%v", err)
		return
	case errors.Is(err, errEncoding):
		r.fail(w, ct, http.StatusUnsupportedMediaType, "%v", err)
		return
	case err != nil:
		r.fail(w, ct, http.StatusBadRequest, "%v", err)
		return
	}
	td, err := decode(ct, body)
	if err != nil {
		r.fail(w, ct, http.StatusBadRequest, "%v", err)
		return
	}
	res := r.store.Add(td)

	resp := ptraceotlp.NewExportResponse()
	if res.Rejected > 0 {
		resp.PartialSuccess().SetRejectedSpans(int64(res.Rejected))
		resp.PartialSuccess().SetErrorMessage(res.Reason)
	}
	var out []byte
	if ct == ContentTypeJSON {
		out, err = resp.MarshalJSON()
	} else {
		out, err = resp.MarshalProto()
	}
	if err != nil { // cannot happen for a response this small; still never a 5xx to a client
		out = nil
	}
	r.accepted.Add(1)
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

func mediaType(h string) string {
	mt, _, err := mime.ParseMediaType(h)
	if err != nil {
		return ""
	}
	return strings.ToLower(mt)
}

// readBody reads the body, enforcing the size limit before and after decompression.
func (r *Receiver) readBody(w http.ResponseWriter, req *http.Request) ([]byte, error) {
	if req.ContentLength > r.maxBody {
		return nil, fmt.Errorf("%w: %d bytes > limit %d", errTooLarge, req.ContentLength, r.maxBody)
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, fmt.Errorf("%w: over limit %d bytes", errTooLarge, r.maxBody)
		}
		return nil, fmt.Errorf("read body: %w", err)
	}
	switch enc := strings.ToLower(strings.TrimSpace(req.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return raw, nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		out, err := io.ReadAll(io.LimitReader(zr, r.maxBody+1))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		if int64(len(out)) > r.maxBody {
			return nil, fmt.Errorf("%w: decompressed body over limit %d bytes", errTooLarge, r.maxBody)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("%w %q; use gzip or none", errEncoding, enc)
	}
}

// decode unmarshals an ExportTraceServiceRequest. A panic inside the decoder on hostile
// input becomes an error.
func decode(ct string, body []byte) (td ptrace.Traces, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("malformed OTLP body: decoder failed: %v", p)
		}
	}()
	if ct == ContentTypeJSON {
		u := ptrace.JSONUnmarshaler{}
		td, err = u.UnmarshalTraces(body)
		if err != nil {
			return ptrace.Traces{}, fmt.Errorf("malformed OTLP/JSON body: %w", err)
		}
		return td, nil
	}
	var u ptrace.ProtoUnmarshaler
	td, err = u.UnmarshalTraces(body)
	if err != nil {
		return ptrace.Traces{}, fmt.Errorf("malformed OTLP/protobuf body: %w", err)
	}
	return td, nil
}

// fail writes an error response with a google.rpc.Status body in the request's encoding
// (JSON when the request's content type is unsupported).
func (r *Receiver) fail(w http.ResponseWriter, ct string, code int, format string, args ...any) {
	switch code {
	case http.StatusBadRequest:
		r.badRequest.Add(1)
	case http.StatusRequestEntityTooLarge:
		r.tooLarge.Add(1)
	case http.StatusUnsupportedMediaType:
		r.unsupported.Add(1)
	case http.StatusMethodNotAllowed:
		r.badMethod.Add(1)
	}
	// The message may quote the body; protobuf strings must be valid UTF-8.
	msg := strings.ToValidUTF8(fmt.Sprintf(format, args...), "\uFFFD")
	if len(msg) > 1024 {
		msg = strings.ToValidUTF8(msg[:1024], "") + "…"
	}
	st := &spb.Status{Code: grpcCode(code), Message: msg}
	var body []byte
	var err error
	if ct == ContentTypeProtobuf {
		body, err = proto.Marshal(st)
	} else {
		ct = ContentTypeJSON
		body, err = protojson.Marshal(st)
	}
	if err != nil {
		body = nil
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// grpcCode maps an HTTP status to the google.rpc.Code the OTLP specification pairs with it.
func grpcCode(httpStatus int) int32 {
	switch httpStatus {
	case http.StatusBadRequest:
		return 3 // INVALID_ARGUMENT
	case http.StatusRequestEntityTooLarge:
		return 8 // RESOURCE_EXHAUSTED
	case http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType:
		return 12 // UNIMPLEMENTED
	}
	return 2 // UNKNOWN
}
