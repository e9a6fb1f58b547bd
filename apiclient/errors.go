package apiclient

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Kinds of a failed chat completion (Error.Kind). An HTTP error status is "http_<code>",
// e.g. "http_503" (see [KindHTTP]).
const (
	KindConnection = "connection"   // the request could not be sent or the response read
	KindTimeout    = "timeout"      // ChatRequest.Timeout elapsed
	KindCanceled   = "canceled"     // the caller's context ended
	KindStream     = "stream_error" // the stream carried an error event
	KindBadStream  = "bad_stream"   // an event that is not valid JSON, or an oversized line
	KindTruncated  = "truncated"    // the stream ended before data: [DONE]
	KindNoTokens   = "no_tokens"    // the stream completed without any content
)

// KindHTTP returns the kind of a failure answered with HTTP status code, "http_<code>".
func KindHTTP(code int) string { return fmt.Sprintf("http_%d", code) }

// Error is a failed chat completion or a malformed event stream. Its message is
// Kind + ": " + Err's message. Error values are not mutated after they are returned, so
// they are safe to share between goroutines.
type Error struct {
	// Kind is one of the Kind constants or KindHTTP(Status).
	Kind string
	// Status is the HTTP status of the response, 0 when none was received (or the error
	// came from ReadStream).
	Status int
	// Err is the underlying error; for an HTTP error status it is an *HTTPError.
	Err error
}

func (e *Error) Error() string { return e.Kind + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// HTTPError is a non-2xx response. Its message is "HTTP <status>: <message>". Safe to share
// between goroutines.
type HTTPError struct {
	// Status is the HTTP status code.
	Status int
	// Message is the OpenAI-style error.message of the body when it has one, else the
	// first 2 KiB of the body, trimmed.
	Message string
}

func (e *HTTPError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Message) }

// httpError reads the start of a non-2xx response's body into an *HTTPError.
func httpError(resp *http.Response) *HTTPError {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	msg := strings.TrimSpace(string(b))
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	return &HTTPError{Status: resp.StatusCode, Message: msg}
}
