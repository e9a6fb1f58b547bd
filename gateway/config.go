package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/modelfile"
)

// Routing policies (Config.Policy, the route.policy attribute and the policy label).
const (
	PolicyKVAware     = "kv-aware"
	PolicyLeastLoaded = "least-loaded"
	PolicyRoundRobin  = "round-robin"
)

// Policies lists the built-in routing policies, the default first.
func Policies() []string { return []string{PolicyKVAware, PolicyLeastLoaded, PolicyRoundRobin} }

// Defaults applied to zero fields of [Config] (the HTTP settings' are httpfront's).
const (
	DefaultAddr            = "127.0.0.1:8080"
	DefaultPolicy          = PolicyKVAware
	DefaultAlpha           = 0.1
	DefaultSpreadMargin    = 4.0
	DefaultMaxInFlight     = 128
	DefaultMaxQueue        = 512
	DefaultQueueTimeout    = 30 * time.Second
	DefaultHealthInterval  = time.Second
	DefaultProbeTimeout    = 2 * time.Second
	DefaultHealthFailures  = 3
	DefaultIdleTimeout     = 60 * time.Second
	DefaultKeepAlive       = 10 * time.Second
	DefaultIndexBytes      = 64 << 20
	DefaultIndexSequences  = 16384
	DefaultMaxBufferedBody = 16 << 20
)

// Config holds the gateway's settings. Every zero field takes its documented default; Engines
// is required. A Config is a plain value, read once by New.
type Config struct {
	// Addr is the listen address of the OpenAI API (also /metrics and /health). Default
	// "127.0.0.1:8080"; ":0" picks a free port (see Gateway.Addr).
	Addr string
	// Engines are the base URLs of the engines to forward to ("http://127.0.0.1:8000"; a bare
	// host:port gets http://). At least one, unless Prefill and Decode are given; no
	// duplicates.
	Engines []string
	// Prefill and Decode, given together instead of Engines, route with prefill/decode
	// disaggregation (docs/design.md §9): a generation request goes to a prefill engine
	// (cb engine --role prefill), chosen by Policy like Engines (the CacheBlend reuse happens
	// there), with header X-CB-Decode-Engine naming a decode engine (--role decode), the least
	// loaded of the healthy ones; a 503 decode_unavailable before anything was streamed is
	// retried with another decode engine. Document ingests and /v1/models go to the prefill
	// engines. After New, Engines holds the prefill engines.
	Prefill, Decode []string
	// Policy is the routing policy: PolicyKVAware (default), PolicyLeastLoaded or
	// PolicyRoundRobin. Deps.Policy, when set, replaces it.
	Policy string
	// Alpha is the weight of an engine's load against the fraction of the prompt it is
	// expected to reuse in the kv-aware score: score = expected_hit_tokens/prompt_tokens −
	// Alpha·load. Default 0.1: a fully reused prompt outweighs ten requests of load.
	Alpha float64
	// SpreadMargin is the load (in requests) by which the kv-aware choice may exceed the least
	// loaded engine before the request is spread to a less loaded one. Default 4: a queue
	// imbalance of a few requests costs less than recomputing a prompt that is held.
	SpreadMargin float64
	// MaxInFlight caps the requests the gateway has in flight on one engine; beyond it, a
	// request waits in the gateway's queue. Default 128.
	MaxInFlight int
	// MaxQueue bounds the requests waiting for an engine slot; beyond it a request gets 429
	// with Retry-After. Default 512.
	MaxQueue int
	// QueueTimeout bounds the wait in the queue (then 503 with Retry-After). Default 30 s.
	QueueTimeout time.Duration
	// HealthInterval is the period of the health checks (GET /health and /metrics of every
	// engine). Default 1 s.
	HealthInterval time.Duration
	// ProbeTimeout bounds one health probe (each of its GET /health and GET /metrics), apart
	// from the interval: a probe slower than it counts as a failure. Default 2 s.
	ProbeTimeout time.Duration
	// HealthFailures is the number of consecutive failed health probes that take an engine
	// out of routing (one passing probe brings it back). A failed attempt (unreachable, 503,
	// idle) takes it out at once. Default 3: one slow probe of a busy engine does not.
	HealthFailures int
	// IdleTimeout bounds the silence of an engine under an attempt: no byte of its answer for
	// this long (the wait for its response headers included, so a non-streamed answer must
	// begin within it) aborts the attempt: before anything was written to the client it fails
	// over (counted as reason "unreachable"); a stream already relayed ends with an error event (code
	// upstream_idle_timeout) and data: [DONE]. It is also the stall window: an engine taken
	// out of routing keeps the attempts that received a byte within the last
	// HealthFailures×HealthInterval and cuts (fails over) the others. Default 60 s (nginx's
	// proxy_read_timeout). The attempt's overall deadline is the request's (RequestTimeout).
	IdleTimeout time.Duration
	// KeepAlive is the period of the SSE comment line ": keep-alive" the gateway writes to a
	// client whose relayed stream has been silent that long (the engine silent but within
	// IdleTimeout), so that no proxy or client in between sees a dead connection. Default
	// 10 s.
	KeepAlive time.Duration
	// IndexBytes and IndexSequences bound each engine's reuse index (the prompts and documents
	// routed there): beyond either, the least recently used registrations are evicted.
	// Defaults 64 MiB and 16384.
	IndexBytes, IndexSequences int
	// ChunkSize is the chunk of the reuse index in tokens (the engines' chunk). Default
	// defaults.ChunkSize (256).
	ChunkSize int
	// Model names the chunk keys of the reuse index. Default defaults.Model.
	Model string
	// EngineAPIKey, when set, is sent to the engines as "Authorization: Bearer <key>";
	// otherwise the client's Authorization header is forwarded as it came.
	EngineAPIKey string
	// StackKey is the stack's shared secret (cb gateway --stack-key-file or CB_STACK_KEY):
	// with prefill/decode routing, every X-CB-Decode-Engine the gateway sets carries its
	// proof (X-CB-Decode-Auth, api.DecodeAuth), without which a prefill engine refuses the
	// hand-over. Without it no proof is sent (cb gateway refuses --prefill/--decode without
	// a key).
	StackKey []byte
	// MaxBufferedBody is the largest non-streamed engine response the gateway holds back
	// until it is complete (so that an engine lost in the middle can still be failed over);
	// a larger one is streamed through. Default 16 MiB.
	MaxBufferedBody int64
	// Settings are the API's key, body bound, request timeout (queue and attempts included)
	// and server limits, as engine.Config's, each with httpfront's default.
	httpfront.Settings
}

