package main

import (
	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/loadgen"
)

func init() { subcommands = append(subcommands, newLoadCmd) }

func newLoadCmd() *cobra.Command {
	var (
		cfg      loadgen.Config
		jsonPath string
		quiet    bool
	)
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Send RAG-style load to an engine and cross-check client-side TTFT/TPOT against its /metrics",
		Long: `Send streamed chat completions to a running engine: each prompt is a random subset of the sample
documents (corpus/docs) in random order, after a random-length filler prefix so the documents land at
arbitrary offsets, then a question. Closed loop (--rate 0: --concurrency workers back to back) or open
loop (--rate requests/s with at most --concurrency in flight). A run is always bounded by --requests and
--duration. Every request carries its own W3C traceparent (trace ids are in the --json report).

The report gives client-side TTFT, TPOT and end-to-end percentiles (p50, p90, p95, p99, max) beside the
server's, estimated with histogram_quantile from the deltas of /metrics scraped before and after the run,
the number of requests the server counted against the number sent, and whether the client TTFT p95 lies
within one bucket of the server's. The exit status is 1 when a request failed, the server's count
differs, or /metrics could not be read (unless --no-server-check).`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			ctx, stop := untilSignal(c.Context())
			defer stop()
			if !quiet {
				cfg.Progress = c.ErrOrStderr()
			}
			rep, err := loadgen.Run(ctx, cfg)
			if rep == nil {
				return err
			}
			out := c.OutOrStdout()
			if jsonPath == "-" { // stdout holds the JSON; the table goes to stderr
				out = c.ErrOrStderr()
			}
			rep.Print(out)
			if jsonPath != "" {
				if werr := rep.WriteJSON(jsonPath); werr != nil {
					return werr
				}
			}
			if err != nil {
				return err
			}
			return rep.Err()
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.API, "api", "http://127.0.0.1:8000", "engine base URL")
	f.StringVar(&cfg.APIKey, "api-key", "", "bearer token for the engine's API")
	f.StringVar(&cfg.Model, "model", loadgen.DefaultModel, "model named in the requests")
	f.IntVar(&cfg.Requests, "requests", loadgen.DefaultRequests, "requests to send at most")
	f.DurationVar(&cfg.Duration, "duration", loadgen.DefaultDuration, "time to send requests at most (in-flight requests then get --grace)")
	f.DurationVar(&cfg.Grace, "grace", loadgen.DefaultGrace, "time requests in flight at the end of --duration may still run")
	f.IntVar(&cfg.Concurrency, "concurrency", loadgen.DefaultConcurrency, "closed-loop workers, or the open loop's in-flight limit")
	f.Float64Var(&cfg.Rate, "rate", 0, "open-loop arrival rate in requests/s (0: closed loop)")
	f.BoolVar(&cfg.Poisson, "poisson", false, "open loop: Poisson arrivals instead of evenly spaced ones")
	f.IntVar(&cfg.MaxTokens, "max-tokens", loadgen.DefaultMaxTokens, "tokens generated per request (ignore_eos)")
	f.IntVar(&cfg.DocsPerRequest, "docs", loadgen.DefaultDocsPerRequest, "sample documents per prompt")
	f.IntVar(&cfg.MaxPrefix, "prefix-max", 64, "largest filler prefix before the documents, in bytes (0: none)")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the prompts and of Poisson arrivals")
	f.BoolVar(&cfg.Ingest, "ingest", false, "POST the documents to /v1/documents before the run")
	f.BoolVar(&cfg.NoReuse, "no-reuse", false, "send cacheblend.reuse=false (full prefill baseline)")
	f.DurationVar(&cfg.RequestTimeout, "request-timeout", loadgen.DefaultRequestTimeout, "bound on one request")
	f.StringVar(&cfg.MetricsURL, "metrics-url", "", "engine Prometheus endpoint (default: <api>/metrics)")
	f.BoolVar(&cfg.SkipServerCheck, "no-server-check", false, "do not read /metrics nor cross-check")
	f.StringVar(&jsonPath, "json", "", "also write the report as JSON to this file (- for stdout)")
	f.BoolVar(&quiet, "quiet", false, "no progress bar on stderr")
	return withEnv(cmd)
}
