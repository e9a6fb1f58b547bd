package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/gateway"
	"github.com/cacheblend/cacheblend/httpfront"
)

func init() { subcommands = append(subcommands, newGatewayCmd) }

func newGatewayCmd() *cobra.Command {
	var (
		cfg       gateway.Config
		daemon    daemonFlags
		modelPath string
		keyFile   string
	)
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run cb-gateway: an OpenAI-compatible front that routes each request to one of N engines (kv-aware, least-loaded or round-robin) with health checks and failover",
		Long: `Run cb-gateway: an OpenAI-compatible front (the engine's API, errors, streaming, API key,
/metrics, /health) that forwards each request to one of the engines given by --engine.

Policies (--policy): kv-aware (default) scores each engine by the part of the prompt it is
expected to reuse (learned from the prompts and documents the gateway routed there) against its
load (waiting and running requests and used KV blocks from the engine's /metrics, plus the
gateway's own requests in flight): score = expected_hit_tokens/prompt_tokens − alpha·load; when
the best engine's load exceeds the least loaded one's by more than --spread-margin the request
is spread to a less loaded engine. least-loaded takes the lowest load, round-robin rotates.

Engines are health-checked every --health-interval; a request that an engine fails before
anything was streamed (unreachable, 503, 429) is retried on another; with no engine up the
answer is 503 with Retry-After; when every engine has --max-in-flight requests, requests wait
in a queue of --max-queue (full: 429 with Retry-After).

Prefill/decode disaggregation: with --prefill and --decode (instead of --engine) a generation
request goes to a prefill engine chosen by --policy (the CacheBlend reuse happens there) with
header X-CB-Decode-Engine naming the least loaded healthy decode engine; a 503
decode_unavailable before anything was streamed is retried with another decode engine; with no
decode engine up a generation is served whole on a prefill engine and /health answers 200 with
status "degraded". The stack key (--stack-key-file, or CB_STACK_KEY; the prefill engines' key)
signs each X-CB-Decode-Engine the gateway sets (X-CB-Decode-Auth): prefill engines honour the
header only with that proof.

Faults: an engine goes out of routing after --health-failures failed probes in a row (each
bounded by --probe-timeout) or at once when a request fails on it; its attempts that still
receive bytes go on, the stalled ones fail over. An engine silent for --upstream-idle-timeout
is cut; streams get ": keep-alive" comments every --keep-alive while the engine is silent.`,
		RunE: func(c *cobra.Command, _ []string) error {
			ctx := c.Context()
			if len(cfg.Engines) == 0 && (len(cfg.Prefill) == 0 || len(cfg.Decode) == 0) {
				return fmt.Errorf("cb gateway: give at least one --engine URL, or --prefill and --decode URLs")
			}
			key, err := loadStackKey(keyFile)
			if err != nil {
				return err
			}
			if len(cfg.Prefill) > 0 && key == nil {
				return fmt.Errorf("cb gateway: prefill/decode routing needs the stack key the engines share (--stack-key-file FILE or CB_STACK_KEY): prefill engines honour X-CB-Decode-Engine only with the gateway's proof")
			}
			cfg.StackKey = key
			rt, _, err := daemon.start(ctx, "cb-gateway", cfg.Addr, false)
			if err != nil {
				return err
			}
			mf, closeModel, err := openModelFile(modelPath)
			if err != nil {
				return err
			}
			defer closeModel()
			gw, err := gateway.New(cfg, gateway.Deps{Deps: rt.Deps(), Gatherer: rt.Gatherer(), ModelFile: mf})
			if err != nil {
				return err
			}
			if err := gw.Start(ctx); err != nil {
				return err
			}
			api := "http://" + gw.Addr()
			rt.Logger.Info("gateway started", "api", api, "engines", strings.Join(gw.Engines(), ","),
				"decode_engines", strings.Join(gw.DecodeEngines(), ","), "policy", cfg.Policy)
			announce("cb-gateway", "api", api, "metrics", api+"/metrics")
			return runUntilSignal(ctx, rt, gw)
		},
	}
	f := cmd.Flags()
	f.StringVar(&modelPath, "model", "", "the engines' GGUF model file: its tokenizer and chat template give the prompts' tokens the kv-aware policy matches (empty: the built-in model's byte tokens)")
	f.StringVar(&cfg.Addr, "addr", gateway.DefaultAddr, "OpenAI API listen address (also /metrics and /health)")
	f.StringSliceVar(&cfg.Engines, "engine", nil, "engine base URL, e.g. http://127.0.0.1:8000 (repeatable, or comma-separated)")
	f.StringSliceVar(&cfg.Prefill, "prefill", nil, "prefill engine base URL (cb engine --role prefill; repeatable); with --decode, instead of --engine: prefill/decode routing")
	f.StringSliceVar(&cfg.Decode, "decode", nil, "decode engine base URL (cb engine --role decode; repeatable): named in X-CB-Decode-Engine, the least loaded healthy one")
	f.StringVar(&cfg.Policy, "policy", gateway.DefaultPolicy, "routing policy: "+strings.Join(gateway.Policies(), ", "))
	f.Float64Var(&cfg.Alpha, "alpha", gateway.DefaultAlpha, "kv-aware: weight of an engine's load (requests) against the reused fraction of the prompt")
	f.Float64Var(&cfg.SpreadMargin, "spread-margin", gateway.DefaultSpreadMargin, "kv-aware: spread to a less loaded engine when the best one's load exceeds the least loaded one's by more than this (requests)")
	f.IntVar(&cfg.MaxInFlight, "max-in-flight", gateway.DefaultMaxInFlight, "requests in flight per engine; beyond, requests wait in the gateway's queue")
	f.IntVar(&cfg.MaxQueue, "max-queue", gateway.DefaultMaxQueue, "requests waiting for an engine slot before 429")
	f.DurationVar(&cfg.QueueTimeout, "queue-timeout", gateway.DefaultQueueTimeout, "longest wait in the queue (then 503 with Retry-After)")
	f.DurationVar(&cfg.HealthInterval, "health-interval", gateway.DefaultHealthInterval, "period of the engines' health checks (GET /health and /metrics)")
	f.DurationVar(&cfg.ProbeTimeout, "probe-timeout", gateway.DefaultProbeTimeout, "longest health probe (each GET); slower counts as a failure")
	f.IntVar(&cfg.HealthFailures, "health-failures", gateway.DefaultHealthFailures, "consecutive failed health probes that take an engine out of routing (a failed request takes it out at once)")
	f.DurationVar(&cfg.IdleTimeout, "upstream-idle-timeout", gateway.DefaultIdleTimeout, "abort an attempt whose engine sent no byte for this long (response headers included: a non-streamed answer must begin within it): fail over before anything was sent, else end the stream with an upstream_idle_timeout error event")
	f.DurationVar(&cfg.KeepAlive, "keep-alive", gateway.DefaultKeepAlive, "write an SSE comment \": keep-alive\" to a streaming client after this long without an event")
	f.IntVar(&cfg.IndexBytes, "index-bytes", gateway.DefaultIndexBytes, "kv-aware: bytes of each engine's reuse index (least recently used prompts evicted beyond)")
	f.IntVar(&cfg.IndexSequences, "index-sequences", gateway.DefaultIndexSequences, "kv-aware: prompts and documents per engine's reuse index")
	f.IntVar(&cfg.ChunkSize, "chunk-size", defaults.ChunkSize, "chunk of the reuse index in tokens (the engines' chunk size)")
	f.StringVar(&keyFile, "stack-key-file", "", stackKeyUsage)
	f.StringVar(&cfg.EngineAPIKey, "engine-api-key", "", "send this bearer key to the engines (empty: forward the client's Authorization header)")
	f.DurationVar(&cfg.RequestTimeout, "request-timeout", httpfront.DefaultRequestTimeout, "longest request, queue and attempts included (504 beyond)")
	registerFrontFlags(f, &cfg.Settings)
	daemon.register(f, "")
	return withEnv(cmd)
}
