package loadgen

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/corpus"
	"github.com/cacheblend/cacheblend/defaults"
)

// Defaults of Config: a run is always bounded by DefaultRequests and DefaultDuration unless
// the caller sets other bounds.
const (
	DefaultModel          = defaults.Model // "cb-llama"
	DefaultRequests       = 100
	DefaultDuration       = 5 * time.Minute
	DefaultConcurrency    = 8
	DefaultMaxTokens      = 32
	DefaultDocsPerRequest = 3
	DefaultGrace          = 30 * time.Second
	DefaultRequestTimeout = 2 * time.Minute
	DefaultHealthWait     = 30 * time.Second
	DefaultSettleTimeout  = 5 * time.Second
)

// Document is one corpus document: an ID and its text (corpus.Document).
type Document = corpus.Document

// ErrConfig is wrapped by every error Run returns for an invalid Config.
var ErrConfig = errors.New("loadgen: invalid config")

// Config configures Run. API is required; the zero value of every other field takes the
// default documented on it. Negative values are refused with ErrConfig.
type Config struct {
	// API is the engine's base URL, e.g. http://127.0.0.1:8000. Required.
	API string
	// APIKey is sent as a bearer token when set (also to /metrics when MetricsURL is unset).
	APIKey string
	// Model is the model named in requests; default DefaultModel ("cb-llama").
	Model string

	// Requests bounds the number of requests sent; default DefaultRequests (100).
	Requests int
	// Duration bounds the time during which requests are started; default DefaultDuration
	// (5 min). Requests in flight when it ends get Grace to finish.
	Duration time.Duration
	// Grace is how long requests in flight at the end of Duration may still run before they
	// are cancelled (and counted as failed, kind "canceled"); default DefaultGrace (30 s).
	Grace time.Duration
	// Concurrency is the number of workers in a closed loop, and the bound on requests in
	// flight in an open loop; default DefaultConcurrency (8).
	Concurrency int
	// Rate is the open-loop arrival rate in requests per second; 0 (the default) runs a
	// closed loop.
	Rate float64
	// Poisson draws open-loop inter-arrival times from an exponential distribution (a
	// Poisson process) instead of spacing arrivals evenly at 1/Rate. Default false.
	Poisson bool

	// MaxTokens is max_tokens of every request (sent with ignore_eos, so every successful
	// request generates exactly this many tokens); default DefaultMaxTokens (32).
	MaxTokens int
	// DocsPerRequest is how many corpus documents each prompt holds, in random order;
	// default DefaultDocsPerRequest (3). It must not exceed the corpus size.
	DocsPerRequest int
	// MaxPrefix is the largest filler prefix, in bytes (= tokens for the byte tokenizer),
	// placed before the documents; each request draws a length uniformly in [0, MaxPrefix].
	// Default 0: no filler.
	MaxPrefix int
	// Documents is the corpus; default corpus.Documents(), the repo's sample documents.
	Documents []Document
	// Seed makes the prompts reproducible: request i's prompt depends only on Seed and i.
	// Default 0.
	Seed uint64
	// Ingest posts the corpus to /v1/documents before the run. Default false.
	Ingest bool
	// NoReuse sends the cacheblend.reuse=false extension (a full prefill per request).
	NoReuse bool

	// RequestTimeout bounds one request, streaming included; default DefaultRequestTimeout
	// (2 min). It also bounds the ingest call.
	RequestTimeout time.Duration
	// HealthWait bounds the wait for GET /health to answer 200 before the run; default
	// DefaultHealthWait (30 s).
	HealthWait time.Duration

	// MetricsURL is the engine's Prometheus endpoint; default API + "/metrics".
	MetricsURL string
	// SkipServerCheck skips the /metrics cross-check (Report.Server stays nil).
	SkipServerCheck bool
	// SettleTimeout bounds how long the post-run scrape is repeated until the server has
	// counted every request sent (the server records a request just after its last byte);
	// default DefaultSettleTimeout (5 s).
	SettleTimeout time.Duration

	// Progress receives a one-line progress bar, redrawn with \r; nil for none.
	Progress io.Writer
	// HTTPClient sends every request; default a client of Run's own whose idle connections
	// are closed when Run returns. It must not have a Timeout shorter than a stream.
	HTTPClient *http.Client
}

// withDefaults validates c and fills its defaults.
func (c Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return c, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
	}
	if strings.TrimSpace(c.API) == "" {
		return bad("no engine API URL")
	}
	if !strings.HasPrefix(c.API, "http://") && !strings.HasPrefix(c.API, "https://") {
		return bad("API URL %q is not http:// or https://", c.API)
	}
	c.API = strings.TrimRight(c.API, "/")
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"requests", int64(c.Requests)}, {"duration", int64(c.Duration)}, {"grace", int64(c.Grace)},
		{"concurrency", int64(c.Concurrency)}, {"max tokens", int64(c.MaxTokens)},
		{"docs per request", int64(c.DocsPerRequest)}, {"max prefix", int64(c.MaxPrefix)},
		{"request timeout", int64(c.RequestTimeout)}, {"health wait", int64(c.HealthWait)},
		{"settle timeout", int64(c.SettleTimeout)},
	} {
		if f.v < 0 {
			return bad("%s is negative (%d)", f.name, f.v)
		}
	}
	if math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || c.Rate < 0 {
		return bad("rate %v is not a finite number ≥ 0", c.Rate)
	}
	c.Model = cmp.Or(c.Model, DefaultModel)
	c.Requests = cmp.Or(c.Requests, DefaultRequests)
	c.Duration = cmp.Or(c.Duration, DefaultDuration)
	c.Grace = cmp.Or(c.Grace, DefaultGrace)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.MaxTokens = cmp.Or(c.MaxTokens, DefaultMaxTokens)
	c.DocsPerRequest = cmp.Or(c.DocsPerRequest, DefaultDocsPerRequest)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.HealthWait = cmp.Or(c.HealthWait, DefaultHealthWait)
	c.SettleTimeout = cmp.Or(c.SettleTimeout, DefaultSettleTimeout)
	c.MetricsURL = cmp.Or(c.MetricsURL, c.API+"/metrics")
	if c.Documents == nil {
		c.Documents = corpus.Documents()
	}
	if len(c.Documents) == 0 {
		return bad("the corpus is empty")
	}
	for i, d := range c.Documents {
		if d.Text == "" {
			return bad("document %d (%q) is empty", i, d.ID)
		}
	}
	if c.DocsPerRequest > len(c.Documents) {
		return bad("%d documents per request but the corpus has %d", c.DocsPerRequest, len(c.Documents))
	}
	return c, nil
}
