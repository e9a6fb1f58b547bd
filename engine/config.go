package engine

import (
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// Defaults applied to zero fields of [Config].
const (
	DefaultAddr              = "127.0.0.1:8000"
	DefaultModelName         = "cb-llama"
	DefaultMaxBodyBytes      = 1 << 20
	DefaultMaxTokens         = 256
	DefaultRequestTimeout    = 10 * time.Minute
	DefaultReadHeaderTimeout = 10 * time.Second
)

// Config holds cb-engine's settings. The zero value is valid: every zero
// field takes its documented default.
type Config struct {
	// Addr is the listen address. Default "127.0.0.1:8000" (loopback only);
	// ":0" picks a free port (see Engine.Addr).
	Addr string
	// ModelName is the one model served; requests naming another get 404.
	// Default "cb-llama".
	ModelName string
	// APIKey, when set, is required as "Authorization: Bearer <key>" on every
	// /v1/ route (401 otherwise). /health and /metrics stay open.
	APIKey string
	// MaxBodyBytes bounds a request body (413 beyond). Default 1 MiB.
	MaxBodyBytes int64
	// MaxQueue bounds the requests waiting in the scheduler (429 beyond).
	// Default 256.
	MaxQueue int
	// MaxRunning bounds the sequences in the running batch. Default 16.
	MaxRunning int
	// StepTokenBudget bounds the tokens of one step (chunked prefill).
	// Default 512.
	StepTokenBudget int
	// LookupTimeout bounds a CacheBlend lookup before the request falls back
	// to a full prefill. Default 2 s.
	LookupTimeout time.Duration
	// RecompRatio is the CacheBlend recompute ratio sent to the worker.
	// Default 0.15.
	RecompRatio float64
	// DisableStore stops asking the worker to store prompts in the blend
	// server after their prefill (documents are always stored).
	DisableStore bool
	// DefaultMaxTokens is the output limit of a chat request without
	// max_tokens (capped by the model's positions). Completions default to
	// 16, as in the OpenAI API. Default 256.
	DefaultMaxTokens int
	// RequestTimeout bounds one request from receipt to its end (504
	// beyond). Default 10 min.
	RequestTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers. Default 10 s.
	ReadHeaderTimeout time.Duration
	// CaptureContent records prompts and completions as events of the
	// SERVER span (GenAI content capture). Off by default: no prompt or
	// completion text reaches spans, logs or metrics unless opted in
	// (cb engine --capture-content, or
	// OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true).
	CaptureContent bool
}

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.ModelName == "" {
		c.ModelName = DefaultModelName
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.DefaultMaxTokens <= 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	return c
}

// Tokenizer turns text into token ids and back. tokenizer.Tokenizer
// (byte-level, the default) implements it.
type Tokenizer interface {
	// Encode returns the ids of s, without special tokens.
	Encode(s string) []int32
	// Decode returns the text of ids; special ids are skipped.
	Decode(ids []int32) string
	// Incomplete reports how many trailing ids form an incomplete character
	// that a streaming detokenizer must hold back.
	Incomplete(ids []int32) int
}

// Deps are the engine's collaborators. Only Worker is required.
type Deps struct {
	// Worker is the cb-worker client that executes the steps. Required.
	Worker cbv1.WorkerServiceClient
	// Blend is the blend server client for CacheBlend lookups; nil disables
	// reuse lookups and the storing of prompts.
	Blend cbv1.BlendServiceClient
	// TracerProvider records the engine's spans; nil records none. Head
	// sampling is its sampler's.
	TracerProvider trace.TracerProvider
	// Profile, when set, receives one JSONL line per engine span (CB_PROFILE;
	// the ProfileWriter of telemetry/provider's Provider).
	Profile io.Writer
	// Registerer receives the engine's instruments; nil: a private registry.
	Registerer prometheus.Registerer
	// Gatherer is served on /metrics; nil: Registerer when it is also a
	// Gatherer (a *prometheus.Registry), else the private registry.
	Gatherer prometheus.Gatherer
	// Logger receives the per-request JSON lines and warnings; nil: a
	// telemetry.NewLogHandler JSON logger on stderr.
	Logger *slog.Logger
	// Tokenizer; nil: tokenizer.Tokenizer (byte-level).
	Tokenizer Tokenizer
}
