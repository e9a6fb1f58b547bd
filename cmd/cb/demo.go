package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cacheblend/cacheblend/demo"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/modelfile"
	"github.com/cacheblend/cacheblend/stack"
)

func init() { subcommands = append(subcommands, newDemoCmd) }

func newDemoCmd() *cobra.Command {
	var (
		u        upFlags
		cfg      demo.Config
		exit     bool
		jsonPath string
		checkURL string
		verbose  bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start the stack, ingest the sample documents, run RAG requests with and without reuse, and show where the time went",
		Long: `Start the stack (as cb up), ingest the sample documents shipped in corpus/docs, run RAG-style
requests (documents in varying order and positions, then a question) once with CacheBlend reuse and
once as a full prefill, and print a table per request (TTFT with and without reuse, speedup, the
quality of the reuse against the full prefill, hit rate, prefix / non-prefix hit tokens, imp_count,
spans, services), the text waterfall of the slowest request,
the contract check of every trace, and the URL of the trace page. With --nodes N the requests go
through the gateway: the table names the node (X-Cb-Engine) that served each request, and a routing
table gives each node's requests and hit rate. Every request with reuse asks for the worker's online
quality check ("cacheblend": {"quality_check": true}): the table shows its cb.quality figures
(first-token KL against the full prefill, top-1 agreement), or why there are none, and whether the
greedy output equals the baseline's. The processes' log lines go to a file in the
logs directory of the state directory (its path is printed first); --verbose prints them instead.
It keeps running until Ctrl-C, or exits with --exit (status 1 when a check fails).`,
		RunE: func(c *cobra.Command, _ []string) error {
			ctx, stop := untilSignal(c.Context())
			defer stop()
			if cfg.APIKey != "" {
				u.cfg.EngineArgs = append(u.cfg.EngineArgs, "--api-key="+cfg.APIKey)
			}
			if !verbose {
				logs, err := demoLogFile()
				if err != nil {
					return err
				}
				defer logs.Close()
				u.cfg.Supervisor.Logs = logs
				fmt.Fprintf(os.Stderr, "logs of the processes: %s (--verbose prints them here)\n", logs.Name())
			}
			u.cfg.WorkerArgs = demoWorkerArgs(u.cfg.WorkerArgs)
			r, err := startStack(ctx, &u)
			if err != nil {
				return err
			}
			defer func() { _ = r.Shutdown() }()
			eps := r.stack.Endpoints()
			cfg.API = eps.API()
			cfg.QueryURL = cmp.Or(checkURL, r.queryURL)
			cfg.Progress = os.Stderr
			cfg.Shape = servedShape(u.cfg.WorkerArgs)
			cfg.QualityOff = qualityOff(u.cfg.WorkerArgs, u.cfg.TP)
			if u.cfg.ModelPath != "" {
				if cfg.Model, cfg.Shape.Layers, err = fileModel(u.cfg.ModelPath); err != nil {
					return err
				}
			}
			rep, err := demo.Run(ctx, cfg)
			if err != nil {
				return err
			}
			rep.Endpoints = eps
			if r.queryURL != "" {
				rep.UI = r.queryURL + "/"
			}
			rep.Print(os.Stdout)
			if jsonPath != "" {
				if err := rep.WriteJSON(jsonPath); err != nil {
					return err
				}
			}
			if exit {
				if cfg.QueryURL != "" && !rep.ChecksPassed() {
					return errors.New("demo: some traces failed the contract check")
				}
				return nil
			}
			fmt.Println("\nThe stack keeps running; press Ctrl-C to stop.")
			<-ctx.Done()
			return nil
		},
	}
	u.register(cmd)
	f := cmd.Flags()
	f.IntVar(&cfg.Requests, "requests", demo.DefaultRequests, "RAG requests (each sent with reuse and as a full prefill)")
	f.IntVar(&cfg.DocsPerRequest, "docs", demo.DefaultDocsPerRequest, "sample documents per prompt")
	f.IntVar(&cfg.MaxTokens, "max-tokens", demo.DefaultMaxTokens, "tokens generated per request")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the documents' order")
	f.StringVar(&cfg.APIKey, "api-key", "", "protect the engine's API with this key (the demo sends it)")
	f.BoolVar(&exit, "exit", false, "exit after the report instead of serving until Ctrl-C")
	f.StringVar(&jsonPath, "json", "", "also write the report as JSON to this file")
	f.BoolVar(&verbose, "verbose", false, "print the processes' log lines here instead of into a file in the state directory")
	f.StringVar(&checkURL, "check-url", "", "Jaeger-compatible query API to read traces from (default: the embedded collector; with OTEL_EXPORTER_OTLP_ENDPOINT set and no --check-url the checks are not run)")
	return withEnv(cmd)
}

