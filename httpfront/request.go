package httpfront

import (
	"crypto/subtle"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
)

// authorize checks a request's "Authorization: Bearer <key>" against key,
// in constant time; an empty key admits every request. Its error is the
// OpenAI-shaped 401.
func authorize(r *http.Request, key string) *api.Error {
	if key == "" {
		return nil
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		return api.Unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
	}
	scheme, got, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return api.Unauthorized("Malformed Authorization header; expected 'Bearer <key>'.")
	}
	if subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(key)) != 1 {
		return api.Unauthorized("Incorrect API key provided.")
	}
	return nil
}

// checkJSON refuses (415) a request whose Content-Type is not
// application/json (parameters such as charset=utf-8 allowed; other
// charsets refused): a form, multipart or text/plain body, or one without a
// Content-Type, is what a web page can send cross-site without a CORS
// preflight, so it is never served as JSON.
func checkJSON(r *http.Request) *api.Error {
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return api.UnsupportedMediaType(ct)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return api.UnsupportedMediaType(ct)
	}
	return nil
}

// readBody reads a request body of at most maxBytes (413 beyond). The
// server's read timeout (readTimeout, for the message) bounds the read: a
// body that has not arrived by then is a 408 (the connection is closed
// after it). A connection closed under the read (evicted at the connection
// cap while still sending) is a 499, not sent.
func readBody(w http.ResponseWriter, r *http.Request, maxBytes int64, readTimeout time.Duration) ([]byte, *api.Error) {
	if r.ContentLength > maxBytes {
		return nil, api.PayloadTooLarge(maxBytes)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, api.PayloadTooLarge(maxBytes)
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			return nil, api.RequestTimeout(readTimeout)
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, api.Canceled()
		}
		return nil, api.BadRequest("", "Could not read the request body: %v.", err)
	}
	return body, nil
}
