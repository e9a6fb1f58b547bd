package llamaref

import (
	"errors"
	"time"
)

// BenchOptions are the settings of llama.cpp's benchmark contexts. The zero value is llama.cpp's
// own defaults for a server: 1 thread (set Threads), an F16 KV cache, flash attention "auto" and a
// 512-token micro-batch.
type BenchOptions struct {
	Threads        int    // llama.cpp threads (n_threads = n_threads_batch); <= 0 means 1
	KVType         string // "f16" (default), "f32", "bf16" or "q8_0"
	FlashAttention string // "auto" (default), "on" or "off"
	Batch          int    // tokens per llama_decode (n_batch = n_ubatch); default 512
}

func (o BenchOptions) req(m map[string]any) map[string]any {
	m["threads"] = max(o.Threads, 1)
	if o.KVType != "" {
		m["kvType"] = o.KVType
	}
	switch o.FlashAttention {
	case "on":
		m["flashAttention"] = true
	case "off":
		m["flashAttention"] = false
	default:
		m["flashAttention"] = "auto"
	}
	if o.Batch > 0 {
		m["batch"] = o.Batch
	}
	return m
}

func durations(ms []float64) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, v := range ms {
		out[i] = time.Duration(v * float64(time.Millisecond))
	}
	return out
}

// BenchPrefill times llama.cpp's prefill of tokens (one sequence, from an empty KV cache, logits of
// the last token only) reps times and returns each run's wall time, measured inside the driver
// around its llama_decode calls.
func (r *Ref) BenchPrefill(model string, tokens []int32, reps int, o BenchOptions) ([]time.Duration, error) {
	m, err := absModel(model)
	if err != nil {
		return nil, err
	}
	if len(tokens) == 0 || reps < 1 {
		return nil, errors.New("llamaref: bench_prefill: no tokens or no repetitions")
	}
	var res struct {
		Ms []float64 `json:"ms"`
	}
	if err := r.call("bench_prefill", o.req(map[string]any{"model": m, "tokens": tokens, "reps": reps}), &res); err != nil {
		return nil, err
	}
	return durations(res.Ms), nil
}

// BenchDecode prefills one context per sequence (untimed), then runs len(next) decode steps, each
// feeding sequence s the token next[step][s], all sequences in one llama_decode (so they share the
// pass over the weights). It returns each step's wall time. It is BenchDecodeStart with room for
// len(next) steps, then BenchDecodeMore.
func (r *Ref) BenchDecode(model string, contexts [][]int32, next [][]int32, o BenchOptions) ([]time.Duration, error) {
	if len(next) == 0 {
		return nil, errors.New("llamaref: bench_decode: no steps")
	}
	if err := r.BenchDecodeStart(model, contexts, len(next), o); err != nil {
		return nil, err
	}
	return r.BenchDecodeMore(model, next)
}

// BenchDecodeStart is BenchDecode's untimed part: a context for len(contexts) sequences with room
// for steps more tokens each, every sequence's context prefilled. The context stays for
// [Ref.BenchDecodeMore] until the model's next benchmark or Unload, so that a caller can run the
// steps in rounds between other work (cb bench alternates them with package model's).
func (r *Ref) BenchDecodeStart(model string, contexts [][]int32, steps int, o BenchOptions) error {
	m, err := absModel(model)
	if err != nil {
		return err
	}
	if len(contexts) == 0 || steps < 1 {
		return errors.New("llamaref: bench_decode: no sequences or no steps")
	}
	return r.call("bench_decode_start", o.req(map[string]any{"model": m, "contexts": contexts, "total": steps}), nil)
}

// BenchDecodeMore runs len(next) more decode steps of the sequences [Ref.BenchDecodeStart] set up,
// at the positions after the steps before, and returns each step's wall time. Together the calls
// after one start may run at most its steps.
func (r *Ref) BenchDecodeMore(model string, next [][]int32) ([]time.Duration, error) {
	m, err := absModel(model)
	if err != nil {
		return nil, err
	}
	if len(next) == 0 {
		return nil, errors.New("llamaref: bench_decode: no steps")
	}
	var res struct {
		Ms []float64 `json:"ms"`
	}
	if err := r.call("bench_decode_more", map[string]any{"model": m, "next": next}, &res); err != nil {
		return nil, err
	}
	return durations(res.Ms), nil
}

// RSS returns the driver process's resident memory in bytes (node's process.memoryUsage.rss).
func (r *Ref) RSS() (int64, error) {
	var res struct {
		RSS int64 `json:"rss"`
	}
	if err := r.call("rss", map[string]any{}, &res); err != nil {
		return 0, err
	}
	return res.RSS, nil
}

// Unload drops a model and every context of it from the driver, returning its memory.
func (r *Ref) Unload(model string) error {
	m, err := absModel(model)
	if err != nil {
		return err
	}
	return r.call("unload", map[string]any{"model": m}, nil)
}
