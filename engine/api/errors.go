package api

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Error types of the request metrics' error_type label (contract:
// gen_ai_server_request_duration_seconds). ErrorTypeNone marks success.
const (
	ErrorTypeNone              = ""
	ErrorTypeInvalidRequest    = "invalid_request"
	ErrorTypeUnauthorized      = "unauthorized"
	ErrorTypeNotFound          = "not_found"
	ErrorTypePayloadTooLarge   = "payload_too_large"
	ErrorTypeQueueFull         = "queue_full"
	ErrorTypeWorkerUnavailable = "worker_unavailable"
	ErrorTypeTimeout           = "timeout"
	ErrorTypeCanceled          = "canceled"
	ErrorTypeInternal          = "internal"
)

// StatusClientClosedRequest is the status recorded (never sent: the client is
// gone) when the client disconnects before the response is complete.
const StatusClientClosedRequest = 499

// Error is an API error: the OpenAI error object plus the HTTP status and
// the metrics error type. It implements error. Errors are immutable values,
// safe to share.
type Error struct {
	// Status is the HTTP status code.
	Status int
	// Type is the OpenAI error type: invalid_request_error,
	// authentication_error, rate_limit_error or server_error.
	Type string
	// Code is the machine-readable code (OpenAI's "code"), or "".
	Code string
	// Param names the offending request parameter, or "".
	Param string
	// Message is the human-readable description.
	Message string
	// ErrorType is the error_type label of the request metrics.
	ErrorType string
	// RetryAfter, when positive, is sent as the Retry-After header (whole
	// seconds): when a 429 or 503 is worth retrying.
	RetryAfter int
	// RetryAfterMs, when positive, is sent as the Retry-After-Ms header
	// (the OpenAI SDKs read it before Retry-After): the same wait to the
	// millisecond.
	RetryAfterMs int64
}

// WithRetryAfter returns a copy of e that carries a Retry-After of secs
// seconds (at least 1).
func (e *Error) WithRetryAfter(secs int) *Error {
	c := *e
	c.RetryAfter = max(secs, 1)
	return &c
}

// WithRetryAfterDuration returns a copy of e that carries a wait of d:
// Retry-After in whole seconds rounded up (at least 1) and Retry-After-Ms.
func (e *Error) WithRetryAfterDuration(d time.Duration) *Error {
	c := *e
	c.RetryAfter = int(max(1, (d+time.Second-1)/time.Second))
	c.RetryAfterMs = int64(max(1, (d+time.Millisecond-1)/time.Millisecond))
	return &c
}

// Error implements error.
func (e *Error) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("%d %s (param %s): %s", e.Status, e.Type, e.Param, e.Message)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message)
}

// ErrorBody is the JSON body of an error response:
// {"error": {"message", "type", "param", "code"}}.
type ErrorBody struct {
	Error ErrorObject `json:"error"`
}

// ErrorObject is the OpenAI error object; param and code are null when empty.
type ErrorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// Body returns the error's JSON body value. Its code is never null: an
// Error without one gets DefaultCode(Status), so a client can always branch
// on it.
func (e *Error) Body() ErrorBody {
	b := ErrorBody{Error: ErrorObject{Message: e.Message, Type: e.Type}}
	if e.Param != "" {
		p := e.Param
		b.Error.Param = &p
	}
	c := e.Code
	if c == "" {
		c = DefaultCode(e.Status)
	}
	b.Error.Code = &c
	return b
}

// DefaultCode is the code of an error made without one: CodeInvalidRequest
// for a 4xx, CodeServerError otherwise.
func DefaultCode(status int) string {
	if status >= 400 && status < 500 {
		return CodeInvalidRequest
	}
	return CodeServerError
}

// HeaderRequestID is the response header that names the request (OpenAI's
// x-request-id; the SDKs expose it as the error's and the response's
// request id).
const HeaderRequestID = "X-Request-Id"

// NewRequestID returns a fresh request id, "req-" and 24 hex digits, for a
// response that has none yet (an error written before the request got its
// completion id).
func NewRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "req-" + hex.EncodeToString(b[:])
}

// Write sends e as a JSON error response with its status. The response
// carries an X-Request-Id: the one the handler already set, else a fresh
// NewRequestID, so that every error (a gateway's own 400, 415, 404, 429 and
// 503 included) can be quoted by the client.
func (e *Error) Write(w http.ResponseWriter) {
	body, _ := json.Marshal(e.Body())
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if h.Get(HeaderRequestID) == "" {
		h.Set(HeaderRequestID, NewRequestID())
	}
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if e.RetryAfterMs > 0 {
		h.Set("Retry-After-Ms", strconv.FormatInt(e.RetryAfterMs, 10))
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(body, '\n'))
}

// BadRequest returns a 400 invalid_request_error about param with the
// generic code CodeInvalidRequest; prefer BadRequestCode with the specific
// code.
func BadRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Code: CodeInvalidRequest,
		Message: fmt.Sprintf(format, args...), ErrorType: ErrorTypeInvalidRequest}
}

// BadRequestCode returns a 400 invalid_request_error about param with the
// OpenAI error code code (e.g. CodeContextLengthExceeded).
func BadRequestCode(param, code, format string, args ...any) *Error {
	e := BadRequest(param, format, args...)
	e.Code = code
	return e
}

