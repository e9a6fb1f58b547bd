package llamabench

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/internal/llamaref"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/modelfile"
	"github.com/cacheblend/cacheblend/offheap"
	"github.com/cacheblend/cacheblend/quality"
	"github.com/cacheblend/cacheblend/reuseplan"
)

// Config sets what [Run] measures. Every zero field takes its default.
type Config struct {
	Dir      string   // test files; default $XDG_CACHE_HOME/cacheblend/bench (~/.cache/…)
	VocabDir string   // llama.cpp's vocabulary files; default llama.cpp's models/ in the reference directory
	Shapes   []string // shape names; default every one of Shapes()
	Formats  []string // default Formats()
	Threads  int      // threads of both engines; default runtime.NumCPU()
	Reps     int      // timed repetitions after one warm-up; default 3
	Prompts  []int    // prefill prompt lengths; default 512 and 2,048
	// Chunk is the tokens package model computes per forward of a prompt
	// (the engine's scheduler cuts prefills into steps of its
	// StepTokenBudget, 512 by default; llama.cpp's micro-batch is 512
	// too); default 512.
	Chunk int
	// MapWeights opens the files of package model as a memory mapping
	// instead of reading them into huge-page memory as cb worker does
	// (cb worker --map-weights); default false.
	MapWeights bool
	// KVType is the element type of package model's KV cache: "f16" (the
	// default, as cb worker's and llama.cpp's) or "f32".
	KVType string

	DecodeContext int // context of the batch-1 decode; default 512
	DecodeSteps   int // timed decode steps (batch 1: at least; batch N: after one warm-up step); default 16
	// DecodeRounds is the rounds the batch-1 steps run in (at most
	// DecodeSteps; each round a warm-up step and DecodeSteps/DecodeRounds
	// timed steps, rounded up); with llama.cpp the engines alternate round
	// by round on the one context each, so that both engines' steps share
	// the minutes of a shared machine. Default 4.
	DecodeRounds int
	BatchSeqs    int // sequences of the batched decode; default 8
	BatchContext int // context of each of them; default 128

	RAGDocs     int // documents of the RAG prompt; default 3
	RAGDocLen   int // tokens per document; default 600
	RAGQuestion int // tokens after the documents; default 200

	// Llama sets llama.cpp's context options; Threads is Config.Threads.
	Llama llamaref.BenchOptions
	// Log, when set, gets a line per step.
	Log func(format string, args ...any) `json:"-"`
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.Dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		c.Dir = filepath.Join(base, "cacheblend", "bench")
	}
	if c.VocabDir == "" {
		if src, err := llamaref.LlamaCppSource(); err == nil {
			c.VocabDir = filepath.Join(src, "models")
		}
	}
	if len(c.Shapes) == 0 {
		for _, s := range Shapes() {
			c.Shapes = append(c.Shapes, s.Name)
		}
	}
	if len(c.Formats) == 0 {
		c.Formats = Formats()
	}
	def(&c.Threads, runtime.NumCPU())
	def(&c.Reps, 3)
	if len(c.Prompts) == 0 {
		c.Prompts = []int{512, 2048}
	}
	def(&c.Chunk, 512)
	c.KVType = cmp.Or(c.KVType, "f16")
	def(&c.DecodeContext, 512)
	def(&c.DecodeSteps, 16)
	def(&c.DecodeRounds, 4)
	c.DecodeRounds = min(c.DecodeRounds, c.DecodeSteps)
	def(&c.BatchSeqs, 8)
	def(&c.BatchContext, 128)
	def(&c.RAGDocs, 3)
	def(&c.RAGDocLen, 600)
	def(&c.RAGQuestion, 200)
	c.Llama.Threads = c.Threads
	if c.Log == nil {
		c.Log = func(string, ...any) {}
	}
	return c
}

// Stat summarises repeated timings.
type Stat struct {
	Min, Median, Max time.Duration
	N                int
}

