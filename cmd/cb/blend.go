package main

import (
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/blend"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/rpc/kvsock"
	"github.com/cacheblend/cacheblend/rpc/mtls"
)

func init() { subcommands = append(subcommands, newBlendCmd) }

func newBlendCmd() *cobra.Command {
	var (
		cfg         blend.Config
		metricsAddr string
		daemon      daemonFlags
	)
	cmd := &cobra.Command{
		Use:   "blend",
		Short: "Run cb-blend: the blend server (chunk store, fingerprint lookup, retrieve with scatter and re-RoPE)",
		RunE: func(c *cobra.Command, _ []string) error {
			ctx := c.Context()
			// The L1 budget bounds the live chunks; bound the heap's
			// garbage too, unless the operator set GOMEMLIMIT.
			if os.Getenv("GOMEMLIMIT") == "" && cfg.L1Bytes > 0 {
				debug.SetMemoryLimit(cfg.L1Bytes + cfg.L1Bytes/4 + 256<<20)
			}
			rt, id, err := daemon.start(ctx, "cb-blend", cfg.Addr, true)
			if err != nil {
				return err
			}
			deps := rt.Deps()
			deps.GRPCServerOptions = serverOptions(id, mtls.BlendCallers...)
			srv, err := blend.New(cfg, deps)
			if err != nil {
				return err
			}
			if err := srv.Start(ctx); err != nil {
				return err
			}
			gaddr := srv.Addr()
			rt.AddHealthCheck("blend", srv.Health) // 503 while a lookup worker is stuck
			maddr, err := rt.ServeMetrics(metricsAddr, srv.MetricsBefore)
			if err != nil {
				_ = srv.Shutdown(ctx)
				return err
			}
			rt.Logger.Info("blend server started", "grpc", gaddr, "kv_socket", srv.KVSocket(), "epoch", srv.Epoch(), "chunk_size", cfg.ChunkSize, "l2_dir", cfg.L2Dir,
				"fleet", cfg.Fleet.URL != "")
			announce("cb-blend", "grpc", gaddr, "metrics", "http://"+maddr.String()+"/metrics", "kv_socket", srv.KVSocket())
			return runUntilSignal(ctx, rt, srv)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", "127.0.0.1:50051", "gRPC listen address (127.0.0.1:0 picks a free port)")
	f.StringVar(&metricsAddr, "metrics-addr", "127.0.0.1:0", "address of /metrics and /health")
	f.StringVar(&cfg.KVSocket, "kv-socket", kvsock.DefaultPath(), "Unix socket on which workers hand over their KV memory (its directory: this user's, mode 0700, created when missing)")
	f.IntVar(&cfg.ChunkSize, "chunk-size", defaults.ChunkSize, "tokens per stored chunk")
	f.Int64Var(&cfg.L1Bytes, "l1-bytes", blend.DefaultL1Bytes, "L1 (memory) budget in bytes; a hard bound, LRU eviction (the Go memory limit is set to 1.25× it + 256 MiB unless GOMEMLIMIT is set)")
	f.StringVar(&cfg.L2Dir, "l2-dir", "", "L2 directory of chunk files (empty: no L2)")
	f.Int64Var(&cfg.L2Bytes, "l2-bytes", 0, "L2 budget in bytes (0: unbounded)")
	f.IntVar(&cfg.LookupWorkers, "lookup-workers", blend.DefaultLookupWorkers, "concurrent lookups")
	f.DurationVar(&cfg.LookupStuckAfter, "lookup-stuck-after", blend.DefaultLookupStuckAfter, "a lookup running longer marks the server unhealthy (gRPC health NOT_SERVING, /health 503) until it returns")
	f.IntVar(&cfg.CopyWorkers, "copy-workers", blend.DefaultCopyWorkers, "scatter copy goroutines (the copy stream)")
	f.IntVar(&cfg.EventQueue, "event-queue", blend.DefaultEventQueue, "event bus capacity (full: events dropped and counted)")
	f.StringVar(&cfg.Fleet.URL, "redis-url", "", "fleet tier: Redis shared by many nodes, redis://[user:password@]host:port or rediss://… (cluster: ?cluster=true or &addr=host:port seeds); empty: off")
	f.DurationVar(&cfg.Fleet.CoordinatorTimeout, "coordinator-timeout", fleet.DefaultCoordinatorTimeout, "bound of a coordinator match (fleet directory lookup); on timeout the local table's matches are used")
	f.DurationVar(&cfg.Fleet.OpTimeout, "redis-timeout", fleet.DefaultOpTimeout, "bound of one Redis round trip of the data path")
	daemon.register(f, mtls.Blend)
	return withEnv(cmd)
}
