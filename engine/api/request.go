package api

import (
	"crypto/subtle"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Authorize checks a request's "Authorization: Bearer <key>" against key,
// in constant time; an empty key admits every request. Its error is the
// OpenAI-shaped 401. Shared by the engine and the gateway.
func Authorize(r *http.Request, key string) *Error {
	if key == "" {
		return nil
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		return Unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
	}
	scheme, got, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return Unauthorized("Malformed Authorization header; expected 'Bearer <key>'.")
	}
	if subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(key)) != 1 {
		return Unauthorized("Incorrect API key provided.")
	}
	return nil
}

// ReadBody reads a request body of at most maxBytes (413 beyond). The
// server's read timeout (readTimeout, for the message) bounds the read: a
// body that has not arrived by then is a 408 (the connection is closed
// after it). A connection closed under the read (evicted at the connection
// cap while still sending) is a 499, not sent. Shared by the engine and the
// gateway.
func ReadBody(w http.ResponseWriter, r *http.Request, maxBytes int64, readTimeout time.Duration) ([]byte, *Error) {
	if r.ContentLength > maxBytes {
		return nil, PayloadTooLarge(maxBytes)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, PayloadTooLarge(maxBytes)
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			return nil, RequestTimeout(readTimeout)
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, Canceled()
		}
		return nil, BadRequest("", "Could not read the request body: %v.", err)
	}
	return body, nil
}
