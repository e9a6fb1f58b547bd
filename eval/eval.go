package eval

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/chat"
	"github.com/cacheblend/cacheblend/corpus"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/modelfile"
	"github.com/cacheblend/cacheblend/quality"
	"github.com/cacheblend/cacheblend/tokenizer"
)

// Defaults of a zero Config.
var (
	// DefaultRatios are the recompute ratios measured.
	DefaultRatios = []float64{0, 0.05, 0.15, 0.3, 1}
	// DefaultQuestions are asked over the sample documents.
	DefaultQuestions = []string{
		"What do these documents describe?",
		"Which component stores the KV cache, and where?",
		"How is a request traced across processes?",
		"What limits how fast a prompt is prefilled?",
	}
)

// Default sizes of a zero Config.
const (
	DefaultPrompts   = 6
	DefaultDocs      = 3
	DefaultPositions = 8
	// MaxDocTokens bounds one document's tokens (a longer one is cut).
	MaxDocTokens = 512
)

// Config is one evaluation; zero fields take the defaults.
type Config struct {
	// Ratios are the recompute ratios (each in [0, 1]); default
	// DefaultRatios.
	Ratios []float64
	// Prompts is how many prompts are built; default 6.
	Prompts int
	// Docs is how many documents each prompt holds; default 3.
	Docs int
	// Positions is K, the output tokens compared; default 8.
	Positions int
	// Documents and Questions replace the sample corpus and
	// DefaultQuestions.
	Documents []string
	Questions []string
	// Seed seeds random selection; default 1.
	Seed uint64
	// KVType is the element type of the KV cache both forwards run on:
	// "f16" (the default, as cb worker serves) or "f32".
	KVType string
	// Stack, when set, is a running stack on which every configuration's
	// time to first token is also measured against a full prefill (the
	// report's TTFT speedup); nil: model-only speedups.
	Stack *Stack
}

// Point is one configuration's measurements, averaged over the prompts.
type Point struct {
	// Rule is "hkvd", "random" or "full_reuse" (ratio 0: no recompute).
	Rule  string  `json:"rule"`
	Ratio float64 `json:"ratio"`
	// FirstKL and MeanKL are KL(full ‖ blend) in nats at the first output
	// token and over the first K, averaged over the prompts.
	FirstKL float64 `json:"first_kl"`
	MeanKL  float64 `json:"mean_kl"`
	// Top1 is the share of positions whose most likely token agrees.
	Top1 float64 `json:"top1"`
	// GreedyMatch is the share of prompts whose K greedy tokens all match.
	GreedyMatch float64 `json:"greedy_match"`
	// FullMs and BlendMs are the mean full prefill and blended forward
	// times in this process; ModelSpeedup is FullMs / BlendMs.
	FullMs       float64 `json:"full_ms"`
	BlendMs      float64 `json:"blend_ms"`
	ModelSpeedup float64 `json:"model_speedup"`
	// StackPoint holds the stack's TTFT figures (zero without
	// Config.Stack).
	StackPoint
}

// Speedup is the point's speedup over a full prefill: the stack's TTFT
// speedup when it was measured, else the model-only one.
func (p Point) Speedup() float64 {
	if p.TTFTSpeedup > 0 {
		return p.TTFTSpeedup
	}
	return p.ModelSpeedup
}

// Report is an evaluation's result.
type Report struct {
	Model        string  `json:"model"`
	Layers       int     `json:"layers"`
	CheckLayer   int     `json:"check_layer"`
	Prompts      int     `json:"prompts"`
	PromptTokens float64 `json:"mean_prompt_tokens"`
	DocTokens    float64 `json:"mean_document_tokens"`
	Positions    int     `json:"positions"`
	// Stack describes the stack measurement; nil when the speedups are
	// model-only.
	Stack  *StackInfo `json:"stack,omitempty"`
	Points []Point    `json:"points"`
}

// Prompts is the workload on one model: how it tokenizes and wraps text.
type Prompts struct {
	// Encode tokenizes document and question text (no special tokens).
	Encode func(string) []int32
	// Wrap returns the tokens before and after the documents of a prompt
	// asking question (the chat template's rendering around them).
	Wrap func(question string) (before, after []int32, err error)
	// Decode turns tokens back into text: a document cut to MaxDocTokens
	// is sent to the stack as the text of its first tokens. Nil: the
	// stack gets the whole document.
	Decode func([]int32) string
}

