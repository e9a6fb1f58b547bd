package gateway

import (
	"net/http"
	"strconv"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
)

// Error codes of the gateway's own OpenAI-shaped errors.
const (
	CodeNoEngine     = "engine_unavailable"
	CodeQueueFull    = "queue_full"
	CodeQueueTimeout = "queue_timeout"
	CodeEngineLost   = "engine_lost"
	CodeIdleTimeout  = "upstream_idle_timeout"
)

// noEngine is the 503 of a request no engine could serve; detail says why.
func noEngine(detail string) *api.Error {
	return &api.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: CodeNoEngine,
		Message: "No engine can serve the request: " + detail, ErrorType: api.ErrorTypeWorkerUnavailable}
}

// queueFull is the 429 of a full gateway queue.
func queueFull(capacity int) *api.Error {
	return &api.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: CodeQueueFull,
		Message: "The gateway queue is full (" + strconv.Itoa(capacity) + " requests waiting); retry later.", ErrorType: api.ErrorTypeQueueFull}
}

// queueTimeout is the 503 of a request that found no engine slot within the queue timeout.
func queueTimeout(d time.Duration) *api.Error {
	return &api.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: CodeQueueTimeout,
		Message: "No engine had a free slot within " + d.String() + "; retry later.", ErrorType: api.ErrorTypeWorkerUnavailable}
}

// engineLost is the error event of a stream whose engine was lost after the stream began.
func engineLost(engine string) *api.Error {
	return &api.Error{Status: http.StatusBadGateway, Type: "server_error", Code: CodeEngineLost,
		Message: "The engine " + engine + " was lost in the middle of the response.", ErrorType: api.ErrorTypeWorkerUnavailable}
}

// idleTimeout is the error event of a stream whose engine sent nothing for d after the stream
// began.
func idleTimeout(engine string, d time.Duration) *api.Error {
	return &api.Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: CodeIdleTimeout,
		Message:   "The engine " + engine + " sent nothing for " + d.String() + " (the gateway's idle timeout) in the middle of the response.",
		ErrorType: api.ErrorTypeTimeout}
}

// retryAfter returns the Retry-After value, in whole seconds (at least 1), for d.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}

// errorTypeOfStatus maps an engine's (or the gateway's) HTTP status to the error_type label
// of the GenAI request metrics; "" for success.
func errorTypeOfStatus(status int) string {
	switch {
	case status < 400:
		return api.ErrorTypeNone
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return api.ErrorTypeUnauthorized
	case status == http.StatusNotFound:
		return api.ErrorTypeNotFound
	case status == http.StatusRequestTimeout || status == http.StatusGatewayTimeout:
		return api.ErrorTypeTimeout
	case status == http.StatusRequestEntityTooLarge:
		return api.ErrorTypePayloadTooLarge
	case status == http.StatusTooManyRequests:
		return api.ErrorTypeQueueFull
	case status == api.StatusClientClosedRequest:
		return api.ErrorTypeCanceled
	case status == http.StatusServiceUnavailable || status == http.StatusBadGateway:
		return api.ErrorTypeWorkerUnavailable
	case status < 500:
		return api.ErrorTypeInvalidRequest
	}
	return api.ErrorTypeInternal
}

// errorTypeOfCode maps the code of an engine's error event (a stream that failed after it
// began) to the error_type label.
func errorTypeOfCode(code string) string {
	switch code {
	case "worker_unavailable", "shutting_down", CodeEngineLost, CodeNoEngine:
		return api.ErrorTypeWorkerUnavailable
	case "timeout", CodeIdleTimeout:
		return api.ErrorTypeTimeout
	case "canceled":
		return api.ErrorTypeCanceled
	case "queue_full":
		return api.ErrorTypeQueueFull
	}
	return api.ErrorTypeInternal
}
