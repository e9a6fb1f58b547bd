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

	"github.com/cacheblend/cacheblend/defaults"
)

// DefaultMaxBodyBytes is the default limit of an OTLP request body, both as received and
// after decompression.
const DefaultMaxBodyBytes = 16 << 20

// RetryAfterSeconds is the Retry-After of a 429 answer (see ReceiverConfig.MaxInFlightBytes).
const RetryAfterSeconds = 1

// Content types of OTLP/HTTP.
const (
	ContentTypeProtobuf = "application/x-protobuf"
	ContentTypeJSON     = "application/json"
)

// ReceiverConfig holds the optional settings of a [Receiver]. The zero value is usable.
type ReceiverConfig struct {
	// MaxBodyBytes caps a request body as received and again after decompression (a gzip
	// bomb stops at the cap); larger requests get 413. 0 means DefaultMaxBodyBytes (16 MiB).
	// It is lowered to the store's MaxBytes when that is smaller: a body the store could
	// never hold is refused before it is decoded.
	MaxBodyBytes int64
	// MaxInFlightBytes caps the body bytes (as received plus decompressed) held at once by
	// the requests being read, decoded and stored; decoding takes a few times as much
	// again, for as long. A request that would exceed it gets 429 with Retry-After, which
	// OTLP exporters retry. 0 means 4 × MaxBodyBytes (64 MiB by default); it is raised to
	// at least 2 × MaxBodyBytes, so a request of the largest size always fits alone.
	MaxInFlightBytes int64
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
	// TooManyRequests counts 429 responses: requests refused because MaxInFlightBytes were
	// in flight.
	TooManyRequests uint64 `json:"tooManyRequests"`
}

// Receiver is the OTLP/HTTP trace receiver: an http.Handler for POST /v1/traces that
// decodes an ExportTraceServiceRequest (protobuf or JSON, optionally gzip-compressed) with
// the collector's pdata and adds its spans to a [Store]. It answers as the OTLP/HTTP
// specification says: 200 with an ExportTraceServiceResponse in the request's encoding
// (with partial_success when spans were rejected); 4xx with a google.rpc.Status body: 400
// for a body that does not decode, 405 for a method other than POST, 413 over the size
// limit, 415 for an unsupported content type or encoding, 429 (with Retry-After) while
// too many body bytes are in flight. Bad input never causes a 5xx or a panic. Safe for
// concurrent use.
type Receiver struct {
	store       *Store
	maxBody     int64
	maxInFlight int64
	inFlight    atomic.Int64

	requests atomic.Uint64
	answered map[int]*atomic.Uint64 // responses by the statuses ReceiverStats counts
}

