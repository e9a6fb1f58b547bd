package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/service"
	"github.com/cacheblend/cacheblend/stack"
	"github.com/cacheblend/cacheblend/tracestore"
)

func init() { subcommands = append(subcommands, newUpCmd) }

// upFlags are the flags cb up and cb demo share: the stack's settings (cb up alone sets
// PrefillNodes, DecodeNodes and StateDir; cb demo sets Supervisor.Logs to a file unless
// --verbose) and the embedded collector's addresses.
type upFlags struct {
	cfg           stack.UpConfig
	endpointsFile string
	otlpAddr      string
	uiAddr        string
	colMetrics    string // the embedded collector's /metrics address
	noL2          bool   // cb up only: no L2 whatever --state-dir
	fleetKeyFile  string // the fleet tier's key (with --redis-url)
}

func (u *upFlags) register(cmd *cobra.Command) {
	f, c := cmd.Flags(), &u.cfg
	f.StringVar(&c.ModelPath, "model", "", "GGUF model file every engine and worker serves (e.g. ~/models/Llama-3.2-1B-Instruct-Q4_K_M.gguf); empty: the built-in seeded model")
	f.StringVar(&c.APIAddr, "api", "127.0.0.1:8000", "address of the OpenAI API: the engine's, or with --nodes N the gateway's")
	f.StringVar(&u.endpointsFile, "endpoints-file", "", "write the processes' endpoints as JSON to this file once all are healthy")
	f.StringVar(&u.otlpAddr, "otlp-addr", "127.0.0.1:0", "embedded collector's OTLP/HTTP address (when OTEL_EXPORTER_OTLP_ENDPOINT is unset)")
	f.StringVar(&u.uiAddr, "ui-addr", "127.0.0.1:16686", "embedded collector's query API and trace page address")
	f.StringVar(&u.colMetrics, "collector-metrics-addr", "127.0.0.1:0", "embedded collector's own /metrics and /health address (in the endpoints file as collector.metrics)")
	f.StringArrayVar(&c.EngineArgs, "engine-arg", nil, "extra flag for cb engine (repeatable), e.g. --engine-arg=--api-key=secret")
	f.StringArrayVar(&c.WorkerArgs, "worker-arg", nil, "extra flag for cb worker (repeatable)")
	f.StringArrayVar(&c.BlendArgs, "blend-arg", nil, "extra flag for cb blend (repeatable)")
	f.StringArrayVar(&c.GatewayArgs, "gateway-arg", nil, "extra flag for cb gateway with --nodes N (repeatable), e.g. --gateway-arg=--policy=least-loaded")
	f.BoolVar(&c.NoGateway, "no-gateway", false, "with --nodes N, start no gateway: node 0's engine listens on --api")
	f.StringVar(&c.RedisURL, "redis-url", "", "fleet tier shared with other nodes (redis://HOST:PORT/DB; passed to cb blend in its environment). A password is refused here (argv is readable by every user): give the whole URL as CB_UP_REDIS_URL instead")
	f.StringVar(&u.fleetKeyFile, "fleet-key-file", "", "with --redis-url: file holding the fleet tier's key (every node of the fleet has the same; or CB_UP_FLEET_KEY); without --redis-url cb up generates one for its own redis-server")
	f.IntVar(&c.Nodes, "nodes", 1, "nodes to start on loopback (engine + worker + blend server each) sharing one fleet tier, behind a gateway (cb gateway) on --api; without --redis-url, cb up starts redis-server on a free port with a random password")
	f.IntVar(&c.TP, "tp", 1, "run each worker as this many tensor-parallel rank processes (cb worker --tp); a rank that dies fails its requests (503) and the whole rank group is restarted")
	f.BoolVar(&c.Plaintext, "plaintext", false, "no mutual TLS between the processes: the worker's and the blend server's gRPC ports then admit any local process (default: a throw-away CA and a certificate per process, removed at exit)")
}

// running is a started stack and, unless spans go to an external OTLP
// endpoint, the embedded collector.
type running struct {
	stack      *stack.Stack
	collector  *tracestore.Collector
	colRT      *service.Runtime // serves the collector's /metrics, nil with it
	queryURL   string           // Jaeger-compatible query API ("" when exporting elsewhere)
	metricsURL string           // the collector's /metrics ("" without it)
}

// Shutdown stops the stack, then the collector, within shutdownTimeout.
func (r *running) Shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := r.stack.Shutdown(ctx)
	if r.collector != nil {
		if cerr := r.collector.Shutdown(ctx); err == nil {
			err = cerr
		}
	}
	if r.colRT != nil {
		if cerr := r.colRT.Shutdown(ctx); err == nil {
			err = cerr
		}
	}
	return err
}