// BuiltinPrompts is the workload on the built-in model: byte tokens, BOS
// and a plain "documents, question, answer" layout.
func BuiltinPrompts() Prompts {
	var tok tokenizer.Tokenizer
	return Prompts{
		Encode: tok.Encode,
		Decode: tok.Decode,
		Wrap: func(q string) ([]int32, []int32, error) {
			before := append([]int32{tok.BOS()}, tok.Encode("Answer from the documents.\n")...)
			return before, tok.Encode("\nQuestion: " + q + "\nAnswer:"), nil
		},
	}
}

// docMark stands for the documents in a rendered chat prompt.
const docMark = "\x1fDOCUMENTS\x1f"

// FilePrompts is the workload on a model file: its tokenizer, and prompts
// rendered with its chat template (a system message, then a user message
// holding the documents and the question); without a template the
// built-in layout with the file's tokenizer.
func FilePrompts(f *modelfile.File) Prompts {
	p := Prompts{Encode: f.Vocab.Encode, Decode: f.Vocab.Decode}
	p.Wrap = func(q string) ([]int32, []int32, error) {
		if f.Template == nil {
			return f.PromptTokens("Answer from the documents.\n"), f.Vocab.Encode("\nQuestion: " + q + "\nAnswer:"), nil
		}
		text, err := f.Template.Render([]chat.Message{
			{Role: "system", Content: "Answer from the documents."},
			{Role: "user", Content: "Documents:\n" + docMark + "\nQuestion: " + q},
		}, f.ChatOptions(true))
		if err != nil {
			return nil, nil, fmt.Errorf("eval: chat template: %w", err)
		}
		b, a, ok := strings.Cut(text, docMark)
		if !ok {
			return nil, nil, errors.New("eval: the chat template dropped the user message")
		}
		before := f.Vocab.EncodeSpecial(b)
		if f.AddBOS && f.BOS >= 0 && (len(before) == 0 || before[0] != f.BOS) {
			before = append([]int32{f.BOS}, before...)
		}
		return before, f.Vocab.EncodeSpecial(a), nil
	}
	return p
}

// ReadDocuments reads every *.txt file of dir, sorted by name.
func ReadDocuments(dir string) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []string
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("eval: %w", err)
		}
		if s := strings.TrimSpace(string(b)); s != "" {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("eval: no non-empty *.txt document in %s", dir)
	}
	return out, nil
}

// ReadQuestions reads one question per non-empty line of path.
func ReadQuestions(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("eval: no question in %s", path)
	}
	return out, nil
}

