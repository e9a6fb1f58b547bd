package llamaref

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// TopK is one entry of a next-token distribution: a token id and its natural-log probability.
type TopK struct {
	ID      int32
	LogProb float64
}

// EvalOptions configure how the reference evaluates a sequence. The zero value is 1 thread, an
// F32 KV cache and flash attention off (the plainest arithmetic llama.cpp offers; llama.cpp's own
// defaults are an F16 KV cache and automatic flash attention).
type EvalOptions struct {
	// Threads is llama.cpp's n_threads and n_threads_batch; <= 0 means 1.
	Threads int
	// KVType is the KV cache type: "f32" (default), "f16", "bf16" or "q8_0".
	KVType string
	// FlashAttention enables llama.cpp's flash-attention kernels.
	FlashAttention bool
	// Batch is the number of tokens per llama_decode call (n_batch = n_ubatch); <= 0 means the
	// whole sequence (the prompt, for Greedy) in one call.
	Batch int
}

func (o EvalOptions) req(m map[string]any) map[string]any {
	m["threads"] = o.Threads
	if o.KVType != "" {
		m["kvType"] = o.KVType
	}
	m["flashAttention"] = o.FlashAttention
	if o.Batch > 0 {
		m["batch"] = o.Batch
	}
	return m
}

// LogProbRow is the next-token distribution at one position: the k most likely tokens (log
// probability descending, lower id first on ties) and the log probabilities of the asked ids.
type LogProbRow struct {
	Top []TopK
	IDs []float64
}

func checkEvalArgs(tokens []int32, positions []int) error {
	if len(tokens) == 0 {
		return errors.New("llamaref: no tokens to evaluate")
	}
	if len(positions) == 0 {
		return errors.New("llamaref: no positions asked")
	}
	for _, p := range positions {
		if p < 0 || p >= len(tokens) {
			return fmt.Errorf("llamaref: position %d out of range [0, %d)", p, len(tokens))
		}
	}
	return nil
}

// LogProbs evaluates tokens as one sequence from an empty context and returns, for every i in
// positions (0-based indices into tokens), the k most likely next tokens after tokens[:i+1]
// (the distribution of token i+1) with their log-softmax log probabilities, descending. threads
// is llama.cpp's thread count (<= 0 means 1); the other options are EvalOptions' defaults.
func (r *Ref) LogProbs(model string, tokens []int32, positions []int, k int, threads int) ([][]TopK, error) {
	rows, err := r.LogProbsWith(model, tokens, positions, k, nil, EvalOptions{Threads: threads})
	if err != nil {
		return nil, err
	}
	out := make([][]TopK, len(rows))
	for i := range rows {
		out[i] = rows[i].Top
	}
	return out, nil
}

// LogProbsWith is LogProbs with the log probabilities of ids at every position as well, and all
// evaluation options.
func (r *Ref) LogProbsWith(model string, tokens []int32, positions []int, k int, ids []int32, o EvalOptions) ([]LogProbRow, error) {
	m, err := absModel(model)
	if err != nil {
		return nil, err
	}
	if err := checkEvalArgs(tokens, positions); err != nil {
		return nil, err
	}
	if k < 0 {
		k = 0
	}
	if ids == nil {
		ids = []int32{}
	}
	var res struct {
		Rows []struct {
			Top [][2]float64 `json:"top"`
			IDs []float64    `json:"ids"`
		} `json:"rows"`
	}
	req := o.req(map[string]any{"model": m, "tokens": tokens, "positions": positions, "mode": "logprobs", "k": k, "ids": ids})
	if err := r.call("eval", req, &res); err != nil {
		return nil, err
	}
	if len(res.Rows) != len(positions) {
		return nil, fmt.Errorf("llamaref: eval: %d rows for %d positions", len(res.Rows), len(positions))
	}
	out := make([]LogProbRow, len(res.Rows))
	for i, row := range res.Rows {
		out[i].Top = make([]TopK, len(row.Top))
		for j, t := range row.Top {
			out[i].Top[j] = TopK{ID: int32(t[0]), LogProb: t[1]}
		}
		out[i].IDs = row.IDs
		if len(out[i].IDs) != len(ids) {
			return nil, fmt.Errorf("llamaref: eval: %d id log-probabilities for %d ids", len(out[i].IDs), len(ids))
		}
	}
	return out, nil
}