// collectorRuntime serves the embedded collector's own /metrics and /health
// on addr (as cb traces --metrics-addr does): Go runtime, process and
// build info. It does not trace (the OTEL_* variables are not read).
func collectorRuntime(ctx context.Context, addr string, logs io.Writer) (*service.Runtime, string, error) {
	rt, err := service.New(ctx, service.Options{ServiceName: "cb-traces", LogOutput: logs,
		Getenv: func(k string) string {
			if strings.HasPrefix(k, "OTEL_") {
				return ""
			}
			return os.Getenv(k)
		}})
	if err != nil {
		return nil, "", err
	}
	maddr, err := rt.ServeMetrics(addr, nil)
	if err != nil {
		_ = rt.Shutdown(ctx)
		return nil, "", err
	}
	return rt, "http://" + maddr.String() + "/metrics", nil
}

// fleetSecrets fills cfg's fleet key from --fleet-key-file (or
// CB_UP_FLEET_KEY_FILE) or CB_UP_FLEET_KEY, and refuses a Redis password
// given on the command line (CB_UP_REDIS_URL sets --redis-url from the
// environment).
func (u *upFlags) fleetSecrets(cfg *stack.UpConfig) error {
	fromEnv := cfg.RedisURL == os.Getenv("CB_UP_REDIS_URL") || cfg.RedisURL == os.Getenv("CB_DEMO_REDIS_URL")
	if cfg.RedisURL != "" && fleet.URLHasPassword(cfg.RedisURL) && !fromEnv {
		return errors.New("cb up: --redis-url holds a password, readable by every user in the process list: pass the URL as CB_UP_REDIS_URL instead")
	}
	switch {
	case u.fleetKeyFile != "":
		key, err := fleet.ReadSecretFile(u.fleetKeyFile)
		if err != nil {
			return fmt.Errorf("cb up: --fleet-key-file: %w", err)
		}
		cfg.FleetKey = key
	case os.Getenv("CB_UP_FLEET_KEY") != "":
		cfg.FleetKey = os.Getenv("CB_UP_FLEET_KEY")
	}
	return nil
}

// startStack starts the collector (unless OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set) and the stack's processes.
func startStack(ctx context.Context, u *upFlags) (*running, error) {
	r := &running{}
	cfg := u.cfg
	cfg.Env = []string{"OTEL_BSP_SCHEDULE_DELAY=200"} // export batches often: a request's trace is complete quickly
	if err := u.fleetSecrets(&cfg); err != nil {
		return nil, err
	}
	if u.noL2 {
		cfg.StateDir = ""
	}
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		var deps component.Deps
		if logs := cfg.Supervisor.Logs; logs != nil {
			deps.Logger = slog.New(slog.NewJSONHandler(logs, nil))
		}
		col, err := startCollector(ctx, tracestore.Config{OTLPAddr: u.otlpAddr, QueryAddr: u.uiAddr}, deps)
		if err != nil {
			return nil, fmt.Errorf("start the trace collector: %w", err)
		}
		r.collector = col
		r.queryURL = "http://" + col.QueryAddr()
		logs := io.Writer(os.Stderr)
		if cfg.Supervisor.Logs != nil {
			logs = cfg.Supervisor.Logs
		}
		if r.colRT, r.metricsURL, err = collectorRuntime(ctx, u.colMetrics, logs); err != nil {
			_ = col.Shutdown(context.Background())
			return nil, fmt.Errorf("start the trace collector's metrics: %w", err)
		}
		cfg.OTLPEndpoint = "http://" + col.OTLPAddr() + "/v1/traces"
		cfg.OTLPProtocol = "http/protobuf"
	}
	st, err := stack.Up(ctx, cfg)
	if err != nil {
		if r.collector != nil {
			_ = r.collector.Shutdown(context.Background())
			_ = r.colRT.Shutdown(context.Background())
		}
		return nil, err
	}
	r.stack = st
	if r.collector != nil {
		st.SetCollector("http://"+r.collector.OTLPAddr()+"/v1/traces", r.queryURL+"/")
		st.SetCollectorMetrics(r.metricsURL)
	}
	if u.endpointsFile != "" {
		if err := st.WriteEndpoints(u.endpointsFile); err != nil {
			_ = r.Shutdown()
			return nil, err
		}
	}
	return r, nil
}

