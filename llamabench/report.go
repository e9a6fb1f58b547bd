package llamabench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

func perSec(tokens int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(tokens) / d.Seconds()
}

func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// WriteMarkdown writes the results as three Markdown tables (prefill,
// decode, RAG first token and memory), every figure the median of its
// repetitions, ratios ours ÷ llama.cpp (for times, llama.cpp ÷ ours: above
// 1 means we are faster), headed by the machine.
func WriteMarkdown(w io.Writer, mc Machine, cfg Config, rs []Result) error {
	cfg = cfg.withDefaults()
	var b strings.Builder
	llamaCPU := ""
	if mc.LlamaCPU != "" {
		llamaCPU = "; llama.cpp CPU backend " + mc.LlamaCPU
	}
	bwHigh, bwLow, bwN := RunBandwidth(mc, rs)
	fmt.Fprintf(&b, "Machine: %s, %d cores, flags %s; %d threads each; package simd level %s%s; FP32 peak %.0f GFLOP/s per core; memory read bandwidth %.1f GB/s (%d threads; the highest of %d measurements in the run, at its start, before each file's runs and before its batch-1 decode: %.1f–%.1f).\n\n",
		mc.CPU, mc.Cores, strings.Join(mc.Flags, " "), cfg.Threads, mc.SIMD, llamaCPU, mc.PeakGFLOPs, bwHigh, mc.Threads, bwN, bwLow, bwHigh)

	b.WriteString("Prefill, tokens/s (median of the runs):\n\n| model | format | file |")
	for _, p := range cfg.Prompts {
		fmt.Fprintf(&b, " %d: ours | llama.cpp | × |", p)
	}
	b.WriteString("\n|---|---|---|")
	for range cfg.Prompts {
		b.WriteString("---|---|---|")
	}
	b.WriteString("\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %s | %s |", r.Shape.Name, r.Format, mib(r.FileBytes))
		for i, p := range cfg.Prompts {
			o := perSec(p, r.Ours.Prefill[i].Median)
			l := 0.0
			if r.Llama != nil {
				l = perSec(p, r.Llama.Prefill[i].Median)
			}
			fmt.Fprintf(&b, " %.0f | %s | %s |", o, num(l, "%.0f"), ratio(o, l))
		}
		b.WriteString("\n")
	}

	fmt.Fprintf(&b, "\nDecode, tokens/s (median step; batch 1 after a %d-token context, batch %d aggregate, each sequence after %d tokens); \"of bw\" is the bytes a step reads (the weights, and the K and V of the positions it attends to) ÷ step time ÷ the run's highest measured bandwidth, then ÷ the bandwidth measured just before the batch-1 steps, which alternate between the engines in %d rounds (same minutes):\n\n", cfg.DecodeContext, cfg.BatchSeqs, cfg.BatchContext, cfg.DecodeRounds)
	fmt.Fprintf(&b, "| model | format | batch 1: ours | llama.cpp | × | ours of bw: highest / same minute | llama.cpp of bw: highest / same minute | batch %d: ours | llama.cpp | × |\n|---|---|---|---|---|---|---|---|---|---|\n", cfg.BatchSeqs)
	for _, r := range rs {
		o1 := perSec(1, r.Ours.Decode1.Median)
		on := perSec(cfg.BatchSeqs, r.Ours.DecodeN.Median)
		var l1, ln float64
		if r.Llama != nil {
			l1 = perSec(1, r.Llama.Decode1.Median)
			ln = perSec(cfg.BatchSeqs, r.Llama.DecodeN.Median)
		}
		// of is the step's read rate as a fraction of bw ("–" unmeasured).
		of := func(kv int64, tps, bw float64) string {
			if tps <= 0 || bw <= 0 {
				return "–"
			}
			return fmt.Sprintf("%.2f", float64(r.StepBytes+kv)*tps/1e9/bw)
		}
		lbw, lkv := 0.0, int64(0)
		if r.Llama != nil {
			lbw, lkv = r.Llama.Decode1BandwidthGBs, r.Llama.Decode1KVBytes
		}
		okv := r.Ours.Decode1KVBytes
		fmt.Fprintf(&b, "| %s | %s | %.1f | %s | %s | %s / %s | %s / %s | %.1f | %s | %s |\n", r.Shape.Name, r.Format, o1, num(l1, "%.1f"), ratio(o1, l1),
			of(okv, o1, bwHigh), of(okv, o1, r.Ours.Decode1BandwidthGBs), of(lkv, l1, bwHigh), of(lkv, l1, lbw), on, num(ln, "%.1f"), ratio(on, ln))
	}

	fmt.Fprintf(&b, "\nRAG first token (%d documents of %d tokens seen before + %d question tokens; ours blends the stored KV with CacheBlend at the default recompute ratio, llama.cpp prefills the prompt) and resident memory (RSS after the runs − before loading; ours against file + our KV cache):\n\n", cfg.RAGDocs, cfg.RAGDocLen, cfg.RAGQuestion)
	b.WriteString("| model | format | TTFT ours | llama.cpp | × | RSS ours (Go heap) | ours ÷ (file + KV) | RSS llama.cpp | llama.cpp ÷ (file + KV) |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		o := r.Ours.RAG.Median
		var l time.Duration
		lrss, lrat := "–", "–"
		if r.Llama != nil {
			l = r.Llama.RAG.Median
			lrss = mib(r.Llama.RSS)
			lrat = fmt.Sprintf("%.2f", float64(r.Llama.RSS)/float64(r.FileBytes+r.Llama.KVBytes))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s (%s) | %.2f | %s | %s |\n", r.Shape.Name, r.Format, ms(o), ms(l), ratio(l.Seconds(), o.Seconds()),
			mib(r.Ours.RSS), mib(r.Ours.GoHeap), float64(r.Ours.RSS)/float64(r.FileBytes+r.Ours.KVBytes), lrss, lrat)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func num(v float64, f string) string {
	if v <= 0 {
		return "–"
	}
	return fmt.Sprintf(f, v)
}

func ms(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000)
}

// Report is the JSON form of a run: the machine, the settings and every
// result with min, median and max of each figure.
type Report struct {
	Machine Machine  `json:"machine"`
	Config  Config   `json:"config"`
	Results []Result `json:"results"`
}

// WriteJSON writes the run as indented JSON.
func WriteJSON(w io.Writer, mc Machine, cfg Config, rs []Result) error {
	cfg = cfg.withDefaults()
	cfg.Log = nil
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(Report{Machine: mc, Config: cfg, Results: rs})
}
