package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

func init() { subcommands = append(subcommands, newCheckCmd) }

// errCheckFailed makes cb check exit 1 after printing its report.
var errCheckFailed = errors.New("some traces do not match the contract")

func newCheckCmd() *cobra.Command {
	var (
		queryURL, file, service, requestID string
		traceIDs                           []string
		limit                              int
		lookback                           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Validate captured traces against contract/spans.yaml (from a Jaeger-compatible query API or an OTLP JSON file)",
		RunE: func(c *cobra.Command, _ []string) error {
			spec, err := contract.Spans()
			if err != nil {
				return err
			}
			var traces []tracecheck.Trace
			switch {
			case file != "":
				data, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				if traces, err = tracecheck.Parse(data); err != nil {
					return fmt.Errorf("%s: %w", file, err)
				}
			default:
				q := jaeger.Query{Service: service, Limit: limit, TraceIDs: traceIDs}
				if requestID != "" {
					q.Tags = map[string]string{"request_id": requestID}
				}
				if lookback > 0 {
					q.Start = time.Now().Add(-lookback)
				}
				cl, err := jaeger.NewClient(queryURL, jaeger.ClientConfig{HTTPClient: &http.Client{Timeout: 30 * time.Second}})
				if err != nil {
					return err
				}
				if traces, err = tracecheck.FromQuery(c.Context(), cl, q); err != nil {
					return err
				}
			}
			rep := tracecheck.Check(traces, spec)
			if _, err := rep.WriteTo(c.OutOrStdout()); err != nil {
				return err
			}
			if !rep.OK() {
				return errCheckFailed
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&queryURL, "url", "http://127.0.0.1:16686", "Jaeger-compatible query API (the embedded collector or Jaeger)")
	f.StringVar(&file, "file", "", "read traces from an OTLP JSON (or Jaeger JSON) file instead")
	f.StringVar(&service, "service", "cb-engine", "service whose traces are checked")
	f.StringVar(&requestID, "request-id", "", "only the trace of this request_id")
	f.StringSliceVar(&traceIDs, "trace-id", nil, "only these trace ids")
	f.IntVar(&limit, "limit", 20, "most traces fetched")
	f.DurationVar(&lookback, "lookback", time.Hour, "only traces that started within this duration")
	return withEnv(cmd)
}
