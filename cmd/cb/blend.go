package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cacheblend/cacheblend/blend"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/rpc/kvsock"
	"github.com/cacheblend/cacheblend/rpc/mtls"
)

func init() { subcommands = append(subcommands, newBlendCmd) }

func newBlendCmd() *cobra.Command {
	var (
		cfg         blend.Config
		metricsAddr string
		daemon      daemonFlags
		secrets     fleetSecretFiles
	)
	cmd := &cobra.Command{
		Use:   "blend",
		Short: "Run cb-blend: the blend server (chunk store, fingerprint lookup, retrieve with scatter and re-RoPE)",
		RunE: func(c *cobra.Command, _ []string) error {
			ctx := c.Context()
			if err := resolveFleetSecrets(c.Flags(), &cfg.Fleet, secrets, os.Getenv); err != nil {
				return err
			}
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
			rt.AddHealthCheck("blend", srv.Health)      // 503 while a lookup worker is stuck
			rt.AddHealthDetail("l2", srv.StorageHealth) // a full disk, chunks not durable
			// The fleet tier's state is a detail, not a check: with Redis
			// unreachable the node still serves (degraded, not down).
			rt.AddHealthDetail("fleet", srv.FleetHealth)
			trust, err := metrics.NewFleetTrust(rt.Registry)
			if err != nil {
				_ = srv.Shutdown(ctx)
				return err
			}
			before := func() {
				srv.MetricsBefore()
				if st, ok := srv.FleetTrustTotals(); ok {
					trust.SetTotals(st)
				}
			}
			maddr, err := rt.ServeMetrics(metricsAddr, before)
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
	f.StringVar(&cfg.Fleet.URL, "redis-url", "", "fleet tier: Redis shared by many nodes, redis://[user@]host:port or rediss://… (cluster: ?cluster=true or &addr=host:port seeds); empty: off. A URL with a password is refused on the command line (every local user can read it there): set "+envName("blend", "redis-url")+" or use --redis-url-file / --redis-password-file")
	f.StringVar(&secrets.urlFile, "redis-url-file", "", "read the fleet tier's Redis URL (with its password) from this file (not readable by others); instead of --redis-url")
	f.StringVar(&secrets.passwordFile, "redis-password-file", "", "read the Redis password from this file (not readable by others) and add it to --redis-url")
	f.StringVar(&secrets.keyFile, "fleet-key-file", "", "fleet key file (not readable by others; at least 32 bytes, e.g. openssl rand -hex 32; the same on every node of the fleet, never stored in Redis): every value in Redis is signed with it (HMAC-SHA256) and checked before use. Or set "+fleetKeyEnv+"; required with a fleet tier")
	f.DurationVar(&cfg.Fleet.CoordinatorTimeout, "coordinator-timeout", fleet.DefaultCoordinatorTimeout, "bound of a coordinator match (fleet directory lookup); on timeout the local table's matches are used")
	f.DurationVar(&cfg.Fleet.OpTimeout, "redis-timeout", fleet.DefaultOpTimeout, "bound of one Redis round trip of the data path")
	daemon.register(f, mtls.Blend)
	return withEnv(cmd)
}

// fleetKeyEnv holds the fleet key itself (not a flag: a key is never
// given on the command line).
const fleetKeyEnv = "CB_BLEND_FLEET_KEY"

// fleetSecretFiles are the files cb blend reads the fleet tier's secrets
// from.
type fleetSecretFiles struct {
	urlFile, passwordFile, keyFile string
}

// resolveFleetSecrets completes fc from the secret files and the
// environment (getenv): the Redis URL from --redis-url-file, its password
// from --redis-password-file, the fleet key from --fleet-key-file or
// CB_BLEND_FLEET_KEY. It refuses a password given on the command line
// (--redis-url set there, fs.Changed: the environment variable does not
// count), since every local user reads a process's command line: warning
// would leave it exposed for the process's life. With a Redis URL, a fleet
// key is required.
func resolveFleetSecrets(fs *pflag.FlagSet, fc *fleet.Config, sf fleetSecretFiles, getenv func(string) string) error {
	if fs.Changed("redis-url") && fleet.URLHasPassword(fc.URL) {
		return fmt.Errorf("--redis-url carries a password on the command line, where every local user can read it "+
			"(/proc/PID/cmdline): set %s instead, or use --redis-url-file or --redis-password-file", envName("blend", "redis-url"))
	}
	if sf.urlFile != "" {
		if fc.URL != "" {
			return errors.New("--redis-url-file and --redis-url (or its environment variable) both set: give one")
		}
		u, err := fleet.ReadSecretFile(sf.urlFile)
		if err != nil {
			return fmt.Errorf("--redis-url-file: %w", err)
		}
		fc.URL = u
	}
	if sf.passwordFile != "" {
		if fc.URL == "" {
			return errors.New("--redis-password-file without a Redis URL (--redis-url)")
		}
		pw, err := fleet.ReadSecretFile(sf.passwordFile)
		if err != nil {
			return fmt.Errorf("--redis-password-file: %w", err)
		}
		if fc.URL, err = fleet.WithPassword(fc.URL, pw); err != nil {
			return fmt.Errorf("--redis-password-file: %w", err)
		}
	}
	key := getenv(fleetKeyEnv)
	if sf.keyFile != "" {
		if key != "" {
			return fmt.Errorf("--fleet-key-file and %s both set: give one", fleetKeyEnv)
		}
		k, err := fleet.ReadSecretFile(sf.keyFile)
		if err != nil {
			return fmt.Errorf("--fleet-key-file: %w", err)
		}
		key = k
	}
	if fc.URL == "" {
		return nil
	}
	if key == "" {
		return fmt.Errorf("the fleet tier needs a fleet key, the same on every node: --fleet-key-file or %s (e.g. openssl rand -hex 32)", fleetKeyEnv)
	}
	fc.Key = []byte(key)
	return fleet.CheckKey(fc.Key)
}