func statOf(d []time.Duration) Stat {
	if len(d) == 0 {
		return Stat{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return Stat{Min: s[0], Median: s[len(s)/2], Max: s[len(s)-1], N: len(s)}
}

// Side is one engine's figures on one file.
type Side struct {
	Prefill []Stat // per Config.Prompts
	Decode1 Stat   // a decode step at batch 1
	DecodeN Stat   // a decode step of Config.BatchSeqs sequences
	RAG     Stat   // first-token latency of the RAG prompt
	RSS     int64  // resident memory after the runs minus before the model was loaded, bytes
	KVBytes int64  // the KV cache the engine held, bytes
	// Decode1BandwidthGBs is the memory read bandwidth measured just
	// before the batch-1 decode (the contexts filled; the same threads,
	// as Machine.BandwidthGBs): the bandwidth of the minutes the steps ran
	// in, where Result.BandwidthGBs is that of the file's start. With
	// llama.cpp both engines' steps alternate after the one reading, and
	// both sides hold it.
	Decode1BandwidthGBs float64
	// Decode1KVBytes is the bytes of K and V the engine's mean batch-1
	// step reads: every layer's keys and values of the positions it
	// attends to (the timed steps' mean context), at the engine's KV
	// element size. It counts the positions attended alone, though
	// llama.cpp reads its cells in multiples of 256 (masked).
	Decode1KVBytes int64
	// GoHeap is, for package model, the Go heap's share of RSS after the
	// runs: bytes in use (runtime.MemStats.HeapInuse) plus freed bytes
	// not yet returned to the OS (HeapIdle − HeapReleased); the rest of
	// RSS is the file's mapped pages and the KV cache.
	GoHeap int64
}

// Result is one file's figures.
type Result struct {
	Shape     Shape
	Format    string
	File      string
	FileBytes int64
	// StepBytes is the bytes of weights one decode step reads: every
	// tensor but the embedding table (of which it reads one row per
	// token), which counts when it is also the LM head. A step also reads
	// its context's K and V (Side.Decode1KVBytes).
	StepBytes int64
	RAGTokens int // tokens of the RAG prompt
	RAGReused int // of which reused from the documents' stored KV (ours)
	// BandwidthGBs is the memory read bandwidth measured just before this
	// file's runs (as Machine.BandwidthGBs): a shared machine's varies
	// from minute to minute, and the report divides by the highest of the
	// run (RunBandwidth).
	BandwidthGBs float64
	Ours         Side
	Llama        *Side // nil when llama.cpp was not run
}

// inputs are the token ids of one file's runs, shared by both engines.
type inputs struct {
	prompts   [][]int32
	decodeCtx []int32
	decode1   [][]int32 // [step][1]: Config.DecodeRounds rounds of a warm-up and the timed steps
	batchCtx  [][]int32 // [seq]
	decodeN   [][]int32 // [step][seq]
	docs      [][]int32
	rag       []int32
}

func newInputs(cfg Config, vocab int, seed uint64) inputs {
	rng := rand.New(rand.NewPCG(seed, 0xBE7C4))
	toks := func(n int) []int32 {
		t := make([]int32, n)
		for i := range t {
			t[i] = int32(rng.IntN(vocab))
		}
		return t
	}
	var in inputs
	for _, n := range cfg.Prompts {
		in.prompts = append(in.prompts, toks(n))
	}
	in.decodeCtx = toks(cfg.DecodeContext)
	for range cfg.DecodeSteps + 1 {
		in.decodeN = append(in.decodeN, toks(cfg.BatchSeqs))
	}
	for range cfg.DecodeRounds * (cfg.decode1PerRound() + 1) {
		in.decode1 = append(in.decode1, toks(1))
	}
	for range cfg.BatchSeqs {
		in.batchCtx = append(in.batchCtx, toks(cfg.BatchContext))
	}
	for range cfg.RAGDocs {
		d := toks(cfg.RAGDocLen)
		in.docs = append(in.docs, d)
		in.rag = append(in.rag, d...)
	}
	in.rag = append(in.rag, toks(cfg.RAGQuestion)...)
	return in
}

// decode1PerRound is the timed batch-1 steps of a round (after its
// warm-up step): DecodeSteps ÷ DecodeRounds, rounded up.
func (c Config) decode1PerRound() int { return (c.DecodeSteps + c.DecodeRounds - 1) / c.DecodeRounds }

// Run generates (or reuses) every test file of cfg and measures package
// model on each, and llama.cpp on each when ref is not nil, one engine at a
// time. It stops at the first error.
func Run(cfg Config, ref *llamaref.Ref) ([]Result, error) {
	cfg = cfg.withDefaults()
	if _, ok := llamaKVBytes[cfg.Llama.KVType]; !ok {
		return nil, fmt.Errorf("llamabench: llama.cpp KV cache type %q: want f16, f32, bf16 or q8_0", cfg.Llama.KVType)
	}
	if cfg.VocabDir == "" {
		return nil, errors.New("llamabench: no vocabulary directory: install the reference (bash scripts/deps.sh) or set Config.VocabDir")
	}
	var out []Result
	for _, name := range cfg.Shapes {
		s, err := ShapeByName(name)
		if err != nil {
			return nil, err
		}
		for _, format := range cfg.Formats {
			t0 := time.Now()
			path, err := Generate(cfg.Dir, cfg.VocabDir, s, format)
			if err != nil {
				return nil, err
			}
			cfg.Log("%s %s: file ready in %s (%s)", s.Name, format, time.Since(t0).Round(time.Millisecond), path)
			r, err := runFile(cfg, s, format, path, ref)
			if err != nil {
				return nil, fmt.Errorf("llamabench: %s: %w", FileName(s, format), err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func runFile(cfg Config, s Shape, format, path string, ref *llamaref.Ref) (Result, error) {
	r := Result{Shape: s, Format: format, File: path}
	f, err := gguf.Open(path)
	if err != nil {
		return r, err
	}
	toks, err := f.Strings("tokenizer.ggml.tokens")
	if err != nil {
		f.Close()
		return r, err
	}
	_, hasOut := f.Tensor("output.weight")
	for _, t := range f.Tensors {
		r.FileBytes += t.Size
		if t.Name != "token_embd.weight" || !hasOut {
			r.StepBytes += t.Size
		}
	}
	f.Close()
	if st, err := os.Stat(path); err == nil {
		r.FileBytes = st.Size()
	}
	r.BandwidthGBs = measureBandwidth(cfg.Threads, 1<<30)
	in := newInputs(cfg, len(toks), uint64(s.Dim)*31+uint64(len(format)))
	r.RAGTokens = len(in.rag)
	var peer *llamaDecode1
	if ref != nil {
		// llama.cpp's batch-1 context, filled before our side starts: its
		// steps run in rounds between ours.
		if peer, err = startLlamaDecode1(cfg, ref, path, in); err != nil {
			return r, fmt.Errorf("llama.cpp: %w", err)
		}
	}
	if r.Ours, r.RAGReused, err = runOurs(cfg, path, in, peer); err != nil {
		return r, fmt.Errorf("ours: %w", err)
	}
	cfg.Log("%s %s: ours done", s.Name, format)
	if ref != nil {
		side, err := runLlama(cfg, ref, path, in, s, peer, r.Ours.Decode1BandwidthGBs)
		if err != nil {
			return r, fmt.Errorf("llama.cpp: %w", err)
		}
		r.Llama = &side
		cfg.Log("%s %s: llama.cpp done", s.Name, format)
	}
	return r, nil
}

// rss is the process's resident memory in bytes (/proc/self/status VmRSS;
// 0 where there is none).
func rss() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

const blockSize = 16

func blocksFor(n int) int { return (n + blockSize - 1) / blockSize }

func blockRange(first, n int) []int32 {
	bt := make([]int32, n)
	for i := range bt {
		bt[i] = int32(first + i)
	}
	return bt
}

// timeReps runs fn once to warm up, then cfg.Reps times timed.
func timeReps(reps int, fn func() error) (Stat, error) {
	if err := fn(); err != nil {
		return Stat{}, err
	}
	var d []time.Duration
	for range reps {
		t0 := time.Now()
		if err := fn(); err != nil {
			return Stat{}, err
		}
		d = append(d, time.Since(t0))
	}
	return statOf(d), nil
}

// llamaDecode1 is llama.cpp's batch-1 decode, run in rounds between ours
// (runOurs calls round after each of its own).
type llamaDecode1 struct {
	ref   *llamaref.Ref
	path  string
	rss0  int64           // the driver's resident memory before the model was loaded
	steps []time.Duration // the timed steps (every round's first dropped)
}

// startLlamaDecode1 loads the model into llama.cpp and fills its batch-1
// context, for all of in.decode1's steps.
func startLlamaDecode1(cfg Config, ref *llamaref.Ref, path string, in inputs) (*llamaDecode1, error) {
	rss0, err := ref.RSS()
	if err != nil {
		return nil, err
	}
	if err := ref.BenchDecodeStart(path, [][]int32{in.decodeCtx}, len(in.decode1), cfg.Llama); err != nil {
		return nil, err
	}
	return &llamaDecode1{ref: ref, path: path, rss0: rss0}, nil
}

// round runs next's steps (the first a warm-up).
func (l *llamaDecode1) round(next [][]int32) error {
	d, err := l.ref.BenchDecodeMore(l.path, next)
	if err != nil {
		return err
	}
	l.steps = append(l.steps, d[1:]...)
	return nil
}

// runOurs measures package model on the file at path; peer, when not nil,
// runs its batch-1 rounds between ours.
func runOurs(cfg Config, path string, in inputs, peer *llamaDecode1) (side Side, reused int, err error) {
	debug.FreeOSMemory()
	rss0 := rss()
	var opts []gguf.OpenOption
	if !cfg.MapWeights {
		opts = append(opts, gguf.Resident()) // as cb worker opens it
	}
	// Opened as cb worker opens it: the weights, and the tokenizer and chat
	// template (modelfile.Open), whose memory counts as llama.cpp's does.
	mf, err := modelfile.Open(path, opts...)
	if err != nil {
		return side, 0, err
	}
	defer mf.Close()
	m, err := model.Load(mf.GGUF, model.Config{Threads: cfg.Threads})
	if err != nil {
		return side, 0, err
	}
	debug.FreeOSMemory() // the loading's garbage, as cb worker returns it after loading
	// The cache: a prompt area (the longest prompt, the RAG prompt or the
	// decode context), BatchSeqs sequence areas and one area per document.
	promptLen := max(slices.Max(cfg.Prompts), len(in.rag), cfg.DecodeContext+cfg.DecodeSteps+1)
	promptBlocks := blocksFor(promptLen)
	seqBlocks := blocksFor(cfg.BatchContext + cfg.DecodeSteps + 1)
	docBlocks := blocksFor(cfg.RAGDocLen)
	total := promptBlocks + cfg.BatchSeqs*seqBlocks + cfg.RAGDocs*docBlocks
	dt, err := kvcache.ParseDType(cfg.KVType)
	if err != nil {
		return side, 0, err
	}
	kv, err := kvcache.Create("", m.Config().KVLayout(total, blockSize, dt))
	if err != nil {
		return side, 0, err
	}
	defer kv.Close()
	side.KVBytes = kv.Layout().Bytes()
	prompt := blockRange(0, promptBlocks)
	// The logits go into one reused buffer outside the Go heap, as cb
	// worker's prefill chunks and decode steps do.
	logits, err := offheap.Floats(cfg.BatchSeqs * m.Config().Vocab)
	if err != nil {
		return side, 0, err
	}
	defer offheap.Free(logits)
	// prefill computes toks in chunks of cfg.Chunk, as the engine does.
	prefill := func(toks, bt []int32) error {
		for s := 0; s < len(toks); s += cfg.Chunk {
			e := min(len(toks), s+cfg.Chunk)
			if _, err := m.Prefill(kv, model.PrefillInput{Tokens: toks[s:e], Start: s, BlockTable: bt, Into: logits}); err != nil {
				return err
			}
		}
		return nil
	}

	for _, p := range in.prompts {
		st, err := timeReps(cfg.Reps, func() error { return prefill(p, prompt) })
		if err != nil {
			return side, 0, err
		}
		side.Prefill = append(side.Prefill, st)
	}

	// Decode, batch 1.
	if err := prefill(in.decodeCtx, prompt); err != nil {
		return side, 0, err
	}
	side.Decode1BandwidthGBs = measureBandwidth(cfg.Threads, 1<<30)
	var steps []time.Duration
	per := cfg.decode1PerRound() + 1
	for r := range cfg.DecodeRounds {
		round := in.decode1[r*per : (r+1)*per]
		for i, t := range round {
			t0 := time.Now()
			if err := m.DecodeInto(kv, []model.DecodeInput{{Token: t[0], Pos: len(in.decodeCtx) + r*per + i, BlockTable: prompt}}, logits); err != nil {
				return side, 0, err
			}
			if i > 0 {
				steps = append(steps, time.Since(t0))
			}
		}
		if peer != nil {
			if err := peer.round(round); err != nil {
				return side, 0, fmt.Errorf("llama.cpp's round %d: %w", r, err)
			}
		}
	}
	side.Decode1 = statOf(steps)
	side.Decode1KVBytes = decode1Positions(cfg) * kv.Layout().TokenBytes()

	// Decode, BatchSeqs sequences in one step.
	seqs := make([][]int32, cfg.BatchSeqs)
	for q := range seqs {
		seqs[q] = blockRange(promptBlocks+q*seqBlocks, seqBlocks)
		if err := prefill(in.batchCtx[q], seqs[q]); err != nil {
			return side, 0, err
		}
	}
	steps = steps[:0]
	batch := make([]model.DecodeInput, cfg.BatchSeqs)
	for i, ts := range in.decodeN {
		for q := range batch {
			batch[q] = model.DecodeInput{Token: ts[q], Pos: cfg.BatchContext + i, BlockTable: seqs[q]}
		}
		t0 := time.Now()
		if err := m.DecodeInto(kv, batch, logits); err != nil {
			return side, 0, err
		}
		if i > 0 {
			steps = append(steps, time.Since(t0))
		}
	}
	side.DecodeN = statOf(steps)

	// RAG: every document prefilled alone at positions 0.. (seen before,
	// untimed), then per run: their KV copied into the prompt's blocks at
	// their positions (re-RoPE'd, the blend server's retrieve) and the
	// CacheBlend forward — both timed.
	docs := make([][]int32, len(in.docs))
	var ranges []reuseplan.Range
	off := 0
	for d, doc := range in.docs {
		docs[d] = blockRange(promptBlocks+cfg.BatchSeqs*seqBlocks+d*docBlocks, docBlocks)
		if err := prefill(doc, docs[d]); err != nil {
			return side, 0, err
		}
		ranges = append(ranges, reuseplan.Range{Start: off, End: off + len(doc)})
		off += len(doc)
	}
	bin := model.BlendInput{Tokens: in.rag, BlockTable: prompt, Reused: ranges, CheckLayer: model.UseConfig, RecompRatio: model.UseConfig}
	side.RAG, err = timeReps(cfg.Reps, func() error {
		for d, r := range ranges {
			quality.MoveKV(m, kv, docs[d], prompt, r.Start, r.End-r.Start)
		}
		_, _, err := m.BlendForward(kv, bin)
		return err
	})
	if err != nil {
		return side, 0, err
	}
	for _, r := range ranges {
		reused += r.End - r.Start
	}
	side.RSS = rss() - rss0
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	side.GoHeap = int64(ms.HeapInuse + ms.HeapIdle - ms.HeapReleased)
	runtime.KeepAlive(m)
	runtime.KeepAlive(mf)
	return side, reused, nil
}

// runLlama measures llama.cpp on the file at path after its batch-1
// rounds ran (peer) between ours, after the bandwidth reading bw.
func runLlama(cfg Config, ref *llamaref.Ref, path string, in inputs, s Shape, peer *llamaDecode1, bw float64) (Side, error) {
	perPos := llamaTokenBytes(s, cfg.Llama.KVType)
	side := Side{Decode1: statOf(peer.steps), Decode1BandwidthGBs: bw, Decode1KVBytes: decode1Positions(cfg) * perPos}
	rss0 := peer.rss0
	drop := func(d []time.Duration) Stat { return statOf(d[1:]) }
	for _, p := range in.prompts {
		d, err := ref.BenchPrefill(path, p, cfg.Reps+1, cfg.Llama)
		if err != nil {
			return side, err
		}
		side.Prefill = append(side.Prefill, drop(d))
	}
	d, err := ref.BenchDecode(path, in.batchCtx, in.decodeN, cfg.Llama)
	if err != nil {
		return side, err
	}
	side.DecodeN = drop(d)
	if d, err = ref.BenchPrefill(path, in.rag, cfg.Reps+1, cfg.Llama); err != nil {
		return side, err
	}
	side.RAG = drop(d)
	rss1, err := ref.RSS()
	if err != nil {
		return side, err
	}
	side.RSS = rss1 - rss0
	// The last context: the RAG prompt's cells, K and V.
	cells := (len(in.rag) + 255) / 256 * 256
	side.KVBytes = int64(cells) * perPos
	return side, ref.Unload(path)
}

// DefaultThreads is the thread count Run uses when Config.Threads is 0.
func DefaultThreads() int { return runtime.NumCPU() }

// decode1Positions is the positions the mean timed batch-1 step of cfg
// attends to: a step at position p attends to p+1, and the timed steps
// are every round's after its warm-up, at positions DecodeContext + r·per
// + i (i ≥ 1).
func decode1Positions(cfg Config) int64 {
	per := cfg.decode1PerRound() + 1
	var sum, n int64
	for r := range cfg.DecodeRounds {
		for i := 1; i < per; i++ {
			sum += int64(cfg.DecodeContext + r*per + i + 1)
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / n
}

// llamaKVBytes is, per llama.cpp KV cache type Run accepts ("" is its
// default, f16), the bytes 32 values occupy: q8_0 stores 34.
var llamaKVBytes = map[string]int64{"": 64, "f16": 64, "bf16": 64, "f32": 128, "q8_0": 34}

// llamaTokenBytes is the bytes one position of llama.cpp's KV cache
// occupies on shape s, K and V of every layer, for its cache type kvType
// (one of llamaKVBytes's; Run checks it).
func llamaTokenBytes(s Shape, kvType string) int64 {
	return int64(2*s.Layers*s.KVHeads*(s.Dim/s.Heads)) * llamaKVBytes[kvType] / 32
}
