package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/eval"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/stack"
	"github.com/cacheblend/cacheblend/tokenizer"
	"github.com/cacheblend/cacheblend/worker"
)

func init() { subcommands = append(subcommands, newEvalCmd) }

func newEvalCmd() *cobra.Command {
	var (
		cfg                    eval.Config
		mcfg                   model.Config
		modelPath, docsDir, qs string
		jsonPath, svgPath      string
		maxKL                  float64
		onStack, verbose       bool
		sc                     eval.Stack
		gate                   bool
		gateKL                 float64
	)
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Measure CacheBlend's quality beside its speed on a model: KL from a full prefill and TTFT speedup through the stack per recompute ratio and selection rule",
		Long: `Measure CacheBlend's two numbers on the built-in model or a GGUF file (--model): RAG prompts
(the sample documents, or --documents DIR with --questions FILE, at varying offsets of chat-templated
prompts) are run as a full prefill and blended — every document computed alone, moved into place
with K re-rotated, then CacheBlend's selective recompute — at every recompute ratio (--ratios) with
two selection rules: the check layer's KV deviation (HKVD, CacheBlend's) and random tokens at the
same ratio; ratio 0 is full reuse without recompute. Printed per configuration: KL(full ‖ blend) of
the next-token distribution at the first output token and over the first K tokens (both fed the
full prefill's greedy continuation), top-1 agreement, the share of prompts whose K greedy tokens
match, and the speedup. By default (--stack) the speedup is measured through the real stack: cb eval
starts it (as cb up: blend server, worker and engine as separate processes, serving the same
model, on free loopback ports, the engine with --no-store and the worker with --blend-gate on and
--quality-sample-rate 0), ingests the documents with POST /v1/documents and sends every prompt
--repeats times per configuration with its "cacheblend" settings and as many times as a full
prefill ("reuse": false), streaming; the TTFT speedup is the full prefills' median client-side
time to the first token over the blended requests'. Every request is made unique (its number
opens the system message) so that the engine's prefix cache serves none of it, and a request that
reused nothing off the prefix fails the run. The quality is always measured in this process (the
API returns no logits), beside the model-only speedup (full prefill time over blended forward
time); --stack=false measures only that. The processes log into a file in the state directory's
logs directory (--verbose: here). --json writes the report, --svg a chart of quality loss against
speedup.`,
		RunE: func(c *cobra.Command, _ []string) error {
			var err error
			if docsDir != "" {
				if cfg.Documents, err = eval.ReadDocuments(docsDir); err != nil {
					return err
				}
			}
			if qs != "" {
				if cfg.Questions, err = eval.ReadQuestions(qs); err != nil {
					return err
				}
			}
			m, name, prompts, closeFile, err := evalModel(modelPath, mcfg)
			if err != nil {
				return err
			}
			defer closeFile()
			if gate {
				kvType, err := kvcache.ParseDType(cfg.KVType)
				if err != nil {
					return err
				}
				return evalGate(c, m, name, modelPath, gateKL, kvType)
			}
			ctx, stop := untilSignal(c.Context())
			defer stop()
			if onStack {
				st, closeLogs, err := evalStack(ctx, modelPath, mcfg, verbose)
				if err != nil {
					return err
				}
				defer closeLogs()
				defer func() {
					sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
					defer cancel()
					_ = st.Shutdown(sctx)
				}()
				sc.API = st.Endpoints().API()
				sc.Model = defaults.Model
				if modelPath != "" {
					sc.Model = name
				}
				sc.Progress = os.Stderr
				cfg.Stack = &sc
			}
			rep, err := eval.Run(ctx, m, name, prompts, cfg)
			if err != nil {
				return err
			}
			out := c.OutOrStdout()
			if err := rep.WriteTable(out); err != nil {
				return err
			}
			for _, rule := range []string{"hkvd", "random"} {
				if p, ok := rep.Cheapest(rule, maxKL); ok {
					kind := "model-only speedup"
					if rep.Stack != nil {
						kind = "TTFT speedup"
					}
					fmt.Fprintf(out, "\n%s: the fastest configuration with first-token KL <= %g is ratio %g: %.2fx %s (KL %.5f)", rule, maxKL, p.Ratio, p.Speedup(), kind, p.FirstKL)
				}
			}
			fmt.Fprintln(out)
			if jsonPath != "" {
				b, err := json.MarshalIndent(rep, "", "  ")
				if err != nil {
					return err
				}
				if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
					return err
				}
			}
			if svgPath != "" {
				f, err := os.Create(svgPath)
				if err != nil {
					return err
				}
				if err := rep.WriteSVG(f); err != nil {
					f.Close()
					return err
				}
				return f.Close()
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&modelPath, "model", "", "GGUF model file (default: the built-in model)")
	f.Float64SliceVar(&cfg.Ratios, "ratios", eval.DefaultRatios, "recompute ratios to measure, each in [0, 1]")
	f.IntVar(&cfg.Prompts, "prompts", eval.DefaultPrompts, "prompts in the workload")
	f.IntVar(&cfg.Docs, "docs", eval.DefaultDocs, "documents per prompt")
	f.IntVar(&cfg.Positions, "positions", eval.DefaultPositions, "K: output tokens compared under teacher forcing")
	f.StringVar(&cfg.KVType, "kv-type", worker.DefaultKVType, "element type of the KV cache the forwards run on: f16 (as cb worker serves by default) or f32")
	f.StringVar(&docsDir, "documents", "", "directory of *.txt documents (default: the sample corpus)")
	f.StringVar(&qs, "questions", "", "file of questions, one per line")
	f.StringVar(&jsonPath, "json", "", "write the report as JSON to this file")
	f.StringVar(&svgPath, "svg", "", "write the chart (quality loss against speedup) as SVG to this file")
	f.Float64Var(&maxKL, "max-kl", 0.01, "report the fastest configuration whose mean first-token KL is at most this")
	f.BoolVar(&gate, "gate", false, "run only the blend gate's self-check (the one cb worker --blend-gate auto runs at start) on the model and print its outcome; exit status 1 when it fails")
	f.Float64Var(&gateKL, "blend-gate-kl", worker.DefaultBlendGateKL, "with --gate: the gate's threshold (mean KL in nats), as cb worker's")
	f.BoolVar(&onStack, "stack", true, "measure the TTFT speedup through a stack cb eval starts (false: only the model-only speedup in this process)")
	f.IntVar(&sc.Repeats, "repeats", eval.DefaultRepeats, "with --stack: times each prompt is sent per configuration, with reuse and as a full prefill (the median TTFT is reported)")
	f.IntVar(&sc.MaxTokens, "max-tokens", eval.DefaultMaxTokens, "with --stack: tokens generated per request")
	f.BoolVar(&verbose, "verbose", false, "with --stack: print the processes' log lines here instead of into a file in the state directory")
	d := model.DefaultConfig()
	f.IntVar(&mcfg.CheckLayer, "check-layer", d.CheckLayer, "CacheBlend check layer")
	f.IntVar(&mcfg.Threads, "threads", 0, "compute threads (0: one per CPU)")
	return withEnv(cmd)
}