// Logits evaluates tokens like LogProbs and returns the full logit vector (n_vocab float32s) at
// each asked position, shifted so that its maximum is 0 (raw logit minus the row's max; see the
// package doc for why and how precise). threads <= 0 means 1.
func (r *Ref) Logits(model string, tokens []int32, positions []int, threads int) ([][]float32, error) {
	rows, err := r.LogitsWith(model, tokens, positions, EvalOptions{Threads: threads})
	if err != nil {
		return nil, err
	}
	out := make([][]float32, len(rows))
	for i, row := range rows {
		out[i] = make([]float32, len(row))
		for j, v := range row {
			out[i][j] = float32(v)
		}
	}
	return out, nil
}

// LogitsWith is Logits in float64 with all evaluation options.
func (r *Ref) LogitsWith(model string, tokens []int32, positions []int, o EvalOptions) ([][]float64, error) {
	m, err := absModel(model)
	if err != nil {
		return nil, err
	}
	if err := checkEvalArgs(tokens, positions); err != nil {
		return nil, err
	}
	var res struct {
		Rows []string `json:"rows"`
	}
	req := o.req(map[string]any{"model": m, "tokens": tokens, "positions": positions, "mode": "logits"})
	if err := r.call("eval", req, &res); err != nil {
		return nil, err
	}
	if len(res.Rows) != len(positions) {
		return nil, fmt.Errorf("llamaref: eval: %d rows for %d positions", len(res.Rows), len(positions))
	}
	return decodeRows(res.Rows)
}

// decodeRows decodes base64 little-endian float64 rows.
func decodeRows(rows []string) ([][]float64, error) {
	out := make([][]float64, len(rows))
	for i, s := range rows {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b)%8 != 0 {
			return nil, fmt.Errorf("llamaref: eval: bad logits row %d", i)
		}
		row := make([]float64, len(b)/8)
		for j := range row {
			row[j] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*j:]))
		}
		out[i] = row
	}
	return out, nil
}

// Greedy evaluates prompt from an empty context and then decodes n tokens greedily: each step
// takes llama.cpp's greedy sampler's choice (argmax of the raw logits, the lowest id on ties; no
// temperature, penalties or seed) and feeds it back. It always returns exactly n tokens: it does
// not stop at end-of-generation tokens (cut at the first id in ModelInfo's "eog" if needed).
// threads <= 0 means 1.
func (r *Ref) Greedy(model string, prompt []int32, n int, threads int) ([]int32, error) {
	return r.GreedyWith(model, prompt, n, EvalOptions{Threads: threads})
}

// GreedyWith is Greedy with all evaluation options.
func (r *Ref) GreedyWith(model string, prompt []int32, n int, o EvalOptions) ([]int32, error) {
	m, err := absModel(model)
	if err != nil {
		return nil, err
	}
	if len(prompt) == 0 {
		return nil, errors.New("llamaref: greedy: empty prompt")
	}
	if n < 0 || n > 1<<20 {
		return nil, fmt.Errorf("llamaref: greedy: bad token count %d", n)
	}
	var res struct {
		Tokens []int32 `json:"tokens"`
	}
	if err := r.call("greedy", o.req(map[string]any{"model": m, "prompt": prompt, "n": n}), &res); err != nil {
		return nil, err
	}
	if len(res.Tokens) != n {
		return nil, fmt.Errorf("llamaref: greedy: %d tokens for %d asked", len(res.Tokens), n)
	}
	return res.Tokens, nil
}