func (c Config) withDefaults() Config {
	if len(c.Ratios) == 0 {
		c.Ratios = DefaultRatios
	}
	c.KVType = cmp.Or(c.KVType, "f16")
	defaults.Positive(&c.Prompts, DefaultPrompts)
	defaults.Positive(&c.Docs, DefaultDocs)
	defaults.Positive(&c.Positions, DefaultPositions)
	if len(c.Documents) == 0 {
		for _, d := range corpus.Documents() {
			c.Documents = append(c.Documents, d.Text)
		}
	}
	if len(c.Questions) == 0 {
		c.Questions = DefaultQuestions
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	return c
}

// docIndex is the document at place j of prompt i: prompt i holds
// cfg.Docs documents starting at document i·Docs (wrapping around), in an
// order rotated by i.
func docIndex(cfg Config, i, j int) int {
	return (i*cfg.Docs + j*(i+1)) % len(cfg.Documents)
}

// docTokens is every document's tokens, cut to MaxDocTokens.
func docTokens(cfg Config, p Prompts) [][]int32 {
	docs := make([][]int32, len(cfg.Documents))
	for i, d := range cfg.Documents {
		t := p.Encode(d)
		docs[i] = t[:min(len(t), MaxDocTokens)]
	}
	return docs
}

// cases builds the prompts: prompt i holds the documents docIndex(i, ·)
// and asks question i.
func cases(cfg Config, p Prompts) ([]quality.Case, error) {
	docs := docTokens(cfg, p)
	var out []quality.Case
	for i := range cfg.Prompts {
		before, after, err := p.Wrap(cfg.Questions[i%len(cfg.Questions)])
		if err != nil {
			return nil, err
		}
		c := quality.Case{Prefix: before, Question: after}
		for j := range cfg.Docs {
			c.Docs = append(c.Docs, docs[docIndex(cfg, i, j)])
		}
		out = append(out, c)
	}
	return out, nil
}

// Run evaluates m (a whole model) on the workload p: with cfg.Stack, the
// stack's TTFT per configuration first (the stack serving the same model),
// then the quality and the model-only speedup in this process. ctx bounds
// the stack's requests.
func Run(ctx context.Context, m *model.Model, name string, p Prompts, cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	for _, r := range cfg.Ratios {
		if r < 0 || r > 1 {
			return Report{}, fmt.Errorf("eval: recompute ratio %v outside [0, 1]", r)
		}
	}
	kvType, err := kvcache.ParseDType(cfg.KVType)
	if err != nil {
		return Report{}, fmt.Errorf("eval: %w", err)
	}
	cs, err := cases(cfg, p)
	if err != nil {
		return Report{}, err
	}
	mc := m.Config()
	rep := Report{Model: name, Layers: mc.Layers, CheckLayer: mc.CheckLayer, Prompts: len(cs), Positions: cfg.Positions}
	for _, c := range cs {
		n := len(c.Prefix) + len(c.Question)
		for _, d := range c.Docs {
			n += len(d)
			rep.DocTokens += float64(len(d)) / float64(len(cs))
		}
		rep.PromptTokens += float64(n) / float64(len(cs))
	}
	configs := configurations(cfg.Ratios)
	var sps []StackPoint
	if cfg.Stack != nil {
		info, pts, err := cfg.Stack.measure(ctx, cfg, p, configs)
		if err != nil {
			return Report{}, err
		}
		rep.Stack, sps = &info, pts
	}
	for i, c := range configs {
		pt, err := measure(m, cs, c.ratio, c.rule, cfg, kvType)
		if err != nil {
			return Report{}, err
		}
		if sps != nil {
			pt.StackPoint = sps[i]
		}
		rep.Points = append(rep.Points, pt)
	}
	return rep, nil
}

// configuration is one recompute ratio and selection rule.
type configuration struct {
	ratio float64
	rule  model.Selection
}

// configurations are the ratios in increasing order, each with both
// selection rules except 0 and 1 (the rules select nothing or everything
// alike: one configuration each).
func configurations(ratios []float64) []configuration {
	ratios = slices.Clone(ratios)
	slices.Sort(ratios)
	var out []configuration
	for _, r := range slices.Compact(ratios) {
		out = append(out, configuration{r, model.SelectDeviation})
		if r > 0 && r < 1 {
			out = append(out, configuration{r, model.SelectRandom})
		}
	}
	return out
}

// measure runs every case at ratio r with rule.
func measure(m *model.Model, cs []quality.Case, r float64, rule model.Selection, cfg Config, kvType kvcache.DType) (Point, error) {
	pt := Point{Rule: rule.String(), Ratio: r}
	if r == 0 {
		pt.Rule = "full_reuse"
	}
	var full, blend time.Duration
	for i, c := range cs {
		q, err := quality.Blend(m, c, quality.Options{Ratio: r, Select: rule, Seed: cfg.Seed + uint64(i), Positions: cfg.Positions, KVType: kvType})
		if err != nil {
			return pt, fmt.Errorf("eval: prompt %d at ratio %v (%v): %w", i, r, rule, err)
		}
		n := float64(len(cs))
		pt.FirstKL += q.FirstKL / n
		pt.MeanKL += q.MeanKL / n
		pt.Top1 += q.Top1 / n
		if q.GreedyMatch == q.Positions {
			pt.GreedyMatch += 1 / n
		}
		full += q.FullTime
		blend += q.BlendTime
	}
	pt.FullMs = float64(full) / float64(time.Millisecond) / float64(len(cs))
	pt.BlendMs = float64(blend) / float64(time.Millisecond) / float64(len(cs))
	if blend > 0 {
		pt.ModelSpeedup = float64(full) / float64(blend)
	}
	return pt, nil
}

// Cheapest is the point of rule with the highest Speedup whose mean
// first-token KL is at most maxKL (false when none is).
func (r Report) Cheapest(rule string, maxKL float64) (Point, bool) {
	var best Point
	found := false
	for _, p := range r.Points {
		if (p.Rule == rule || p.Rule == "full_reuse" || p.Ratio == 1) && p.FirstKL <= maxKL && (!found || p.Speedup() > best.Speedup()) {
			best, found = p, true
		}
	}
	return best, found
}
