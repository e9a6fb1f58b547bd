package llamaref

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/quant"
)

// tinyLlama describes the test fixture: a small llama with random F32 weights and llama-spm's
// real 32000-token vocabulary.
type tinyLlama struct {
	layers, embd, heads, kvHeads, ff, ctx int
	// outScale is the standard deviation of output.weight; large values spread the logits beyond
	// float32 softmax range, exercising the driver's tail recovery.
	outScale float64
	seed     uint64
}

// writeTinyLlama writes the fixture GGUF into dir and returns its path.
func writeTinyLlama(t testing.TB, dir string, m tinyLlama) string {
	t.Helper()
	vf, err := gguf.Open(vocabFile(t, "llama-spm"))
	if err != nil {
		t.Fatal(err)
	}
	defer vf.Close()
	kv := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.name", Value: "llamaref-tiny"},
		{Key: "llama.context_length", Value: uint32(m.ctx)},
		{Key: "llama.embedding_length", Value: uint32(m.embd)},
		{Key: "llama.block_count", Value: uint32(m.layers)},
		{Key: "llama.feed_forward_length", Value: uint32(m.ff)},
		{Key: "llama.attention.head_count", Value: uint32(m.heads)},
		{Key: "llama.attention.head_count_kv", Value: uint32(m.kvHeads)},
		{Key: "llama.rope.freq_base", Value: float32(10000)},
		{Key: "llama.rope.dimension_count", Value: uint32(m.embd / m.heads)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
		{Key: "general.file_type", Value: uint32(0)},
	}
	nVocab := 0
	for _, e := range vf.KV {
		if strings.HasPrefix(e.Key, "tokenizer.") {
			kv = append(kv, e)
			if e.Key == "tokenizer.ggml.tokens" {
				nVocab = len(e.Value.([]string))
			}
		}
	}
	if nVocab == 0 {
		t.Fatal("vocabulary has no tokens")
	}
	kv = append(kv, gguf.KV{Key: "llama.vocab_size", Value: uint32(nVocab)})
	rng := rand.New(rand.NewPCG(m.seed, 7))
	var tensors []gguf.WriteTensor
	add := func(name string, scale float64, dims ...int) {
		n := 1
		ud := make([]uint64, len(dims))
		for i, d := range dims {
			n *= d
			ud[i] = uint64(d)
		}
		b := make([]byte, 4*n)
		for i := range n {
			v := 1.0
			if scale != 0 {
				v = rng.NormFloat64() * scale
			}
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		}
		tensors = append(tensors, gguf.WriteTensor{Name: name, Dims: ud, Type: quant.F32, Data: b})
	}
	kvDim := m.embd / m.heads * m.kvHeads
	in := 1 / math.Sqrt(float64(m.embd))
	add("token_embd.weight", 1, m.embd, nVocab)
	for l := range m.layers {
		p := func(s string) string { return "blk." + itoa(l) + "." + s }
		add(p("attn_norm.weight"), 0, m.embd)
		add(p("attn_q.weight"), in, m.embd, m.embd)
		add(p("attn_k.weight"), in, m.embd, kvDim)
		add(p("attn_v.weight"), in, m.embd, kvDim)
		add(p("attn_output.weight"), in, m.embd, m.embd)
		add(p("ffn_norm.weight"), 0, m.embd)
		add(p("ffn_gate.weight"), in, m.embd, m.ff)
		add(p("ffn_up.weight"), in, m.embd, m.ff)
		add(p("ffn_down.weight"), 1/math.Sqrt(float64(m.ff)), m.ff, m.embd)
	}
	add("output_norm.weight", 0, m.embd)
	add("output.weight", m.outScale, m.embd, nVocab)
	path := filepath.Join(dir, "tiny-llama.gguf")
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := gguf.Write(fh, kv, tensors); err != nil {
		fh.Close()
		t.Fatal(err)
	}
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func itoa(i int) string { return strconv.Itoa(i) }

var (
	tinyOnce sync.Once
	tinyDir  string
	tinyPath [2]string
)

// tinyModels returns two fixtures: [0] with ordinary logits, [1] with logits spread over more
// than float32 softmax range (output scale 2.5).
func tinyModels(t testing.TB) [2]string {
	t.Helper()
	tinyOnce.Do(func() {
		d, err := os.MkdirTemp("", "llamaref-tiny-")
		if err != nil {
			t.Fatal(err)
		}
		tinyDir = d
		for i, scale := range []float64{0.3, 2.5} {
			sub := filepath.Join(d, itoa(i))
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			tinyPath[i] = writeTinyLlama(t, sub, tinyLlama{layers: 2, embd: 64, heads: 4, kvHeads: 2, ff: 128, ctx: 512, outScale: scale, seed: uint64(11 + i)})
		}
	})
	if tinyPath[1] == "" {
		t.Fatal("fixture not written")
	}
	return tinyPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedRef != nil {
		sharedRef.Close()
	}
	if tinyDir != "" {
		os.RemoveAll(tinyDir)
	}
	os.Exit(code)
}

var evalTokens = []int32{1, 15043, 3186, 29892, 445, 338, 263, 1243, 310, 278, 3407, 29889, 13, 1576, 4996, 17354}

// TestLogProbsNormalised checks every LogProbs row (with k = n_vocab) is a probability
// distribution, sorted, and agrees with Logits and with the asked ids' log-probabilities.
func TestLogProbsNormalised(t *testing.T) {
	ref := testRef(t)
	for i, model := range tinyModels(t) {
		t.Run(itoa(i), func(t *testing.T) {
			positions := []int{0, 5, len(evalTokens) - 1, 5}
			ids := []int32{0, 1, 2, 13, 31999}
			rows, err := ref.LogProbsWith(model, evalTokens, positions, 32000, ids, EvalOptions{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			logits, err := ref.LogitsWith(model, evalTokens, positions, EvalOptions{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			for r, row := range rows {
				if len(row.Top) != 32000 {
					t.Fatalf("row %d: %d entries", r, len(row.Top))
				}
				sum, minLP := 0.0, 0.0
				byID := make([]float64, 32000)
				for j, e := range row.Top {
					sum += math.Exp(e.LogProb)
					byID[e.ID] = e.LogProb
					minLP = math.Min(minLP, e.LogProb)
					if j > 0 && e.LogProb > row.Top[j-1].LogProb {
						t.Fatalf("row %d not sorted at %d", r, j)
					}
				}
				if math.Abs(sum-1) > 1e-9 {
					t.Errorf("row %d: probabilities sum to %.12f", r, sum)
				}
				// log-softmax of the returned logits must reproduce the log-probabilities
				lg := logits[r]
				mx := math.Inf(-1)
				for _, v := range lg {
					mx = math.Max(mx, v)
				}
				if mx != 0 {
					t.Errorf("row %d: logits max %v, want 0", r, mx)
				}
				s := 0.0
				for _, v := range lg {
					s += math.Exp(v)
				}
				lse := math.Log(s)
				worst := 0.0
				for id, v := range lg {
					if math.IsInf(v, -1) {
						t.Fatalf("row %d: token %d has -Inf logit", r, id)
					}
					worst = math.Max(worst, math.Abs((v-lse)-byID[id]))
				}
				if worst > 1e-9 {
					t.Errorf("row %d: logits and log-probabilities differ by %g", r, worst)
				}
				for j, id := range ids {
					if math.Abs(row.IDs[j]-byID[id]) > 1e-12 {
						t.Errorf("row %d id %d: %v vs %v", r, id, row.IDs[j], byID[id])
					}
				}
				t.Logf("row %d (position %d): logit range %.1f, top %d %.4f", r, positions[r], -minLP+row.Top[0].LogProb, row.Top[0].ID, row.Top[0].LogProb)
			}
			if !equalRow(logits[1], logits[3]) {
				t.Error("the same position asked twice gave different logits")
			}
		})
	}
}

func equalRow(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTailRecovery checks the temperature path the driver uses for logits whose float32
// probability underflows: computed entirely at temperatures 4 and 16 it must agree with the
// normal path, and the wide fixture must really need it.
func TestTailRecovery(t *testing.T) {
	ref := testRef(t)
	models := tinyModels(t)
	pos := []int{3, 9}
	base, err := ref.LogitsWith(models[1], evalTokens, pos, EvalOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	low := math.Inf(1)
	for _, v := range base[0] {
		low = math.Min(low, v)
	}
	if low > -104 {
		t.Errorf("wide fixture's lowest logit is %.1f below the max; expected beyond float32 softmax range (-104)", -low)
	}
	for _, temp := range []int{4, 16} {
		var res struct {
			Rows []string `json:"rows"`
		}
		req := EvalOptions{Threads: 1}.req(map[string]any{"model": models[1], "tokens": evalTokens, "positions": pos, "mode": "logits", "probeTemperature": temp})
		if err := ref.call("eval", req, &res); err != nil {
			t.Fatal(err)
		}
		for r, s := range res.Rows {
			probe := decodeF64(t, s)
			worst := 0.0
			for i := range probe {
				worst = math.Max(worst, math.Abs(probe[i]-base[r][i]))
			}
			// error of the temperature path: ~T * 2e-7 plus float32 rounding of l/T
			if worst > float64(temp)*1e-5 {
				t.Errorf("T=%d row %d: differs from the normal path by %g", temp, r, worst)
			}
			t.Logf("T=%d row %d: max difference %.3g", temp, r, worst)
		}
	}
}

func decodeF64(t *testing.T, s string) []float64 {
	t.Helper()
	rows, err := decodeRows([]string{s})
	if err != nil {
		t.Fatal(err)
	}
	return rows[0]
}

// TestGreedyDeterministic checks Greedy repeats itself, agrees across thread counts, and
// follows the argmax of LogProbs; it also reports whether llama.cpp's logits change with the
// thread count.
func TestGreedyDeterministic(t *testing.T) {
	ref := testRef(t)
	model := tinyModels(t)[0]
	prompt := evalTokens[:6]
	a, err := ref.Greedy(model, prompt, 12, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ref.Greedy(model, prompt, 12, 1)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ref.Greedy(model, prompt, 12, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !equalIDs(a, b) || !equalIDs(a, c) {
		t.Fatalf("greedy differs: threads 1 %v, again %v, threads 2 %v", a, b, c)
	}
	// each greedy token is the argmax after the prompt plus the tokens before it
	seq := append(append([]int32{}, prompt...), a...)
	positions := make([]int, len(a))
	for i := range a {
		positions[i] = len(prompt) - 1 + i
	}
	top, err := ref.LogProbs(model, seq, positions, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, row := range top {
		if row[0].ID != a[i] && row[0].LogProb != row[1].LogProb {
			t.Errorf("step %d: greedy %d, argmax %d (%v)", i, a[i], row[0].ID, row)
		}
	}
	t.Logf("greedy: %v", a)

	positions = []int{0, 7, len(evalTokens) - 1}
	l1, err := ref.Logits(model, evalTokens, positions, 1)
	if err != nil {
		t.Fatal(err)
	}
	l1b, err := ref.Logits(model, evalTokens, positions, 1)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := ref.Logits(model, evalTokens, positions, 2)
	if err != nil {
		t.Fatal(err)
	}
	same, diff := 0, 0.0
	for r := range l1 {
		for i := range l1[r] {
			if l1[r][i] != l1b[r][i] {
				t.Fatalf("threads=1 twice: row %d token %d: %v vs %v", r, i, l1[r][i], l1b[r][i])
			}
			if l1[r][i] == l2[r][i] {
				same++
			}
			diff = math.Max(diff, math.Abs(float64(l1[r][i]-l2[r][i])))
		}
	}
	t.Logf("logits threads 1 vs 2: %d of %d identical, max abs difference %.3g", same, len(l1)*len(l1[0]), diff)
	if diff > 1e-3 {
		t.Errorf("threads 1 vs 2 differ by %g", diff)
	}
}

// TestEvalOptions checks the KV-cache type and batch-size options are applied (an F16 cache
// and a smaller batch change the arithmetic a little, never a lot) and bad values are refused.
func TestEvalOptions(t *testing.T) {
	ref := testRef(t)
	model := tinyModels(t)[0]
	pos := []int{len(evalTokens) - 1}
	base, err := ref.LogitsWith(model, evalTokens, pos, EvalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []EvalOptions{{KVType: "f16"}, {Batch: 5}, {FlashAttention: true}} {
		got, err := ref.LogitsWith(model, evalTokens, pos, o)
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		d := 0.0
		for i := range got[0] {
			d = math.Max(d, math.Abs(got[0][i]-base[0][i]))
		}
		t.Logf("%+v: max logit difference from the default %.3g", o, d)
		if d > 0.05 {
			t.Errorf("%+v: differs by %g", o, d)
		}
	}
	if _, err := ref.LogitsWith(model, evalTokens, pos, EvalOptions{KVType: "q9"}); err == nil {
		t.Error("unknown KV type accepted")
	}
	if _, err := ref.Logits(model, evalTokens, []int{len(evalTokens)}, 1); err == nil {
		t.Error("position out of range accepted")
	}
	if _, err := ref.Logits(model, []int32{1, 32000}, []int{0}, 1); err == nil {
		t.Error("token out of range accepted")
	}
	if _, err := ref.Greedy(model, evalTokens, 600, 1); err == nil || !strings.Contains(err.Error(), "context length") {
		t.Errorf("greedy beyond the context length: err = %v", err)
	}
	if _, err := ref.Greedy(model, nil, 3, 1); err == nil {
		t.Error("empty prompt accepted")
	}
	info, err := ref.ModelInfo(model)
	if err != nil {
		t.Fatal(err)
	}
	if info["vocab_only"] != false || info["n_embd"] != 64.0 || info["n_vocab"] != 32000.0 || info["architecture"] != "llama" {
		t.Errorf("model info %v", info)
	}
}

func BenchmarkLogits(b *testing.B) {
	ref := testRef(b)
	model := tinyModels(b)[0]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ref.Logits(model, evalTokens, []int{len(evalTokens) - 1}, 1); err != nil {
			b.Fatal(err)
		}
	}
}
