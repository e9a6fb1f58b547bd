package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/internal/llamaref"
	"github.com/cacheblend/cacheblend/llamabench"
)

func init() { subcommands = append(subcommands, newBenchCmd) }

func newBenchCmd() *cobra.Command {
	var (
		cfg               llamabench.Config
		shapes, formats   string
		prompts           string
		vsLlama           bool
		jsonPath, mdPath  string
		flashAttn, kvType string
		cpuProfile        string
		memProfile        string
		llamaCPU          string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the model's prefill, decode, RAG first-token latency and memory on GGUF files of real model shapes, side by side with llama.cpp (--vs-llamacpp)",
		Long: `Measure package model on GGUF files of the shapes people run on CPUs (--shapes: smollm2-135m,
smollm2-360m, qwen2.5-0.5b, llama-3.2-1b; random weights with the real vocabularies) in the formats
they download (--formats: f16, q8_0, q4_k_m, the last with llama-quantize's tensor mixture). The
files are generated once into --dir and reused. Per file: prefill time at each --prompts length,
decode step time at batch 1 (in --decode-rounds rounds; with --vs-llamacpp the engines alternate
round by round, each on its own context, so that both see the same minutes of a shared machine) and
batch 8 (one step feeds eight sequences), the first-token latency of a RAG prompt (three documents
seen before + a question; ours with CacheBlend reuse) and the resident memory. With --vs-llamacpp
the same file, the same tokens and the same --threads run in llama.cpp too (node-llama-cpp 3.21.1's
prebuilt CPU libraries, installed by scripts/deps.sh into CB_REF_DIR; llama.cpp prefills the RAG
prompt whole). Every time is the median of --reps runs after a warm-up. Prints Markdown tables (--markdown writes them to a file too) headed by the machine: CPU,
flags, our kernel level, llama.cpp's CPU backend, FP32 peak per core and memory read bandwidth;
--json writes every figure with min and max.

On a CPU with AVX-512, CB_SIMD=avx2 and --llama-cpu-variant haswell measure both engines as a CPU
with AVX2 only (no AVX-512) would run them; where the CPU has AVX-VNNI our AVX2 level uses it (as
llama.cpp's alderlake backend would), so the haswell comparison is then ours with AVX-VNNI against
llama.cpp without.`,
		RunE: func(c *cobra.Command, _ []string) error {
			if shapes != "" {
				cfg.Shapes = strings.Split(shapes, ",")
			}
			if formats != "" {
				cfg.Formats = strings.Split(formats, ",")
			}
			for _, p := range strings.Split(prompts, ",") {
				if p == "" {
					continue
				}
				n, err := strconv.Atoi(p)
				if err != nil || n <= 0 || n > 8192 {
					return fmt.Errorf("--prompts: %q is not a length in [1, 8192]", p)
				}
				cfg.Prompts = append(cfg.Prompts, n)
			}
			for _, f := range []struct {
				name  string
				v, hi int
			}{{"--reps", cfg.Reps, 100}, {"--decode-steps", cfg.DecodeSteps, 1024}, {"--decode-rounds", cfg.DecodeRounds, 64}, {"--decode-context", cfg.DecodeContext, 8192}, {"--batch-context", cfg.BatchContext, 8192}} {
				if f.v <= 0 || f.v > f.hi {
					return fmt.Errorf("%s: %d is not in [1, %d]", f.name, f.v, f.hi)
				}
			}
			cfg.Llama.FlashAttention = flashAttn
			cfg.Llama.KVType = kvType
			cfg.Log = func(format string, args ...any) { fmt.Fprintf(c.ErrOrStderr(), format+"\n", args...) }
			var ref *llamaref.Ref
			if vsLlama {
				var err error
				if ref, err = llamaref.StartWith(context.Background(), llamaref.StartOptions{CPUVariant: llamaCPU}); err != nil {
					return fmt.Errorf("start llama.cpp (install it with bash scripts/deps.sh): %w", err)
				}
				defer ref.Close()
			} else if llamaCPU != "" {
				return fmt.Errorf("--llama-cpu-variant needs --vs-llamacpp")
			}
			threads := cfg.Threads
			if threads <= 0 {
				threads = llamabench.DefaultThreads()
			}
			mc := llamabench.DetectMachine(threads)
			if ref != nil {
				mc.LlamaCPU = ref.CPUBackend()
			}
			if cpuProfile != "" {
				pf, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				if err := pprof.StartCPUProfile(pf); err != nil {
					pf.Close()
					return err
				}
				defer func() { pprof.StopCPUProfile(); pf.Close() }()
			}
			rs, err := llamabench.Run(cfg, ref)
			if err != nil {
				return err
			}
			if err := llamabench.WriteMarkdown(c.OutOrStdout(), mc, cfg, rs); err != nil {
				return err
			}
			write := func(path string, fn func(*os.File) error) error {
				if path == "" {
					return nil
				}
				f, err := os.Create(path)
				if err != nil {
					return err
				}
				if err := fn(f); err != nil {
					f.Close()
					return err
				}
				return f.Close()
			}
			if err := write(mdPath, func(f *os.File) error { return llamabench.WriteMarkdown(f, mc, cfg, rs) }); err != nil {
				return err
			}
			if err := write(memProfile, func(f *os.File) error { return pprof.Lookup("allocs").WriteTo(f, 0) }); err != nil {
				return err
			}
			return write(jsonPath, func(f *os.File) error { return llamabench.WriteJSON(f, mc, cfg, rs) })
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&shapes, "shapes", "", "comma-separated shapes (default all: smollm2-135m,smollm2-360m,qwen2.5-0.5b,llama-3.2-1b)")
	fl.StringVar(&formats, "formats", "", "comma-separated formats (default f16,q8_0,q4_k_m; also f32)")
	fl.StringVar(&prompts, "prompts", "512,2048", "comma-separated prefill prompt lengths")
	fl.IntVar(&cfg.Threads, "threads", 0, "threads of both engines (default: the number of CPUs)")
	fl.IntVar(&cfg.Reps, "reps", 3, "timed repetitions of each measurement, after one warm-up")
	fl.IntVar(&cfg.DecodeSteps, "decode-steps", 16, "timed decode steps")
	fl.IntVar(&cfg.DecodeRounds, "decode-rounds", 4, "rounds of the batch-1 steps, each after a warm-up step; with --vs-llamacpp the engines alternate round by round")
	fl.IntVar(&cfg.DecodeContext, "decode-context", 512, "context of the batch-1 decode (tokens before the timed steps)")
	fl.IntVar(&cfg.BatchContext, "batch-context", 128, "context of each sequence of the batch-8 decode")
	fl.StringVar(&cfg.Dir, "dir", "", "where the test files are generated and kept (default $XDG_CACHE_HOME/cacheblend/bench)")
	fl.StringVar(&cfg.KVType, "kv-type", "f16", "element type of our side's KV cache: f16 (as cb worker's and llama.cpp's default) or f32")
	fl.BoolVar(&cfg.MapWeights, "map-weights", false, "open the files for our side as a memory mapping (cb worker --map-weights) instead of reading them into huge-page memory as cb worker does")
	fl.BoolVar(&vsLlama, "vs-llamacpp", false, "run llama.cpp on the same files beside ours")
	fl.StringVar(&flashAttn, "llama-flash-attn", "auto", "llama.cpp's flash attention: auto, on or off")
	fl.StringVar(&kvType, "llama-kv-type", "f16", "llama.cpp's KV cache type: f16, f32, bf16 or q8_0")
	fl.StringVar(&llamaCPU, "llama-cpu-variant", "", "the only prebuilt llama.cpp CPU backend llama.cpp may load (haswell: AVX2; default: the best this CPU runs, as ggml picks)")
	fl.StringVar(&jsonPath, "json", "", "write every figure (min, median, max) as JSON to this file")
	fl.StringVar(&mdPath, "markdown", "", "also write the tables to this file")
	fl.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of this process (our side, file generation included) to this file")
	fl.StringVar(&memProfile, "memprofile", "", "write a heap profile of this process at the end (what is in use, and every allocation of the runs: go tool pprof -sample_index=alloc_space) to this file")
	return cmd
}