// withDefaults returns c with defaults applied and the engine URLs normalized, or an error.
func (c Config) withDefaults() (Config, error) {
	c.Addr = cmp.Or(c.Addr, DefaultAddr)
	c.Policy = cmp.Or(c.Policy, DefaultPolicy)
	if !slices.Contains(Policies(), c.Policy) {
		return c, fmt.Errorf("gateway: policy %q is not one of %s", c.Policy, strings.Join(Policies(), ", "))
	}
	defaults.Positive(&c.Alpha, DefaultAlpha)
	defaults.Positive(&c.SpreadMargin, DefaultSpreadMargin)
	defaults.Positive(&c.MaxInFlight, DefaultMaxInFlight)
	defaults.Positive(&c.MaxQueue, DefaultMaxQueue)
	defaults.Positive(&c.QueueTimeout, DefaultQueueTimeout)
	defaults.Positive(&c.HealthInterval, DefaultHealthInterval)
	defaults.Positive(&c.ProbeTimeout, DefaultProbeTimeout)
	defaults.Positive(&c.HealthFailures, DefaultHealthFailures)
	defaults.Positive(&c.IdleTimeout, DefaultIdleTimeout)
	defaults.Positive(&c.KeepAlive, DefaultKeepAlive)
	defaults.Positive(&c.IndexBytes, DefaultIndexBytes)
	defaults.Positive(&c.IndexSequences, DefaultIndexSequences)
	defaults.Positive(&c.ChunkSize, defaults.ChunkSize)
	c.Model = cmp.Or(c.Model, defaults.Model)
	defaults.Positive(&c.MaxBufferedBody, DefaultMaxBufferedBody)
	c.Settings = c.Settings.WithDefaults()
	if len(c.Prefill) > 0 || len(c.Decode) > 0 {
		switch {
		case len(c.Engines) > 0:
			return c, errors.New("gateway: give either engines or prefill and decode engines, not both")
		case len(c.Prefill) == 0 || len(c.Decode) == 0:
			return c, errors.New("gateway: prefill/decode routing needs at least one prefill and one decode engine")
		}
		c.Engines = c.Prefill
	}
	if len(c.Engines) == 0 {
		return c, errors.New("gateway: at least one engine URL is required")
	}
	var seen []string
	norm := func(list []string) ([]string, error) {
		out := make([]string, 0, len(list))
		for _, e := range list {
			u, err := normalizeEngineURL(e)
			if err != nil {
				return nil, err
			}
			if slices.Contains(seen, u) {
				return nil, fmt.Errorf("gateway: engine %s given twice", u)
			}
			seen = append(seen, u)
			out = append(out, u)
		}
		return out, nil
	}
	var err error
	if c.Engines, err = norm(c.Engines); err != nil {
		return c, err
	}
	if len(c.Decode) > 0 {
		c.Prefill = c.Engines
		if c.Decode, err = norm(c.Decode); err != nil {
			return c, err
		}
	}
	return c, nil
}

// normalizeEngineURL turns "host:port" or "http://host:port[/]" into "http://host:port".
func normalizeEngineURL(s string) (string, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("gateway: engine URL %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("gateway: engine URL %q: want http(s)://host:port[/path]", s)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// Deps are the gateway's collaborators: the process-wide ones of component.Deps, and optional
// replacements for tests and extensions.
type Deps struct {
	// Deps are the tracer provider (the gateway's spans; head sampling is its sampler's), the
	// registerer of the gateway's instruments, the logger of the per-request JSON lines and
	// the span profile, each with the default of component.Deps.WithDefaults.
	component.Deps
	// Gatherer is served on /metrics; nil: the Registerer when it is also a Gatherer.
	Gatherer prometheus.Gatherer
	// ModelFile is the GGUF model file the engines serve (cb gateway --model): its tokenizer
	// and chat template give the prompts' tokens the KV-aware policy matches, as the engines
	// build them. nil: the built-in model's byte tokens.
	ModelFile *modelfile.File
	// Transport carries the requests to the engines (forwarding and health checks); nil: a
	// transport of its own with keep-alive connections to every engine and TCP keep-alive
	// probes (an engine whose host stopped answering is noticed in about 15 s, under
	// IdleTimeout, even while its answer is legitimately silent).
	Transport http.RoundTripper
	// Policy, when set, replaces the built-in policy named by Config.Policy: the extension
	// point for other routing (e.g. prefill/decode disaggregation, whose policy sets the decode
	// engine in Decision.Header). Its Name is the route.policy attribute and, when it is not
	// a built-in name, the metrics' policy label records the request as Config.Policy.
	Policy Policy
}
