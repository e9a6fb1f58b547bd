package scheduler

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

// Defaults applied to zero fields of [Config].
const (
	DefaultMaxQueue            = 256
	DefaultMaxRunning          = 16
	DefaultStepTokenBudget     = 512
	DefaultLoneBlendTokens     = 8192
	DefaultLookupTimeout       = 2 * time.Second
	DefaultMaxLookupRPCs       = 8
	DefaultStepTimeout         = 60 * time.Second
	DefaultWorkerRetryInterval = 100 * time.Millisecond
	DefaultInfoTimeout         = 2 * time.Second
	DefaultStoreTimeout        = 60 * time.Second
	DefaultStorePollInterval   = 20 * time.Millisecond
	DefaultMaxTransfers        = 4
	DefaultHandoffTimeout      = 60 * time.Second
	DefaultRecompRatio         = defaults.RecompRatio // 0.15
	DefaultModel               = defaults.Model       // "cb-llama"
)

// Config holds the scheduler's limits. The zero value is valid: every zero
// field takes the default named after it.
type Config struct {
	// Model names the served model in lookups and on cb.request. Default
	// "cb-llama".
	Model string
	// ModelIdentity is the identity of the engine's model file
	// (modelfile.File.Identity; empty for the built-in model). The
	// scheduler pairs only with a worker that reports the same identity:
	// another one is treated as unavailable, with a warning naming both.
	ModelIdentity string
	// ModelFileName is the engine's model file's name (its general.name),
	// for that warning; empty: the file is named by its identity alone.
	ModelFileName string
	// MaxQueue bounds the waiting requests; Submit refuses more with
	// ErrQueueFull. Default 256.
	MaxQueue int
	// MaxRunning bounds the sequences in the running batch. Default 16.
	MaxRunning int
	// StepTokenBudget bounds the tokens computed in one step; a longer
	// prompt is prefilled in chunks across steps. Default 512.
	StepTokenBudget int
	// LoneBlendTokens is how many tokens of a CacheBlend prefill that runs
	// alone in its step (no other sequence running) the step may take
	// whatever the budget, within the worker's limit: splitting a blended
	// forward costs more than its compute (each part loads its KV, selects
	// its own important tokens and attends to the whole context). Otherwise
	// a token the plan reuses is charged its share of the forward against
	// StepTokenBudget. Default 8192; negative: no exception, a lone blended
	// prefill is chunked by the budget like any other.
	LoneBlendTokens int
	// LookupTimeout bounds a CacheBlend lookup from Submit to its result,
	// waiting for a free call slot included; it is the Lookup call's deadline. Past it the request falls
	// back to a full prefill (reason "timeout"). Default 2 s.
	LookupTimeout time.Duration
	// MaxLookupRPCs bounds the Lookup calls in flight; further requests wait
	// for a slot (within their LookupTimeout). Default 8.
	MaxLookupRPCs int
	// StepTimeout bounds one Execute call. Default 60 s.
	StepTimeout time.Duration
	// WorkerRetryInterval is the period of Info probes while the worker is
	// unavailable. Default 100 ms: with the bounded reconnect of rpc.Dial
	// (a failed probe redials at once), the engine serves again well within
	// a second of its worker's return.
	WorkerRetryInterval time.Duration
	// InfoTimeout bounds one Info call. Default 2 s.
	InfoTimeout time.Duration
	// StoreTimeout bounds the wait for the worker's report that a store is
	// done; past it the blocks are released anyway (and a document ingest
	// fails). Default 60 s.
	StoreTimeout time.Duration
	// StorePollInterval is the period of empty steps sent, while the engine
	// is otherwise idle, to collect store reports. Default 20 ms.
	StorePollInterval time.Duration
	// RecompRatio is the CacheBlend recompute ratio put in CB plans.
	// Default 0.15.
	RecompRatio float64
	// MaxTransfers bounds the KV pulls of Prefilled requests in flight;
	// further ones wait in the queue. Default 4.
	MaxTransfers int
	// HandoffTimeout bounds how long the blocks of a handed-over request
	// (Request.HandoffSecret) stay held for the decode side's read when the
	// worker does not report the keep's end. It should exceed the worker's
	// keep timeout (30 s by default). Default 60 s.
	HandoffTimeout time.Duration
	// DisableStore stops asking the worker to store prompts in the blend
	// server after their prefill (documents are always stored). Prompts are
	// stored by default when a blend client is configured.
	DisableStore bool
}

