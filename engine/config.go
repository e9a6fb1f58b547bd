package engine

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/engine/scheduler"
	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/modelfile"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// Defaults applied to zero fields of [Config] (the HTTP settings' are httpfront's).
const (
	DefaultAddr        = "127.0.0.1:8000"
	DefaultMaxTokens   = 256
	DefaultHandoffIdle = 30 * time.Second
	// DefaultHandoffConnect is the default of Config.HandoffConnectTimeout.
	DefaultHandoffConnect = time.Second
	// DefaultMaxHandoffsPerPeer is the default of Config.MaxHandoffsPerPeer.
	DefaultMaxHandoffsPerPeer = 8
)

// Config holds cb-engine's settings. The zero value is valid: every zero
// field takes its documented default. A Config is a plain value, read once
// by New.
type Config struct {
	// Config holds the scheduler's settings, promoted: Model (the one model
	// served; requests naming another get 404; default defaults.Model,
	// "cb-llama"), MaxQueue (429 beyond it), MaxRunning, StepTokenBudget,
	// LookupTimeout, RecompRatio, DisableStore and the scheduler's timeouts,
	// each with the default documented in package scheduler.
	scheduler.Config
	// Addr is the listen address. Default "127.0.0.1:8000" (loopback only);
	// ":0" picks a free port (see Engine.Addr).
	Addr string
	// DefaultMaxTokens is the output limit of a chat request without
	// max_tokens (capped by the model's positions). Completions default to
	// 16, as in the OpenAI API. Default 256.
	DefaultMaxTokens int
	// Settings are the API's key, body bound, request timeout and server
	// limits (connections, timeouts), each with httpfront's default.
	httpfront.Settings
	// Role is the engine's part in prefill/decode disaggregation
	// (docs/design.md §9): RoleBoth (default) serves every request whole;
	// RolePrefill also hands requests naming a decode engine
	// (X-CB-Decode-Engine) over after their first token; RoleDecode also
	// takes over requests a prefill engine hands over (X-CB-Handoff).
	Role string
	// WorkerAdvertise is the address of this engine's worker as the decode
	// engines' workers reach it (host:port; they read the handed-over KV
	// from its KVTransferService). Required with RolePrefill. A loopback
	// address is never sent to a decode engine on another host: such a
	// hand-over is refused (500 handoff_misconfigured, with the fix).
	WorkerAdvertise string
	// HandoffIdleTimeout bounds the silence of a decode engine under a
	// hand-over (RolePrefill): no byte of its answer for this long (the
	// wait for its response headers included, so a non-streamed answer
	// must begin within it) aborts the hand-over: before anything was
	// relayed the caller gets 503 decode_unavailable (the gateway retries
	// with another decode engine, or serves the request whole), a stream
	// already relayed ends with an error event. The hand-over's overall
	// deadline is the request's (RequestTimeout). Default 30 s.
	HandoffIdleTimeout time.Duration
	// HandoffConnectTimeout bounds the connection to a decode engine
	// (RolePrefill, with the default HTTPClient): a decode host that does
	// not answer is given up within it (503 decode_unavailable: the gateway
	// serves the request whole on a prefill engine). Default 1 s. A
	// gateway's --upstream-idle-timeout must exceed this plus
	// HandoffIdleTimeout, or the gateway gives up on the prefill engine
	// first.
	HandoffConnectTimeout time.Duration
	// StackKey is the stack's shared secret (at least api.MinStackKeyBytes;
	// cb engine --stack-key-file or CB_STACK_KEY, never a flag's value):
	// a prefill engine signs each hand-over with it (api.Handoff.Sign, bound
	// to the request id, the prefill worker, the prompt's length and digest,
	// the first token, the decode engine and an expiry) and honours
	// X-CB-Decode-Engine only with the gateway's proof made with it
	// (api.HeaderDecodeAuth); a decode engine takes over only hand-overs
	// that verify with it. Required by RolePrefill and RoleDecode: without
	// it both headers are refused (403 handoff_unauthenticated).
	StackKey []byte
	// DecodeEngines is the allow-list of a prefill engine: the decode
	// engines' base URLs (http://host:port) X-CB-Decode-Engine may name;
	// any other is refused (403 decode_engine_not_allowed). Empty: none.
	DecodeEngines []string
	// MaxHandoffsPerPeer bounds the hand-overs in flight to one decode
	// engine (each holds its prompt's KV blocks until the decode engine
	// pulled them or the hand-over ended): beyond, a request naming that
	// decode engine gets 503 handoff_peer_busy with Retry-After, so a
	// decode engine that stops answering pins at most this many prompts'
	// blocks. Default 8.
	MaxHandoffsPerPeer int
	// HandoffSources, when not empty, lists the prefill workers (host:port,
	// as their engines advertise them) a decode engine takes requests over
	// from; a hand-over naming another is refused (400). Empty: any.
	HandoffSources []string
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
	if c.Model == "" {
		c.Model = scheduler.DefaultModel
	}
	if c.DefaultMaxTokens <= 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.Role == "" {
		c.Role = RoleBoth
	}
	if c.HandoffIdleTimeout <= 0 {
		c.HandoffIdleTimeout = DefaultHandoffIdle
	}
	if c.HandoffConnectTimeout <= 0 {
		c.HandoffConnectTimeout = DefaultHandoffConnect
	}
	if c.MaxHandoffsPerPeer <= 0 {
		c.MaxHandoffsPerPeer = DefaultMaxHandoffsPerPeer
	}
	c.Settings = c.Settings.WithDefaults()
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

// Deps are the engine's collaborators: the process-wide ones of
// component.Deps and its peers. Only Worker is required.
type Deps struct {
	// Deps are the tracer provider (the engine's spans; head sampling is its
	// sampler's), the registerer of the engine's instruments, the logger of
	// the per-request JSON lines and warnings, and the span profile
	// (CB_PROFILE), each with the default of component.Deps.WithDefaults.
	component.Deps
	// Worker is the cb-worker client that executes the steps. Required.
	Worker cbv1.WorkerServiceClient
	// Blend is the blend server client for CacheBlend lookups; nil disables
	// reuse lookups and the storing of prompts.
	Blend cbv1.BlendServiceClient
	// Gatherer is served on /metrics; nil: the Registerer when it is also a
	// Gatherer (a *prometheus.Registry, the default one included).
	Gatherer prometheus.Gatherer
	// Tokenizer; nil: the model file's (ModelFile.Vocab), else
	// tokenizer.Tokenizer (byte-level, the built-in model's).
	Tokenizer Tokenizer
	// ModelFile is the GGUF model file the engine serves (the worker must
	// report the same identity; see scheduler.Config.ModelIdentity): it
	// gives the tokenizer, the chat template, BOS and the served name
	// (Config.Model, unless set). nil: the built-in model. The caller keeps
	// it open while the engine runs.
	ModelFile *modelfile.File
	// HTTPClient makes a prefill engine's calls to decode engines; nil: a
	// client with Config.HandoffConnectTimeout to connect and TCP keep-alive
	// probes (a decode host that stopped answering is noticed in about
	// 15 s); the request's RequestTimeout and Config.HandoffIdleTimeout
	// bound each call. The engine uses a copy that follows no redirect (a
	// 3xx answer is 503 decode_unavailable).
	HTTPClient *http.Client
}