// demoLogFile opens the file the demo's processes log into: in the logs directory of the
// default state directory (stack.DefaultStateDir), else of a new temporary directory.
func demoLogFile() (*os.File, error) {
	dir, err := stack.DefaultStateDir()
	if err != nil {
		if dir, err = os.MkdirTemp("", "cb-demo-"); err != nil {
			return nil, fmt.Errorf("demo: log directory: %w", err)
		}
	}
	return stack.OpenLogFile(dir, "demo")
}

// fileModel is the served name and the block count of a model file (the
// demo's requests and shape).
func fileModel(path string) (string, int, error) {
	f, err := modelfile.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	n, err := f.GGUF.Uint(f.GGUF.Architecture() + ".block_count")
	if err != nil {
		return "", 0, fmt.Errorf("%s: %w", path, err)
	}
	return f.Name, int(n), nil
}

// demoWorkerArgs is workerArgs with --quality-budget=1 unless they set a
// budget: the demo waits for each request's quality check before its next
// request, so checks never share the machine with a request, and a budget
// below 1 would drop the checks of the requests that follow a check (after
// a check began, the worker takes none until its CPU time divided by the
// budget has passed: with 0.25, four times a check's time).
func demoWorkerArgs(workerArgs []string) []string {
	for _, a := range workerArgs {
		if a == "--quality-budget" || strings.HasPrefix(a, "--quality-budget=") {
			return workerArgs
		}
	}
	return append(slices.Clone(workerArgs), "--quality-budget=1")
}

// qualityOff is why the demo's workers cannot run the online quality check,
// from the --quality-sample-rate among workerArgs (--worker-arg; 0 turns
// the checker off, and a forced check needs it) and the tensor-parallel
// degree tp (a rank cannot prefill in full alone); "" when they can.
func qualityOff(workerArgs []string, tp int) string {
	if tp > 1 {
		return "tensor-parallel workers (--tp) do not check quality"
	}
	rate := 0.01 // cb worker's default: any rate above 0 runs the checker
	fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	fs.SetOutput(io.Discard)
	fs.Float64Var(&rate, "quality-sample-rate", rate, "")
	if err := fs.Parse(workerArgs); err == nil && rate <= 0 {
		return "the workers run with --quality-sample-rate 0 (their checker is off)"
	}
	return ""
}

// servedShape is the shape of the model the demo's workers serve: the
// default model's, with the --layers, --check-layer and --recomp-ratio
// given among workerArgs (--worker-arg) applied; the other flags are
// ignored, and a malformed one leaves the default.
func servedShape(workerArgs []string) demo.Shape {
	d := model.DefaultConfig()
	def := demo.Shape{Layers: d.Layers, CheckLayer: d.CheckLayer, RecompRatio: d.RecompRatio}
	sh := def
	fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	fs.SetOutput(io.Discard)
	fs.IntVar(&sh.Layers, "layers", sh.Layers, "")
	fs.IntVar(&sh.CheckLayer, "check-layer", sh.CheckLayer, "")
	fs.Float64Var(&sh.RecompRatio, "recomp-ratio", sh.RecompRatio, "")
	if err := fs.Parse(workerArgs); err != nil {
		return def
	}
	return sh
}