// evalModel loads the model cb eval measures and its workload.
func evalModel(path string, cfg model.Config) (*model.Model, string, eval.Prompts, func(), error) {
	if path == "" {
		m, err := model.New(cfg)
		return m, "cb-llama (built-in)", eval.BuiltinPrompts(), func() {}, err
	}
	mf, closeFile, err := openModelFile(path)
	if err != nil {
		return nil, "", eval.Prompts{}, nil, err
	}
	m, err := model.Load(mf.GGUF, cfg)
	if err != nil {
		closeFile()
		return nil, "", eval.Prompts{}, nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, mf.Name, eval.FilePrompts(mf), closeFile, nil
}

// evalGate runs the blend gate's self-check on m (the model of path, the
// built-in one when empty) and prints its outcome; a failed gate is an
// error (exit status 1).
func evalGate(c *cobra.Command, m *model.Model, name, path string, maxKL float64, kvType kvcache.DType) error {
	var tok tokenizer.Tokenizer
	encode, bos := tok.Encode, tok.BOS()
	if path != "" {
		mf, closeFile, err := openModelFile(path)
		if err != nil {
			return err
		}
		defer closeFile()
		encode, bos = mf.Vocab.Encode, -1
		if mf.AddBOS {
			bos = mf.BOS
		}
	}
	r, err := worker.CheckBlendGate(m, encode, bos, maxKL, kvType)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.OutOrStdout(), "blend gate on %s: %s — mean KL %.4g nats from a full prefill (threshold %g), top-1 agreement %.2f, %d prompts, %v\n",
		name, r.Outcome, r.KL, maxKL, r.Top1, r.Cases, r.Duration.Round(time.Millisecond))
	if r.Off != "" {
		return errors.New(r.Off)
	}
	return nil
}

// evalStack starts the stack cb eval measures TTFT on: the model of path
// (empty: the built-in model with cfg's check layer), no prompt stored
// (only the documents: every reuse is of documents computed alone), the
// blend gate forced on (eval measures blending whatever the gate would say) and
// no online quality checks (their full prefills would share the CPU), on
// free loopback ports, tracing as the environment says. The returned func
// closes the log file.
func evalStack(ctx context.Context, path string, cfg model.Config, verbose bool) (*stack.Stack, func(), error) {
	up := stack.UpConfig{
		APIAddr:    "127.0.0.1:0",
		ModelPath:  path,
		EngineArgs: []string{"--no-store"},
		WorkerArgs: []string{"--blend-gate=on", "--quality-sample-rate=0"},
	}
	if cfg.CheckLayer != model.DefaultConfig().CheckLayer {
		up.WorkerArgs = append(up.WorkerArgs, "--check-layer="+strconv.Itoa(cfg.CheckLayer))
	}
	closeLogs := func() {}
	if !verbose {
		logs, err := evalLogFile()
		if err != nil {
			return nil, nil, err
		}
		up.Supervisor.Logs = logs
		closeLogs = func() { _ = logs.Close() }
		fmt.Fprintf(os.Stderr, "logs of the processes: %s (--verbose prints them here)\n", logs.Name())
	}
	t0 := time.Now()
	st, err := stack.Up(ctx, up)
	if err != nil {
		closeLogs()
		return nil, nil, fmt.Errorf("eval: start the stack: %w", err)
	}
	fmt.Fprintf(os.Stderr, "stack up in %.1fs: %s\n", time.Since(t0).Seconds(), st.Endpoints().API())
	return st, closeLogs, nil
}

// evalLogFile opens the file the stack's processes log into: in the logs
// directory of the default state directory, else of a new temporary one.
func evalLogFile() (*os.File, error) {
	dir, err := stack.DefaultStateDir()
	if err != nil {
		if dir, err = os.MkdirTemp("", "cb-eval-"); err != nil {
			return nil, fmt.Errorf("eval: log directory: %w", err)
		}
	}
	return stack.OpenLogFile(dir, "eval")
}