func newUpCmd() *cobra.Command {
	var u upFlags
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start cb blend, cb worker and cb engine as separate processes (plus the embedded trace collector) and supervise them",
		Long: `Start cb blend, cb worker and cb engine as separate OS processes, wait until each is healthy,
stream their logs with a prefix, restart one that dies (with backoff) while the others keep serving,
and stop all of them on Ctrl-C. Spans go to OTEL_EXPORTER_OTLP_ENDPOINT when it is set; otherwise the
embedded collector is started and all three export to it (its trace page is printed).

Every gRPC hop (engine→worker, engine→blend, worker→blend) is mutual TLS: cb up generates a
throw-away CA and one certificate per process (ECDSA P-256, valid 7 days, the CA key never written)
in a private temporary directory, passes them as --tls-cert/--tls-key/--tls-ca, and removes them
at exit. The worker admits only the engine, the blend server the engine and the worker.
--plaintext turns this off.

With --nodes N, N nodes (blend server, worker and engine each) share one fleet tier (Redis), and
a gateway (cb gateway, kv-aware routing by default; --gateway-arg=--policy=...) listens on --api
in front of their engines, which listen on free ports (listed in the endpoints file).

With --prefill-nodes P --decode-nodes D, P nodes whose engines run with --role prefill and D
with --role decode (one CA for all: the decode workers read the prefill workers' KV over mutual
TLS) share the fleet tier, and the gateway on --api routes with --prefill/--decode: each
generation to a prefill engine (kv-aware), handed over to the least loaded decode engine. The
endpoints file gives each node's role.`,
		RunE: func(c *cobra.Command, _ []string) error {
			ctx, stop := untilSignal(c.Context())
			defer stop()
			r, err := startStack(ctx, &u)
			if err != nil {
				return err
			}
			eps := r.stack.Endpoints()
			if gw := eps.Gateway; gw != nil {
				fmt.Printf("cacheblend is up: OpenAI API %s (gateway in front of %d nodes; metrics %s)\n", gw.API, len(eps.Nodes), gw.Metrics)
				for i, n := range eps.Nodes {
					role := ""
					if n.Role != "" {
						role = " (" + n.Role + ")"
					}
					fmt.Printf("node %d%s: engine %s (metrics %s)\n", i, role, n.Engine.API, n.Engine.Metrics)
				}
			} else {
				fmt.Printf("cacheblend is up: OpenAI API %s (metrics %s)\n", eps.Engine.API, eps.Engine.Metrics)
				for i, n := range eps.Nodes[min(1, len(eps.Nodes)):] {
					fmt.Printf("node %d: OpenAI API %s (metrics %s)\n", i+1, n.Engine.API, n.Engine.Metrics)
				}
			}
			if eps.Redis != nil {
				fmt.Println("fleet tier: Redis shared by the nodes (its URL is in the endpoints file)")
			}
			if u.cfg.StateDir != "" && !u.noL2 {
				budget := "unbounded (--l2-bytes -1)"
				if b := r.stack.L2Budget(); b > 0 {
					budget = fmt.Sprintf("%.1f MiB per blend server", float64(b)/(1<<20))
					if u.cfg.L2Bytes == 0 {
						budget += fmt.Sprintf(" (default: %.0f%% of the free space, at most %d GiB; --l2-bytes sets it)", 100*stack.DefaultL2Fraction, stack.DefaultL2Cap>>30)
					}
				}
				fmt.Printf("state: the blend server's L2 in %s, budget %s (stored documents survive restarts; --no-l2 keeps them in memory only)\n", u.cfg.StateDir, budget)
			} else {
				fmt.Println("state: no L2 (stored documents are lost when the blend server restarts)")
			}
			if r.queryURL != "" {
				fmt.Printf("trace page: %s/ (collector metrics %s)\n", r.queryURL, r.metricsURL)
			}
			if dir := r.stack.TLSDir(); dir != "" {
				fmt.Printf("gRPC between the processes: mutual TLS (throw-away CA and certificates in %s until exit)\n", dir)
			} else {
				fmt.Println("gRPC between the processes: plaintext, unauthenticated (--plaintext)")
			}
			<-ctx.Done()
			return r.Shutdown()
		},
	}
	u.register(cmd)
	f := cmd.Flags()
	f.IntVar(&u.cfg.PrefillNodes, "prefill-nodes", 0, "with --decode-nodes: start this many prefill nodes (cb engine --role prefill) behind the gateway, instead of --nodes")
	defState, _ := stack.DefaultStateDir() // "" without a home directory: no L2 unless --state-dir
	f.StringVar(&u.cfg.StateDir, "state-dir", defState, "state directory kept across restarts (created 0700; refused when it is a symbolic link, another user's, or group or others may access it): the blend server keeps its L2 there (chunk files and registered sequences, so stored documents survive a restart of the blend server or of the stack)")
	f.Int64Var(&u.cfg.L2Bytes, "l2-bytes", 0, "L2 budget of each blend server in bytes (oldest chunk files evicted beyond it); 0: 25% of the state directory's free space at start, at most 32 GiB, split between the nodes; -1: unbounded")
	f.BoolVar(&u.noL2, "no-l2", false, "no L2: the blend server keeps chunks in memory only (stored documents are lost when it restarts)")
	f.IntVar(&u.cfg.DecodeNodes, "decode-nodes", 0, "with --prefill-nodes: start this many decode nodes (cb engine --role decode), named to the prefill engines by the gateway")
	return withEnv(cmd)
}