// NewReceiver returns a receiver that stores into store, with cfg's limits (defaults for
// fields left 0).
func NewReceiver(store *Store, cfg ReceiverConfig) *Receiver {
	defaults.Positive(&cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	cfg.MaxBodyBytes = min(cfg.MaxBodyBytes, store.Config().MaxBytes)
	defaults.Positive(&cfg.MaxInFlightBytes, 4*cfg.MaxBodyBytes)
	cfg.MaxInFlightBytes = max(cfg.MaxInFlightBytes, 2*cfg.MaxBodyBytes)
	r := &Receiver{store: store, maxBody: cfg.MaxBodyBytes, maxInFlight: cfg.MaxInFlightBytes, answered: map[int]*atomic.Uint64{}}
	for _, code := range []int{http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge,
		http.StatusUnsupportedMediaType, http.StatusMethodNotAllowed, http.StatusTooManyRequests} {
		r.answered[code] = new(atomic.Uint64)
	}
	return r
}

// Limits returns the body and in-flight limits in force (see [ReceiverConfig]).
func (r *Receiver) Limits() (maxBodyBytes, maxInFlightBytes int64) { return r.maxBody, r.maxInFlight }

// Stats returns the response counters.
func (r *Receiver) Stats() ReceiverStats {
	return ReceiverStats{
		Requests:             r.requests.Load(),
		Accepted:             r.answered[http.StatusOK].Load(),
		BadRequest:           r.answered[http.StatusBadRequest].Load(),
		TooLarge:             r.answered[http.StatusRequestEntityTooLarge].Load(),
		UnsupportedMediaType: r.answered[http.StatusUnsupportedMediaType].Load(),
		MethodNotAllowed:     r.answered[http.StatusMethodNotAllowed].Load(),
		TooManyRequests:      r.answered[http.StatusTooManyRequests].Load(),
	}
}

var (
	errTooLarge = errors.New("request body too large")
	errEncoding = errors.New("unsupported content encoding")
	errBusy     = errors.New("too many OTLP request bytes in flight; retry later")
)

// reservation is the share of MaxInFlightBytes one request holds.
type reservation struct {
	r    *Receiver
	held int64
}

// take reserves n more bytes; false (nothing taken) when that would exceed the limit.
func (rv *reservation) take(n int64) bool {
	for {
		cur := rv.r.inFlight.Load()
		if cur+n > rv.r.maxInFlight {
			return false
		}
		if rv.r.inFlight.CompareAndSwap(cur, cur+n) {
			rv.held += n
			return true
		}
	}
}

func (rv *reservation) release() {
	rv.r.inFlight.Add(-rv.held)
	rv.held = 0
}

// reservingReader reserves what it reads.
type reservingReader struct {
	rd io.Reader
	rv *reservation
}

func (x reservingReader) Read(p []byte) (int, error) {
	n, err := x.rd.Read(p)
	if n > 0 && !x.rv.take(int64(n)) {
		return 0, errBusy
	}
	return n, err
}

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
	rv := &reservation{r: r}
	defer rv.release() // after the spans are stored: the decoded request lives until then
	body, err := r.readBody(w, req, rv)
	var td ptrace.Traces
	if err == nil {
		td, err = decode(ct, body)
	}
	if err != nil {
		code := http.StatusBadRequest
		switch {
		case errors.Is(err, errBusy):
			w.Header().Set("Retry-After", fmt.Sprint(RetryAfterSeconds))
			code = http.StatusTooManyRequests
		case errors.Is(err, errTooLarge):
			code = http.StatusRequestEntityTooLarge
		case errors.Is(err, errEncoding):
			code = http.StatusUnsupportedMediaType
		}
		r.fail(w, ct, code, "%v", err)
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
	r.answered[http.StatusOK].Add(1)
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

// readBody reads the body, enforcing the size limit before and after decompression and
// reserving the bytes it holds in rv.
func (r *Receiver) readBody(w http.ResponseWriter, req *http.Request, rv *reservation) ([]byte, error) {
	if req.ContentLength > r.maxBody {
		return nil, fmt.Errorf("%w: %d bytes > limit %d", errTooLarge, req.ContentLength, r.maxBody)
	}
	var body io.Reader = http.MaxBytesReader(w, req.Body, r.maxBody)
	var raw []byte
	if req.ContentLength >= 0 { // known length (the server holds the body to it): reserve it first
		if !rv.take(req.ContentLength) {
			return nil, errBusy
		}
		raw = make([]byte, 0, req.ContentLength+1) // +1: ReadAll needs room to see EOF
	} else {
		body = reservingReader{body, rv}
	}
	raw, err := readAll(raw, body)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return nil, fmt.Errorf("%w: over limit %d bytes", errTooLarge, r.maxBody)
		case errors.Is(err, errBusy):
			return nil, err
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
		out, err := readAll(nil, reservingReader{io.LimitReader(zr, r.maxBody+1), rv})
		if errors.Is(err, errBusy) {
			return nil, err
		}
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

// readAll is io.ReadAll into buf (which may be preallocated).
func readAll(buf []byte, rd io.Reader) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
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
	var u ptrace.Unmarshaler = &ptrace.ProtoUnmarshaler{}
	format := "protobuf"
	if ct == ContentTypeJSON {
		u, format = &ptrace.JSONUnmarshaler{}, "JSON"
	}
	if td, err = u.UnmarshalTraces(body); err != nil {
		return ptrace.Traces{}, fmt.Errorf("malformed OTLP/%s body: %w", format, err)
	}
	return td, nil
}

// fail writes an error response with a google.rpc.Status body in the request's encoding
// (JSON when the request's content type is unsupported).
func (r *Receiver) fail(w http.ResponseWriter, ct string, code int, format string, args ...any) {
	if c := r.answered[code]; c != nil {
		c.Add(1)
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
	case http.StatusTooManyRequests:
		return 14 // UNAVAILABLE: retryable
	}
	return 2 // UNKNOWN
}
