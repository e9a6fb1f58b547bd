package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/eval"
	"github.com/cacheblend/cacheblend/model"
)

func init() { subcommands = append(subcommands, newEvalCmd) }

func newEvalCmd() *cobra.Command {
	var (
		cfg                    eval.Config
		mcfg                   model.Config
		modelPath, docsDir, qs string
		jsonPath, svgPath      string
		maxKL                  float64
	)
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Measure CacheBlend's quality beside its speed on a model: KL from a full prefill and prefill speedup per recompute ratio and selection rule",
		Long: `Measure CacheBlend's two numbers on the built-in model or a GGUF file (--model): RAG prompts
(the sample documents, or --documents DIR with --questions FILE, at varying offsets of chat-templated
prompts) are run as a full prefill and blended — every document computed alone, moved into place
with K re-rotated, then CacheBlend's selective recompute — at every recompute ratio (--ratios) with
two selection rules: the check layer's KV deviation (HKVD, CacheBlend's) and random tokens at the
same ratio; ratio 0 is full reuse without recompute. Printed per configuration: KL(full ‖ blend) of
the next-token distribution at the first output token and over the first K tokens (both fed the
full prefill's greedy continuation), top-1 agreement, the share of prompts whose K greedy tokens
match, and the model-only prefill speedup (full prefill time over blended forward time, in this
process). --json writes the report, --svg a chart of quality loss against speedup.`,
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
			rep, err := eval.Run(m, name, prompts, cfg)
			if err != nil {
				return err
			}
			out := c.OutOrStdout()
			if err := rep.WriteTable(out); err != nil {
				return err
			}
			for _, rule := range []string{"hkvd", "random"} {
				if p, ok := rep.Cheapest(rule, maxKL); ok {
					fmt.Fprintf(out, "\n%s: the fastest configuration with first-token KL <= %g is ratio %g: %.2fx (KL %.5f)", rule, maxKL, p.Ratio, p.Speedup, p.FirstKL)
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
	f.StringVar(&docsDir, "documents", "", "directory of *.txt documents (default: the sample corpus)")
	f.StringVar(&qs, "questions", "", "file of questions, one per line")
	f.StringVar(&jsonPath, "json", "", "write the report as JSON to this file")
	f.StringVar(&svgPath, "svg", "", "write the chart (quality loss against speedup) as SVG to this file")
	f.Float64Var(&maxKL, "max-kl", 0.01, "report the fastest configuration whose mean first-token KL is at most this")
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
