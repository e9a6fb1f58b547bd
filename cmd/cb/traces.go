package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/service"
	"github.com/cacheblend/cacheblend/tracestore"
)

func init() { subcommands = append(subcommands, newTracesCmd) }

func newTracesCmd() *cobra.Command {
	var cfg tracestore.Config
	var metricsAddr string
	cmd := &cobra.Command{
		Use:   "traces",
		Short: "Run the embedded trace collector: OTLP/HTTP receiver, Jaeger-compatible query API and the trace page",
		RunE: func(c *cobra.Command, _ []string) error {
			ctx := c.Context()
			rt, err := service.New(ctx, service.Options{ServiceName: "cb-traces"})
			if err != nil {
				return err
			}
			col, err := startCollector(ctx, cfg, rt.Deps())
			if err != nil {
				return err
			}
			maddr, err := rt.ServeMetrics(metricsAddr, nil)
			if err != nil {
				_ = col.Shutdown(ctx)
				return err
			}
			rt.Logger.Info("trace collector started", "otlp", "http://"+col.OTLPAddr()+"/v1/traces", "ui", "http://"+col.QueryAddr()+"/", "metrics", "http://"+maddr.String()+"/metrics")
			announce("cb-traces", "otlp", "http://"+col.OTLPAddr()+"/v1/traces", "ui", "http://"+col.QueryAddr()+"/", "metrics", "http://"+maddr.String()+"/metrics")
			return runUntilSignal(ctx, rt, col)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.OTLPAddr, "otlp-addr", tracestore.DefaultOTLPAddr, "OTLP/HTTP receiver address (POST /v1/traces)")
	f.StringVar(&metricsAddr, "metrics-addr", "127.0.0.1:0", "address of the collector's own /metrics and /health (Go runtime, process, build info)")
	f.StringVar(&cfg.QueryAddr, "ui-addr", tracestore.DefaultQueryAddr, "query API and web page address")
	f.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", tracestore.DefaultMaxBodyBytes, "largest OTLP request body, before and after decompression")
	f.IntVar(&cfg.MaxTraces, "max-traces", tracestore.DefaultMaxTraces, "traces kept (oldest evicted)")
	f.IntVar(&cfg.MaxSpans, "max-spans", tracestore.DefaultMaxSpans, "spans kept (oldest traces evicted)")
	f.IntVar(&cfg.MaxConns, "max-conns", tracestore.DefaultMaxConns, "connections each port holds at once (the oldest idle or still-sending one makes room)")
	f.DurationVar(&cfg.ReadTimeout, "read-timeout", tracestore.DefaultReadTimeout, "time to send a whole request, headers and body")
	f.Int64Var(&cfg.MaxBytes, "max-bytes", tracestore.DefaultMaxBytes, "memory budget of the stored spans in bytes, estimated (oldest traces evicted; request bodies capped at it)")
	return withEnv(cmd)
}

// startCollector builds and starts the embedded trace collector.
func startCollector(ctx context.Context, cfg tracestore.Config, deps component.Deps) (*tracestore.Collector, error) {
	col, err := tracestore.New(cfg, deps)
	if err != nil {
		return nil, err
	}
	if err := col.Start(ctx); err != nil {
		return nil, err
	}
	return col, nil
}