func (c Config) withDefaults() Config {
	if c.Model == "" {
		c.Model = DefaultModel
	}
	defaults.Positive(&c.MaxQueue, DefaultMaxQueue)
	defaults.Positive(&c.MaxRunning, DefaultMaxRunning)
	defaults.Positive(&c.StepTokenBudget, DefaultStepTokenBudget)
	if c.LoneBlendTokens == 0 { // negative: no exception
		c.LoneBlendTokens = DefaultLoneBlendTokens
	}
	defaults.Positive(&c.MaxLookupRPCs, DefaultMaxLookupRPCs)
	defaults.Positive(&c.MaxTransfers, DefaultMaxTransfers)
	defaults.Positive(&c.HandoffTimeout, DefaultHandoffTimeout)
	defaults.Positive(&c.LookupTimeout, DefaultLookupTimeout)
	defaults.Positive(&c.StepTimeout, DefaultStepTimeout)
	defaults.Positive(&c.WorkerRetryInterval, DefaultWorkerRetryInterval)
	defaults.Positive(&c.InfoTimeout, DefaultInfoTimeout)
	defaults.Positive(&c.StoreTimeout, DefaultStoreTimeout)
	defaults.Positive(&c.StorePollInterval, DefaultStorePollInterval)
	if c.RecompRatio <= 0 || c.RecompRatio > 1 {
		c.RecompRatio = DefaultRecompRatio
	}
	return c
}

// Deps are the scheduler's collaborators.
type Deps struct {
	// Worker executes the steps. Required.
	Worker cbv1.WorkerServiceClient
	// Blend is the blend server for CacheBlend lookups; nil disables reuse
	// lookups (and the storing of prompts).
	Blend cbv1.BlendServiceClient
	// Spans records the cb.* spans; nil records none.
	Spans *telemetry.Spans
	// Logger receives warnings (never while a lock is held); nil discards.
	Logger *slog.Logger
	// OnFallback is called (outside any lock) with the reason — "error",
	// "timeout", "unavailable" or "queue_full" — each time a request is scheduled without
	// its lookup result. Optional.
	OnFallback func(reason string)
}

// Errors returned by [Scheduler.Submit] and through [Result.Err].
var (
	// ErrQueueFull: MaxQueue requests are already waiting.
	ErrQueueFull = errors.New("scheduler: queue full")
	// ErrWorkerUnavailable: the worker has not answered Info yet, or an
	// Execute call failed (every request in flight fails with it).
	ErrWorkerUnavailable = errors.New("scheduler: worker unavailable")
	// ErrShutdown: the scheduler is shutting down.
	ErrShutdown = errors.New("scheduler: shutting down")
	// ErrCanceled: the request's context ended before it finished.
	ErrCanceled = errors.New("scheduler: request canceled")
	// ErrTooLong: the request can never fit the KV pool or the model's
	// positions.
	ErrTooLong = errors.New("scheduler: request exceeds the model's capacity")
	// ErrBadRequest: the request itself is invalid (empty prompt, token out
	// of the vocabulary, no token budget).
	ErrBadRequest = errors.New("scheduler: invalid request")
	// ErrStoreTimeout: a document's store was not reported done within
	// StoreTimeout.
	ErrStoreTimeout = errors.New("scheduler: store not confirmed in time")
	// ErrHandoff: the KV pull of a Prefilled request failed.
	ErrHandoff = errors.New("scheduler: KV hand-over failed")
)

// WorkerError is a failure the worker reported for one sequence
// (SeqOutput.error), or a protocol violation in its answer.
type WorkerError struct {
	RequestID string
	Msg       string
}

// Error implements error.
func (e *WorkerError) Error() string {
	return fmt.Sprintf("scheduler: worker failed request %s: %s", e.RequestID, e.Msg)
}
