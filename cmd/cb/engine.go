package main

import (
	"cmp"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/engine"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/scheduler"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/mtls"
)

func init() { subcommands = append(subcommands, newEngineCmd) }

// defaultEngineProcs is cb engine's --procs default: 1, or 0 (Go's own
// default) when the GOMAXPROCS environment variable is set.
func defaultEngineProcs() int {
	if _, ok := os.LookupEnv("GOMAXPROCS"); ok {
		return 0
	}
	return 1
}

func newEngineCmd() *cobra.Command {
	var (
		cfg                   engine.Config
		workerAddr, blendAddr string
		daemon                daemonFlags
		procs                 int
		modelPath             string
		keyFile               string
	)
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "Run cb-engine: the OpenAI-compatible API, the continuous-batching scheduler and the CacheBlend connector (scheduler side)",
		RunE: func(c *cobra.Command, _ []string) error {
			ctx := c.Context()
			if procs > 0 {
				runtime.GOMAXPROCS(procs)
			}
			if err := checkAdvertiseAtStart(cfg, workerAddr); err != nil {
				return err
			}
			cfg.WorkerAdvertise = cmp.Or(cfg.WorkerAdvertise, workerAddr)
			key, err := loadStackKey(keyFile)
			if err != nil {
				return err
			}
			cfg.StackKey = key
			rt, id, err := daemon.start(ctx, "cb-engine", cfg.Addr, false)
			if err != nil {
				return err
			}
			wconn, err := rpc.Dial(workerAddr, dialOptions(id, mtls.Worker)...)
			if err != nil {
				return err
			}
			defer wconn.Close()
			deps := engine.Deps{Deps: rt.Deps(), Worker: cbv1.NewWorkerServiceClient(wconn), Gatherer: rt.Gatherer()}
			mf, closeModel, err := openModelFile(modelPath)
			if err != nil {
				return err
			}
			defer closeModel()
			bc, closeBlend, err := dialBlend(blendAddr, id)
			if err != nil {
				return err
			}
			defer closeBlend()
			deps.ModelFile, deps.Blend = mf, bc
			eng, err := engine.New(cfg, deps)
			if err != nil {
				return err
			}
			if err := eng.Start(ctx); err != nil {
				return err
			}
			api := "http://" + eng.Addr()
			rt.Logger.Info("engine started", "api", api, "procs", runtime.GOMAXPROCS(0), "worker", workerAddr, "blend", blendAddr, "model", eng.Model(), "role", eng.Role())
			announce("cb-engine", "api", api, "metrics", api+"/metrics")
			return runUntilSignal(ctx, rt, eng)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", engine.DefaultAddr, "OpenAI API listen address (also /metrics and /health)")
	f.StringVar(&workerAddr, "worker", "127.0.0.1:50061", "cb-worker gRPC address")
	f.StringVar(&blendAddr, "blend", "", "cb-blend gRPC address (empty: no CacheBlend reuse)")
	f.StringVar(&modelPath, "model", "", "GGUF model file (the same file as the worker's: its tokenizer and chat template; the engine refuses a worker holding another); empty: the built-in model")
	f.StringVar(&cfg.Model, "model-name", "", "served model name (default: the file's general.name, or "+defaults.Model+" for the built-in model)")
	f.StringVar(&cfg.Role, "role", engine.RoleBoth, "prefill/decode disaggregation: both (every request whole), prefill (also hands requests with X-CB-Decode-Engine over after their first token), decode (also takes requests over from prefill engines)")
	f.StringVar(&cfg.WorkerAdvertise, "worker-advertise", "", "role prefill: the worker's address as decode engines' workers reach it (default --worker; a loopback one is refused at start when --addr is not loopback, and never sent to a decode engine on another host)")
	f.StringVar(&keyFile, "stack-key-file", "", stackKeyUsage)
	f.StringSliceVar(&cfg.DecodeEngines, "decode-engine", nil, "role prefill: a decode engine's base URL (http://host:port) X-CB-Decode-Engine may name; repeatable (none: every hand-over refused, 403 decode_engine_not_allowed)")
	f.IntVar(&cfg.MaxHandoffsPerPeer, "max-handoffs-per-peer", engine.DefaultMaxHandoffsPerPeer, "role prefill: hand-overs in flight to one decode engine, each holding its prompt's KV blocks (beyond: 503 handoff_peer_busy with Retry-After)")
	f.StringSliceVar(&cfg.HandoffSources, "handoff-source", nil, "role decode: a prefill worker (host:port) to take requests over from; repeatable (none: any)")
	f.DurationVar(&cfg.HandoffConnectTimeout, "handoff-connect-timeout", engine.DefaultHandoffConnect, "role prefill: give up connecting to a decode engine after this long (503 decode_unavailable: the gateway serves the request whole); keep it plus --handoff-idle-timeout below the gateway's --upstream-idle-timeout")
	f.DurationVar(&cfg.HandoffIdleTimeout, "handoff-idle-timeout", engine.DefaultHandoffIdle, "role prefill: abort a hand-over whose decode engine sent no byte for this long (503 decode_unavailable before anything was relayed; the request's --request-timeout is its overall deadline)")
	f.DurationVar(&cfg.HandoffTimeout, "handoff-timeout", scheduler.DefaultHandoffTimeout, "role prefill: release a handed-over request's blocks after this when the worker never reports the read")
	f.IntVar(&cfg.MaxTransfers, "max-transfers", scheduler.DefaultMaxTransfers, "role decode: KV pulls in flight")
	f.IntVar(&cfg.MaxQueue, "max-queue", scheduler.DefaultMaxQueue, "waiting requests before 429")
	f.IntVar(&cfg.MaxRunning, "max-running", scheduler.DefaultMaxRunning, "running sequences per step")
	f.IntVar(&cfg.StepTokenBudget, "step-tokens", scheduler.DefaultStepTokenBudget, "tokens per scheduler step (chunked prefill)")
	f.IntVar(&cfg.LoneBlendTokens, "lone-blend-tokens", scheduler.DefaultLoneBlendTokens, "tokens of a CacheBlend prefill alone in its step taken in that step whatever --step-tokens (-1: none; reused tokens are otherwise charged their share of the forward)")
	f.DurationVar(&cfg.LookupTimeout, "lookup-timeout", scheduler.DefaultLookupTimeout, "give up on a CacheBlend lookup after this; the request is prefilled in full")
	f.Float64Var(&cfg.RecompRatio, "recomp-ratio", defaults.RecompRatio, "CacheBlend recompute ratio sent to the worker")
	f.BoolVar(&cfg.DisableStore, "no-store", false, "do not store prompts' KV in the blend server (documents still are)")
	f.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", engine.DefaultMaxTokens, "max_tokens when a request gives none")
	f.BoolVar(&cfg.CaptureContent, "capture-content", os.Getenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT") == "true",
		"record prompts and completions as span events (off by default; also OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)")
	f.IntVar(&procs, "procs", defaultEngineProcs(), "Go procs (GOMAXPROCS) the engine runs on (0: Go's default, all cores); default 1 unless GOMAXPROCS is set: the engine only coordinates, and on one proc its goroutines hand work over without waking threads (a third less CPU per request) and leave the cores to the worker")
	registerFrontFlags(f, &cfg.Settings)
	daemon.register(f, mtls.Engine)
	return withEnv(cmd)
}

// checkAdvertiseAtStart refuses a prefill engine reachable from other hosts
// (--addr not loopback) whose worker address for the decode workers would
// default to a loopback --worker: decode engines on other hosts would dial
// their own loopback. An explicit --worker-advertise is taken as given (a
// loopback one still never goes to a decode engine on another host: the
// engine refuses such a hand-over, 500 handoff_misconfigured).
func checkAdvertiseAtStart(cfg engine.Config, workerAddr string) error {
	if cfg.Role != engine.RolePrefill || cfg.WorkerAdvertise != "" || !engine.IsLoopback(workerAddr) || engine.IsLoopback(cfg.Addr) {
		return nil
	}
	return fmt.Errorf("cb engine: role prefill listens on %s (reachable from other hosts) but would advertise its worker as %s, a loopback address "+
		"decode engines on other hosts cannot reach: give --worker-advertise HOST:PORT (CB_ENGINE_WORKER_ADVERTISE), the worker's address as the decode hosts reach it "+
		"(or --worker-advertise %s explicitly if every decode engine runs on this host)", cfg.Addr, workerAddr, workerAddr)
}

// stackKeyUsage is the help of --stack-key-file (cb engine, cb gateway).
const stackKeyUsage = "file holding the stack key, the secret the stack's engines and gateway share to authenticate prefill/decode hand-overs (at least 16 bytes, surrounding whitespace trimmed; group/other must not be able to read the file); default: the environment variable CB_STACK_KEY; never give the key itself as a flag. Needed by --role prefill/decode and by a gateway with --prefill/--decode"

// loadStackKey reads the stack key from file (which group and others must
// not be able to read), else from CB_STACK_KEY; nil when neither is set.
func loadStackKey(file string) ([]byte, error) {
	var key string
	if file != "" {
		fi, err := os.Stat(file)
		if err != nil {
			return nil, fmt.Errorf("stack key: %w", err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("stack key: %s is readable by group or others (mode %v): chmod 600 it", file, fi.Mode().Perm())
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("stack key: %w", err)
		}
		key = string(b)
	} else if key = os.Getenv(stackKeyEnv); key == "" {
		return nil, nil
	}
	key = strings.TrimSpace(key)
	if len(key) < api.MinStackKeyBytes {
		return nil, fmt.Errorf("stack key: %d bytes, at least %d", len(key), api.MinStackKeyBytes)
	}
	return []byte(key), nil
}

// stackKeyEnv is the environment variable holding the stack key when no
// --stack-key-file is given (cb up sets it for its engines and gateway).
const stackKeyEnv = "CB_STACK_KEY"