// OpenAI error codes of 400 invalid_request_error responses.
const (
	// CodeContextLengthExceeded: the prompt, or the prompt plus the output
	// limit, does not fit the model's context.
	CodeContextLengthExceeded = "context_length_exceeded"
	// CodeDecimalBelowMin: a number below its range (temperature < 0).
	CodeDecimalBelowMin = "decimal_below_min_value"
	// CodeDecimalAboveMax: a number above its range (temperature > 2).
	CodeDecimalAboveMax = "decimal_above_max_value"
	// CodeIntegerBelowMin: an integer below its minimum (max_tokens < 1).
	CodeIntegerBelowMin = "integer_below_min_value"
	// CodeArrayAboveMaxLength: too many stop sequences or messages.
	CodeArrayAboveMaxLength = "array_above_max_length"
	// CodeEmptyArray: an array that must not be empty.
	CodeEmptyArray = "empty_array"
	// CodeUnsupportedParameter: a parameter this server does not implement.
	CodeUnsupportedParameter = "unsupported_parameter"
	// CodeUnsupportedValue: a value this server does not implement (n > 1).
	CodeUnsupportedValue = "unsupported_value"
	// CodeInvalidValue: a value outside its domain (a token id outside the
	// vocabulary, an empty stop sequence).
	CodeInvalidValue = "invalid_value"
	// CodeUnsupportedMediaType: a body that is not application/json (415).
	CodeUnsupportedMediaType = "unsupported_media_type"
	// CodeMissingRequiredParameter: a required parameter is absent or null
	// (model, messages, prompt, a message's role, a tool message's
	// tool_call_id).
	CodeMissingRequiredParameter = "missing_required_parameter"
	// CodeInvalidType: a parameter of the wrong JSON type.
	CodeInvalidType = "invalid_type"
	// CodeInvalidJSON: a body that is empty, not a JSON object, not UTF-8 or
	// not valid JSON.
	CodeInvalidJSON = "invalid_json"
	// CodeInvalidRequest: the generic code of a 4xx without a more specific
	// one (see DefaultCode).
	CodeInvalidRequest = "invalid_request"
	// CodeServerError: the generic code of a 5xx without a more specific one.
	CodeServerError = "server_error"
)

// UnsupportedMediaType returns the 415 of a request body whose Content-Type
// is not application/json.
func UnsupportedMediaType(got string) *Error {
	if got == "" {
		got = "none"
	}
	if len(got) > 100 {
		got = got[:100] + "..."
	}
	return &Error{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: CodeUnsupportedMediaType,
		Message: fmt.Sprintf("Unsupported Content-Type %q; send the request body as application/json.", got), ErrorType: ErrorTypeInvalidRequest}
}

// Unauthorized returns the 401 of a missing or wrong API key.
func Unauthorized(msg string) *Error {
	return &Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: msg, ErrorType: ErrorTypeUnauthorized}
}

// ModelNotFound returns the 404 of an unknown model.
func ModelNotFound(model string) *Error {
	return &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
		Message: fmt.Sprintf("The model %q does not exist.", model), ErrorType: ErrorTypeNotFound}
}

// RouteNotFound returns the 404 of an unknown path.
func RouteNotFound(method, path string) *Error {
	return &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
		Message: fmt.Sprintf("Unknown request URL: %s %s.", method, path), ErrorType: ErrorTypeNotFound}
}

// MethodNotAllowed returns the 405 of a known path with the wrong method.
func MethodNotAllowed(method, path string) *Error {
	return &Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: fmt.Sprintf("Method %s is not allowed on %s.", method, path), ErrorType: ErrorTypeInvalidRequest}
}

// PayloadTooLarge returns the 413 of a body over limit bytes.
func PayloadTooLarge(limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: fmt.Sprintf("The request body exceeds the limit of %d bytes.", limit), ErrorType: ErrorTypePayloadTooLarge}
}

// RequestTimeout returns the 408 of a request whose body did not arrive
// within limit.
func RequestTimeout(limit time.Duration) *Error {
	return &Error{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
		Message: fmt.Sprintf("The request body did not arrive within %v.", limit), ErrorType: ErrorTypeTimeout}
}

// QueueFull returns the 429 of a full scheduler queue.
func QueueFull(capacity int) *Error {
	return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full",
		Message: fmt.Sprintf("The server queue is full (%d requests waiting); retry later.", capacity), ErrorType: ErrorTypeQueueFull}
}

// WorkerUnavailable returns the 503 of an engine whose worker cannot serve.
func WorkerUnavailable(detail string) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "worker_unavailable",
		Message: "The model worker is unavailable: " + detail, ErrorType: ErrorTypeWorkerUnavailable}
}

// Timeout returns the 504 of a request that ran past its deadline.
func Timeout(detail string) *Error {
	return &Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "timeout",
		Message: "The request timed out: " + detail, ErrorType: ErrorTypeTimeout}
}

// Canceled returns the error recorded for a request whose client went away
// (status 499, never sent).
func Canceled() *Error {
	return &Error{Status: StatusClientClosedRequest, Type: "invalid_request_error", Code: "canceled",
		Message: "The client closed the request.", ErrorType: ErrorTypeCanceled}
}

// Internal returns a 500 server_error.
func Internal(detail string) *Error {
	return &Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error",
		Message: "Internal error: " + detail, ErrorType: ErrorTypeInternal}
}
