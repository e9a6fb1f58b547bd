package engine

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/scheduler"
)

// shuttingDown is the 503 of a request refused during shutdown.
func shuttingDown() *api.Error {
	return &api.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down",
		Message: "The server is shutting down.", ErrorType: api.ErrorTypeWorkerUnavailable}
}

// submitError maps a Submit failure to its API error.
func (e *Engine) submitError(err error, param string) *api.Error {
	switch {
	case errors.Is(err, scheduler.ErrQueueFull):
		queue := e.cfg.MaxQueue
		if queue <= 0 {
			queue = scheduler.DefaultMaxQueue
		}
		return api.QueueFull(queue).WithRetryAfterDuration(e.drain.retryAfter(e.sched.Stats().Waiting, time.Now()))
	case errors.Is(err, scheduler.ErrWorkerUnavailable):
		return api.WorkerUnavailable("it has not answered yet")
	case errors.Is(err, scheduler.ErrShutdown):
		return shuttingDown()
	case errors.Is(err, scheduler.ErrTooLong):
		return api.BadRequestCode(param, api.CodeContextLengthExceeded, "The request does not fit the model: %v.", unwrapMsg(err))
	case errors.Is(err, scheduler.ErrBadRequest):
		return api.BadRequestCode(param, api.CodeInvalidValue, "%v.", unwrapMsg(err))
	default:
		return api.Internal(err.Error())
	}
}

// unwrapMsg drops the "scheduler: " prefix of scheduler errors.
func unwrapMsg(err error) string {
	const p = "scheduler: "
	s := err.Error()
	if len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

// resultError maps a failed or unfinished request to its API error.
func resultError(r *http.Request, reqCtx context.Context, res scheduler.Result) (*api.Error, error) {
	ctxErr := func() (*api.Error, error) {
		if r.Context().Err() == nil && errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
			return api.Timeout("it ran past the request timeout"), reqCtx.Err()
		}
		return api.Canceled(), context.Canceled
	}
	if !res.Done {
		return ctxErr()
	}
	var we *scheduler.WorkerError
	switch err := res.Err; {
	case errors.Is(err, scheduler.ErrCanceled):
		return ctxErr()
	case errors.Is(err, scheduler.ErrWorkerUnavailable):
		return api.WorkerUnavailable("a step failed"), err
	case errors.Is(err, scheduler.ErrShutdown):
		return shuttingDown(), err
	case errors.Is(err, scheduler.ErrStoreTimeout):
		return api.Timeout("the store was not confirmed"), err
	case errors.Is(err, scheduler.ErrHandoff):
		return &api.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "kv_transfer_failed",
			Message: "The prompt's KV could not be pulled from the prefill engine's worker: " +
				strings.TrimPrefix(err.Error(), scheduler.ErrHandoff.Error()+": "),
			ErrorType: api.ErrorTypeWorkerUnavailable}, err
	case errors.As(err, &we):
		return api.Internal(we.Msg), err
	default:
		return api.Internal(err.Error()), err
	}
}
