package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/cacheblend/cacheblend/chat"
	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/demo"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/internal/freeport"
	"github.com/cacheblend/cacheblend/internal/llamaref"
	"github.com/cacheblend/cacheblend/internal/testmodel"
	"github.com/cacheblend/cacheblend/modelfile"
	"github.com/cacheblend/cacheblend/quant"
	"github.com/cacheblend/cacheblend/stack"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/vocab"
)

// ggufName is the general.name of the GGUF test model: the name the stack
// serves it under.
const ggufName = "e2e-llama3"

// ggufSpec is the GGUF test model: llama, width 256, 4 layers, F32 weights
// with a Q8_0 token embedding, llama.cpp's Llama 3 (llama-bpe) vocabulary
// and the Llama 3.2 chat template, random weights scaled so greedy outputs
// depend on the prompt.
//
// The layers are F32, not Q8_0, because --tp 2 must answer as --tp 1: with
// Q8_0 weights the activations are rounded to Q8_0 before every product (as
// llama.cpp does), and the ranks' partial sums, added in another order than
// the whole model's, sometimes differ by an ulp on a rounding boundary: the
// logits then move by up to ~0.35 (measured on this model: prefill logits of
// 48-300-token prompts, exactly equal or 0.2-0.35 apart), enough to change
// a greedy token whose lead is smaller. With F32 layers the difference is
// ~4e-5. The embedding is only looked up (no activation rounding).
func ggufSpec(t *testing.T) testmodel.Spec {
	t.Helper()
	src, err := llamaref.LlamaCppSource()
	if err != nil {
		t.Fatalf("%v: run bash scripts/deps.sh", err)
	}
	tmpl, err := os.ReadFile(filepath.Join(src, "models", "templates", "meta-llama-Llama-3.2-3B-Instruct.jinja"))
	if err != nil {
		t.Fatalf("%v: run bash scripts/deps.sh", err)
	}
	return testmodel.Spec{Arch: "llama", Name: ggufName, Dim: 256, FFNDim: 512, Layers: 4, Heads: 4, KVHeads: 2,
		Type: quant.F32, EmbedType: quant.Q8_0, Theta: 500000, VocabFile: filepath.Join(src, "models", "ggml-vocab-llama-bpe.gguf"), Template: string(tmpl)}
}

var ggufFile struct {
	once sync.Once
	path string
	err  error
}

// ggufModel writes the GGUF test model once per test binary (next to the
// cb binary, removed by TestMain) and returns its path.
func ggufModel(t *testing.T) string {
	t.Helper()
	spec := ggufSpec(t)
	ggufFile.once.Do(func() {
		t0 := time.Now()
		ggufFile.path = filepath.Join(filepath.Dir(cbBin), "llama3.gguf")
		ggufFile.err = testmodel.Write(ggufFile.path, spec)
		t.Logf("GGUF test model written in %v", time.Since(t0).Round(time.Millisecond))
	})
	if ggufFile.err != nil {
		t.Fatal(ggufFile.err)
	}
	return ggufFile.path
}

// openModelFile opens a model file as the engine does (its vocabulary and
// chat template).
func openModelFile(t *testing.T, path string) *modelfile.File {
	t.Helper()
	f, err := modelfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// docTokenCount is the number of tokens of the sample documents picked by
// order, tokenized on their own (as /v1/documents stores them) with the
// vocabulary read from the model file by vocab.FromGGUF.
func docTokenCount(t *testing.T, v *vocab.Vocab, order ...int) int {
	t.Helper()
	n := 0
	for _, i := range order {
		n += len(v.Encode(demo.Documents()[i].Text))
	}
	return n
}

// ggufChatBody is a greedy chat request for the GGUF model.
func ggufChatBody(content string, maxTokens int, extra map[string]any) []byte {
	return chatBody(content, maxTokens, false, mergeMaps(map[string]any{"model": ggufName}, extra))
}

func mergeMaps(a, b map[string]any) map[string]any {
	for k, v := range b {
		a[k] = v
	}
	return a
}

// usageOf decodes a chat completion's usage and its cacheblend split.
func usageOf(t *testing.T, out map[string]any) (prompt int, ext api.UsageCacheBlend) {
	t.Helper()
	raw, _ := json.Marshal(out["usage"])
	var u struct {
		PromptTokens int                 `json:"prompt_tokens"`
		CacheBlend   api.UsageCacheBlend `json:"cacheblend"`
	}
	if err := json.Unmarshal(raw, &u); err != nil {
		t.Fatalf("usage %s: %v", raw, err)
	}
	return u.PromptTokens, u.CacheBlend
}

// TestGGUFStack serves the GGUF test model with `cb up --model` (stack.Up
// with ModelPath) on three stacks started side by side: "one" (--tp 1, the
// default configuration), and "docsOnly" (--tp 1) and "two" (--tp 2), whose
// engines store no prompts (--no-store), so that their blend servers hold
// the documents only and their state depends on the requests each got, not
// on earlier prompts' chunks (a blended answer depends on which tokens are
// reused). It checks: the model is listed under the file's general.name;
// documents ingested with /v1/documents are tokenized with the file's
// vocabulary and reused by a Llama 3.2-templated chat request quoting them
// in another order (hit rate >= 0.95 of their tokens), whose trace passes
// the span contract and whose answer the official OpenAI client streams
// identically; --tp 2 answers exactly as --tp 1 for prompts whose answers
// differ, with and without reuse, and when a reused range starts where the
// prefix-cache hit ends; the share of document tokens reused at random
// offsets of templated prompts (logged per placement, >= 0.9 for documents
// on lines of their own). Then, each on stacks of its own:
// prefill/decode disaggregation and a two-node Redis fleet on the same
// file answer as a single node.
// blendGateOn forces CacheBlend's blending on for the GGUF test model: its
// random weights make a blend drift far from a full prefill (the blend gate
// measures several nats and turns blending off: TestGGUFBlendGate), and
// these tests check the mechanics of reuse, not its quality.
var blendGateOn = []string{"--blend-gate", "on"}

// TestGGUFBlendGate: with the blend gate on its default (auto), a worker on
// the GGUF test model finds at start that blending drifts from a full
// prefill and turns it off: a request over ingested documents reuses
// nothing but exact prefixes, its cb.request says why (blend_off), and its
// trace passes the contract.
func TestGGUFBlendGate(t *testing.T) {
	e := startEnv(t, options{model: ggufModel(t), modelName: ggufName})
	e.ingest()
	const tp = "00-8c2a7f1e5b3d4c6a9e0f1a2b3c4d5e6f-1122334455667788-01"
	out := e.chat(tp, ragPrompt(3, 1), 4)
	_, ext := usageOf(t, out)
	if ext.NonPrefixHitTokens != 0 {
		t.Fatalf("blending off, yet %d non-prefix tokens reused (split %+v)", ext.NonPrefixHitTokens, ext)
	}
	tr := e.trace("8c2a7f1e5b3d4c6a9e0f1a2b3c4d5e6f", "chat "+ggufName, spanname.CBRequest) // the root too: the check needs the whole trace
	spec, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	if rep := tracecheck.Check([]tracecheck.Trace{*tr}, spec); !rep.OK() {
		t.Fatalf("the trace fails the contract:\n%s", rep.String())
	}
	req := byName(tr)[spanname.CBRequest][0]
	if off := req.Attributes["blend_off"].String(); !strings.Contains(off, "blend gate failed: mean KL") {
		t.Fatalf("cb.request blend_off %q", off)
	}
	t.Logf("blend_off: %s", req.Attributes["blend_off"].String())

	// cb eval --gate runs the same check: it fails this model (exit status
	// 1, the reason printed) and passes the built-in one.
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
	}{
		{"random GGUF model fails", []string{"eval", "--gate", "--model", ggufModel(t)}, false},
		{"built-in model passes", []string{"eval", "--gate"}, true},
	} {
		out, err := exec.Command(cbBin, tc.args...).CombinedOutput()
		if (err == nil) != tc.ok || !strings.Contains(string(out), "blend gate on ") {
			t.Fatalf("%s: cb %v: %v\n%s", tc.name, tc.args, err, out)
		}
		if !tc.ok && !strings.Contains(string(out), "blend gate failed: mean KL") {
			t.Fatalf("%s: no reason printed:\n%s", tc.name, out)
		}
	}
}

func TestGGUFStack(t *testing.T) {
	path := ggufModel(t)
	mf := openModelFile(t, path)
	g, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := vocab.FromGGUF(g)
	g.Close()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	var one, two, docsOnly *env
	var wg sync.WaitGroup
	wg.Go(func() { one = startEnv(t, options{model: path, modelName: ggufName, workerArgs: blendGateOn}) })
	wg.Go(func() {
		two = startEnv(t, options{tp: 2, model: path, modelName: ggufName, engineArgs: []string{"--no-store"}, workerArgs: blendGateOn})
	})
	wg.Go(func() {
		docsOnly = startEnv(t, options{model: path, modelName: ggufName, engineArgs: []string{"--no-store"}, workerArgs: blendGateOn})
	})
	wg.Wait()
	if one == nil || two == nil || docsOnly == nil {
		t.FailNow()
	}
	t.Logf("three stacks on %s up in %v", filepath.Base(path), time.Since(t0).Round(time.Millisecond))

	t.Run("models lists general.name", func(t *testing.T) {
		for _, e := range []*env{one, two, docsOnly} {
			body, err := httpGet(e.api + "/v1/models")
			if err != nil {
				t.Fatal(err)
			}
			var ml api.ModelList
			if err := json.Unmarshal([]byte(body), &ml); err != nil || len(ml.Data) != 1 || ml.Data[0].ID != ggufName {
				t.Fatalf("/v1/models %s (%v), want the one model %q", body, err, ggufName)
			}
			if ml.Data[0].MaxModelLen != 4096 {
				t.Errorf("max_model_len %d, want the file's context length 4096", ml.Data[0].MaxModelLen)
			}
		}
	})

	// Documents are ingested in their order 0..7 on every stack; the engine
	// tokenizes them with the file's vocabulary.
	for _, e := range []*env{one, two, docsOnly} {
		var docs []map[string]string
		for _, d := range demo.Documents() {
			docs = append(docs, map[string]string{"id": d.ID, "text": d.Text})
		}
		var res api.DocumentList
		if code := e.post("/v1/documents", nil, map[string]any{"documents": docs}, &res); code != http.StatusOK {
			t.Fatalf("ingest: %d", code)
		}
		for i, d := range res.Data {
			if want := docTokenCount(t, v, i); d.Tokens != want {
				t.Fatalf("document %d stored as %d tokens, the file's vocabulary makes %d", i, d.Tokens, want)
			}
		}
	}

	order := []int{5, 2, 7}
	prompt := ragPrompt(order...)
	const maxTokens = 16
	t.Run("documents reused in a templated chat", func(t *testing.T) {
		const tp = "00-8bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		t1 := time.Now()
		out := one.chat(tp, prompt, maxTokens)
		took := time.Since(t1)
		ragText := content(t, out)
		promptTokens, ext := usageOf(t, out)
		docTokens := docTokenCount(t, v, order...)
		hit := ext.PrefixHitTokens + ext.NonPrefixHitTokens
		want, _, err := mf.ChatTokens([]chat.Message{{Role: "user", Content: prompt}})
		if err != nil {
			t.Fatal(err)
		}
		if promptTokens != len(want) {
			t.Errorf("prompt_tokens %d, the Llama 3.2 template renders %d tokens", promptTokens, len(want))
		}
		t.Logf("chat over documents %v: %d prompt tokens, %d document tokens, split %+v: hit rate %.3f on the documents' tokens; %v; answer %q",
			order, promptTokens, docTokens, ext, float64(hit)/float64(docTokens), took.Round(time.Millisecond), ragText)
		if float64(hit) < 0.95*float64(docTokens) || ext.NonPrefixHitTokens <= 0 {
			t.Fatalf("reused %d of the documents' %d tokens (split %+v), want >= 95%%", hit, docTokens, ext)
		}
		if ragText == "" {
			t.Fatal("empty answer")
		}
		tr := one.trace("8bf92f3577b34da6a3ce929d0e0e4736", spanname.CBRequest, spanname.CBLookup, spanname.CBClassify,
			spanname.CBExecute, spanname.CBRetrieve, spanname.CBCheck, spanname.EngineDecode)
		checkContract(t, tr)
		req := byName(tr)[spanname.CBRequest][0]
		p, _ := attrInt(req, "prefix_hit_tokens")
		np, _ := attrInt(req, "non_prefix_hit_tokens")
		if p != ext.PrefixHitTokens || np != ext.NonPrefixHitTokens {
			t.Errorf("cb.request says %d prefix + %d non-prefix hits, the usage %+v", p, np, ext)
		}
		if m := req.Attributes["model"].String(); m != "" && m != ggufName {
			t.Errorf("cb.request model %q, want %q", m, ggufName)
		}
	})

	t.Run("openai client streams the same text", func(t *testing.T) {
		// The reference is the same request not streamed, just before (the
		// other stacks' histories must stay those of the tp comparison).
		want := content(t, one.chat("", prompt, maxTokens))
		if want == "" {
			t.Fatal("empty answer")
		}
		c := one.openaiClient()
		stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
			Model: ggufName, MaxTokens: openai.Int(maxTokens), Temperature: openai.Float(0),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		}, option.WithJSONSet("ignore_eos", true))
		var sb strings.Builder
		chunks := 0
		for stream.Next() {
			ch := stream.Current()
			if ch.Model != ggufName {
				t.Fatalf("chunk model %q", ch.Model)
			}
			if len(ch.Choices) > 0 {
				sb.WriteString(ch.Choices[0].Delta.Content)
				chunks++
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		_ = stream.Close()
		if sb.String() != want {
			t.Fatalf("streamed %q (%d chunks), not streamed %q", sb.String(), chunks, want)
		}
		t.Logf("streamed in %d chunks, concatenated to the non-streamed answer", chunks)
	})

	// tpSame sends each prompt to both stacks and fails unless the answers
	// and the reuse splits agree; it returns the answers.
	tpSame := func(t *testing.T, prompts ...string) ([]string, []api.UsageCacheBlend) {
		t.Helper()
		var answers []string
		var splits []api.UsageCacheBlend
		for i, p := range prompts {
			a, b := docsOnly.chat("", p, 12), two.chat("", p, 12)
			want, got := content(t, a), content(t, b)
			_, ua := usageOf(t, a)
			_, ub := usageOf(t, b)
			// Only a whole-model worker samples for its online quality check
			// (--quality-sample-rate, default 0.01): not part of the reuse split.
			ua.QualitySampled, ub.QualitySampled = false, false
			if ua != ub {
				t.Fatalf("prompt %d: reuse differs: --tp 1 %+v, --tp 2 %+v", i, ua, ub)
			}
			if got != want {
				t.Fatalf("prompt %d: --tp 2 answered %q, --tp 1 %q (split %+v)", i, got, want, ua)
			}
			answers, splits = append(answers, want), append(splits, ua)
		}
		return answers, splits
	}

	t.Run("tp 2 answers as tp 1", func(t *testing.T) {
		docs := demo.Documents()
		rag := "Three notes for the tensor-parallel check.\n\n" + docs[4].Text + "\n\n" + docs[1].Text + "\n\n" + docs[6].Text +
			"\n\nQuestion: what do these notes have in common?"
		answers, splits := tpSame(t, "Say something about tensors.", "Tell me a story about caches.", "What is rotary position embedding?",
			"Why do histograms need buckets?", rag)
		if last := splits[len(splits)-1]; last.NonPrefixHitTokens < docTokenCount(t, v, 4, 1, 6)-3 {
			t.Fatalf("the documents were not reused: %+v", last)
		}
		requireDistinctText(t, answers...)
		t.Logf("%d prompts (the last reusing %d document tokens): greedy answers identical on --tp 1 and --tp 2",
			len(answers), splits[len(splits)-1].NonPrefixHitTokens)
	})

	t.Run("tp 2 answers as tp 1 when reuse adjoins the prefix", func(t *testing.T) {
		// A document quoted right after an intro of a whole number of KV
		// blocks that an earlier prompt shares: the intro hits the engine's
		// prefix cache and the document's reused range starts where that hit
		// ends. The whole model blends the range (its tokens count towards
		// the selective recompute's budget); every rank of --tp 2 must do
		// the same.
		doc := demo.Documents()[5]
		dt := v.Encode(doc.Text)
		const block = 16 // the worker's KV block size
		var intro string
		start := -1
		for n := 1; n <= len(fillerWords) && start < 0; n++ {
			intro = strings.Join(fillerWords[:n], " ") + ".\n\n"
			toks, _, err := mf.ChatTokens([]chat.Message{{Role: "user", Content: intro + doc.Text + "\n\nQuestion: which?"}})
			if err != nil {
				t.Fatal(err)
			}
			if i := indexOf(toks, dt[:fingerprintWindow]); i >= block && i%block == 0 {
				start = i
			}
		}
		if start < 0 {
			t.Fatal("no intro puts the document at a block boundary")
		}
		_, splits := tpSame(t, intro+"Nothing else.", intro+doc.Text+"\n\nQuestion: which?")
		if s := splits[1]; s.PrefixHitTokens != start || s.NonPrefixHitTokens < len(dt)-2 {
			t.Fatalf("split %+v, want %d prefix-cache hits and the document's %d tokens reused after them", s, start, len(dt))
		}
		t.Logf("document at token %d, right after the prefix-cache hit: split %+v, the same answer", start, splits[1])
	})

	t.Run("documents at random offsets", func(t *testing.T) {
		randomOffsetReuse(t, docsOnly, mf, v)
	})

	t.Run("prefill/decode disaggregation", func(t *testing.T) {
		ggufPrefillDecode(t, one, path)
	})

	t.Run("redis fleet of two nodes", func(t *testing.T) {
		ggufFleet(t, docsOnly, path, v)
	})
}

// fillerWords make the random text around the documents (none of the
// documents' sentences).
var fillerWords = strings.Fields(`please read carefully the following material and then answer briefly
note that some passages may be unrelated river mountain orange violin seven purple quietly
remember yesterday garden window bicycle across under morning evening paper stone bridge
question context reference appendix section excerpt quoted source above below between`)

// filler is a random hexadecimal tag (so that no two fillers share their
// start, and no prompt's filler is reused by another) and n random words.
func filler(r *rand.Rand, n int) string {
	w := []string{fmt.Sprintf("%06x", r.Uint32()&0xffffff)}
	for range n {
		w = append(w, fillerWords[r.IntN(len(fillerWords))])
	}
	return strings.Join(w, " ")
}

// longestRun is the longest run of consecutive tokens of doc found intact
// in prompt (the most a match against the stored document can reuse).
func longestRun(prompt, doc []int32) int {
	best := 0
	prev := make([]int, len(doc)+1)
	cur := make([]int, len(doc)+1)
	for i := range prompt {
		for j := range doc {
			if prompt[i] == doc[j] {
				cur[j+1] = prev[j] + 1
				best = max(best, cur[j+1])
			} else {
				cur[j+1] = 0
			}
		}
		prev, cur = cur, prev
	}
	return best
}

// pieces shows tokens as their quoted pieces.
func pieces(v *vocab.Vocab, toks []int32) string {
	var q []string
	for _, id := range toks {
		q = append(q, fmt.Sprintf("%q", v.Piece(id, true)))
	}
	return "[" + strings.Join(q, " ") + "]"
}

// promptStart returns the prompt's first n tokens of the document doc
// whose first tokens changed: where doc[k:k+W] occurs in prompt for the
// smallest k in 1..3, the token before it and the next n-1 (nil when
// none occurs).
func promptStart(prompt, doc []int32, n int) []int32 {
	for k := 1; k <= 3; k++ {
		w := doc[k : k+fingerprintWindow]
		for i := 1; i+len(w) <= len(prompt); i++ {
			if slices.Equal(prompt[i:i+len(w)], w) {
				return prompt[i-1 : min(len(prompt), i-1+n)]
			}
		}
	}
	return nil
}

// indexOf is the first index of sub in s, or -1.
func indexOf(s, sub []int32) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if slices.Equal(s[i:i+len(sub)], sub) {
			return i
		}
	}
	return -1
}

// fingerprintWindow is the blend server's fingerprint window W (its
// default, blend/fingerprint.DefaultWindow): a stored chunk is found only
// where its first W tokens appear in the prompt.
const fingerprintWindow = 16

// placementStats sums a placement's documents.
type placementStats struct {
	prompts, docs, docTokens, reused int
	intact                           int // document tokens intact in the prompt's tokenization
	windowIntact, findable           int // documents whose first W tokens are intact, and their intact tokens
}

func (s placementStats) String() string {
	return fmt.Sprintf("%d prompts, %d documents: %d of %d document tokens reused (%.4f); %d (%.4f) intact in the prompts' tokens; %d of %d documents keep their first %d tokens (%d tokens, %.4f of the documents' tokens)",
		s.prompts, s.docs, s.reused, s.docTokens, float64(s.reused)/float64(s.docTokens), s.intact, float64(s.intact)/float64(s.docTokens),
		s.windowIntact, s.docs, fingerprintWindow, s.findable, float64(s.findable)/float64(s.docTokens))
}

// randomOffsetReuse measures, on a stack whose blend server holds only
// the stored documents (its engine stores no prompts), the share of
// document tokens reused when 2-3 of them sit at random offsets inside
// Llama 3.2-templated prompts, random filler before, between and after
// them, ten prompts per placement:
//
//   - paragraph: each document on lines of its own (after "\n\n" or "\n"),
//     as RAG prompts quote them: asserted >= 0.9 (the goal is 0.95).
//   - inline: each document after " " or ": " (e.g. "Context: <doc>"):
//     logged, not asserted. Llama 3's pre-tokenizer joins the space to the
//     document's first word, so the prompt's first document token differs
//     from the stored document's; the blend server finds a stored chunk
//     only by the fingerprint of its first W tokens (one fingerprint per
//     chunk, blend/fingerprint), so such a document is not found at all.
//
// Every prompt starts with unique filler, so the prefix hits are the chat
// template's header (the engine's prefix cache) and, with no prompt stored,
// every non-prefix hit is a document token. Offline, the test tokenizes
// every prompt as the engine does and counts the document tokens that
// survive intact, and the documents whose first W tokens do.
func randomOffsetReuse(t *testing.T, e *env, mf *modelfile.File, v *vocab.Vocab) {
	r := rand.New(rand.NewPCG(23, 2026))
	docs := demo.Documents()
	ask := func(content string) (int, api.UsageCacheBlend) {
		return usageOf(t, e.chat("", content, 1))
	}
	// The template's header: what two prompts without documents share.
	hdr := func() []int32 {
		a, _, err := mf.ChatTokens([]chat.Message{{Role: "user", Content: "a"}})
		if err != nil {
			t.Fatal(err)
		}
		b, _, _ := mf.ChatTokens([]chat.Message{{Role: "user", Content: "b"}})
		n := 0
		for n < min(len(a), len(b)) && a[n] == b[n] {
			n++
		}
		return a[:n]
	}()
	after := []string{"\n\n", "\n", " ", ": "}
	placements := []struct {
		name   string
		before []string
	}{
		{"paragraph", []string{"\n\n", "\n"}},
		{"inline", []string{" ", ": "}},
	}
	stats := map[string]*placementStats{}
	t0 := time.Now()
	for _, pl := range placements {
		st := &placementStats{}
		stats[pl.name] = st
		for p := range 10 {
			k := 2 + r.IntN(2)
			picked := r.Perm(len(docs))[:k]
			var sb strings.Builder
			n := 0
			for _, i := range picked {
				sb.WriteString(filler(r, r.IntN(40)))
				sb.WriteString(pl.before[r.IntN(len(pl.before))])
				sb.WriteString(docs[i].Text)
				sb.WriteString(after[r.IntN(len(after))])
				n += docTokenCount(t, v, i)
			}
			sb.WriteString(filler(r, 5+r.IntN(20)) + "?")
			msg := sb.String()
			toks, _, err := mf.ChatTokens([]chat.Message{{Role: "user", Content: msg}})
			if err != nil {
				t.Fatal(err)
			}
			in, win, findable := 0, 0, 0
			for _, i := range picked {
				dt := v.Encode(docs[i].Text)
				run := longestRun(toks, dt)
				in += run
				if longestRun(toks, dt[:fingerprintWindow]) == fingerprintWindow {
					win++
					findable += run
				} else if p == 0 {
					t.Logf("%s: document %d starts with tokens %s stored, %s in the prompt", pl.name, i, pieces(v, dt[:3]), pieces(v, promptStart(toks, dt, 3)))
				}
			}
			promptTokens, ext := ask(msg)
			if promptTokens != len(toks) {
				t.Errorf("%s prompt %d: prompt_tokens %d, the template renders %d", pl.name, p, promptTokens, len(toks))
			}
			if ext.PrefixHitTokens > len(hdr) {
				t.Errorf("%s prompt %d: %d prefix hits, more than the template's %d-token header", pl.name, p, ext.PrefixHitTokens, len(hdr))
			}
			got := ext.NonPrefixHitTokens
			if got > n {
				t.Errorf("%s prompt %d: %d non-prefix hits, more than the %d document tokens", pl.name, p, got, n)
			}
			t.Logf("%s prompt %d: docs %v, %d prompt tokens, %d document tokens (%d intact, %d in the %d documents whose first %d tokens are intact), split %+v: %d document tokens reused (%.3f)",
				pl.name, p, picked, promptTokens, n, in, findable, win, fingerprintWindow, ext, got, float64(got)/float64(n))
			st.prompts++
			st.docs += k
			st.docTokens += n
			st.reused += got
			st.intact += in
			st.windowIntact += win
			st.findable += findable
		}
	}
	t.Logf("documents at random offsets (%v):", time.Since(t0).Round(time.Millisecond))
	for _, pl := range placements {
		t.Logf("  %s: %s", pl.name, stats[pl.name])
	}
	if st := stats["paragraph"]; float64(st.reused) < 0.9*float64(st.docTokens) {
		t.Errorf("paragraph placement: reused %d of the documents' %d tokens, want >= 0.9", st.reused, st.docTokens)
	}
	// Whatever the placement, every document the blend server can find (its
	// first W tokens intact) is reused but for its changed edge tokens.
	for _, pl := range placements {
		if st := stats[pl.name]; float64(st.reused) < 0.95*float64(st.findable) {
			t.Errorf("%s placement: reused %d tokens, while %d tokens of documents with their first %d tokens intact could be", pl.name, st.reused, st.findable, fingerprintWindow)
		}
	}
}

// ggufPrefillDecode: `cb up --prefill-nodes 1 --decode-nodes 1 --model`
// answers through the gateway (prefill node, KV handed over to the decode
// node) the same greedy text as the single-node stack one (full prefills:
// reuse off, so that the stacks' histories do not matter).
func ggufPrefillDecode(t *testing.T, one *env, path string) {
	t0 := time.Now()
	eps := upGGUFFleet(t, stack.UpConfig{PrefillNodes: 1, DecodeNodes: 1, ModelPath: path})
	if eps.Gateway == nil || len(eps.Nodes) != 2 || eps.Nodes[0].Role != "prefill" || eps.Nodes[1].Role != "decode" {
		t.Fatalf("endpoints %+v", eps)
	}
	t.Logf("prefill/decode fleet up in %v", time.Since(t0).Round(time.Millisecond))
	question := demo.Prompt(demo.Documents()[7:8], "Question: summarize this document in one sentence.")
	full := map[string]any{"cacheblend": map[string]any{"reuse": false}}
	single := send(one.api, nil, ggufChatBody(question, 16, full))
	dis := send(eps.Gateway.API, nil, ggufChatBody(question, 16, full))
	if single.status != 200 || dis.status != 200 {
		t.Fatalf("single node %d %s\nthrough the gateway %d %s", single.status, single.body, dis.status, dis.body)
	}
	if r, ok := api.ParseKVReport(dis.header); !ok || r.BlocksSent == 0 {
		t.Fatalf("no hand-over through the gateway: %v", dis.header)
	}
	if single.text == "" || dis.text != single.text {
		t.Fatalf("single node %q, prefill → decode %q", single.text, dis.text)
	}
	t.Logf("greedy: single node %v, gateway → prefill → decode %v, same answer %q",
		single.took.Round(time.Millisecond), dis.took.Round(time.Millisecond), dis.text)
}

// upGGUFFleet runs `cb up` with cfg (the cb binary, a free API port, a
// 2 s coordinator timeout) until the test ends, printing the processes'
// logs when the test failed, and returns its endpoints.
func upGGUFFleet(t *testing.T, cfg stack.UpConfig) stack.Endpoints {
	t.Helper()
	logs := &syncWriter{}
	cfg.Exe, cfg.APIAddr = cbBin, "127.0.0.1:0"
	cfg.BlendArgs = []string{"--coordinator-timeout=2s"}
	cfg.Supervisor = stack.Config{Logs: logs, ReadyTimeout: 120 * time.Second}
	st, err := stack.Up(context.Background(), cfg)
	if err != nil {
		t.Fatalf("stack up: %v\nlogs:\n%s", err, tail(logs.String(), 60))
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Errorf("stack shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("process logs:\n%s", tail(logs.String(), 80))
		}
	})
	return st.Endpoints()
}

// ggufFleet: `cb up --nodes 2 --model` (redis-server started by Up): a
// document ingested through node 0 is reused by a request on node 1 (its
// usage and its blend server's coordinator and Redis metrics), whose answer
// is a single node's (ref, whose blend server holds the documents only).
func ggufFleet(t *testing.T, ref *env, path string, v *vocab.Vocab) {
	t0 := time.Now()
	eps := upGGUFFleet(t, stack.UpConfig{Nodes: 2, ModelPath: path, WorkerArgs: blendGateOn})
	if len(eps.Nodes) != 2 || eps.Redis == nil {
		t.Fatalf("endpoints %+v", eps)
	}
	t.Logf("two-node fleet up in %v", time.Since(t0).Round(time.Millisecond))
	n0 := &env{t: t, api: eps.Nodes[0].Engine.API, model: ggufName}
	n1 := &env{t: t, api: eps.Nodes[1].Engine.API, model: ggufName}
	n0.ingest()
	order := []int{3, 1}
	prompt := ragPrompt(order...)
	out := n1.chat("", prompt, 8)
	_, ext := usageOf(t, out)
	docTokens := docTokenCount(t, v, order...)
	if hit := ext.PrefixHitTokens + ext.NonPrefixHitTokens; float64(hit) < 0.9*float64(docTokens) {
		t.Fatalf("node 1 reused %d of the documents' %d tokens (split %+v)", hit, docTokens, ext)
	}
	metrics, err := httpGet(eps.Nodes[1].Blend.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, `lmcache_blend_coordinator_matches_total{result="ok"} 1`) ||
		strings.Contains(metrics, `lmcache_blend_remote_reads_total{result="hit"} 0`) {
		t.Fatalf("node 1 did not reuse through Redis:\n%s", grepLines(metrics, "lmcache_blend_"))
	}
	if want := content(t, ref.chat("", prompt, 8)); text(out) != want {
		t.Fatalf("node 1 answered %q, a single node %q", text(out), want)
	}
	t.Logf("node 1 reused %d of %d document tokens ingested on node 0 (split %+v), answer %q",
		ext.PrefixHitTokens+ext.NonPrefixHitTokens, docTokens, ext, text(out))
}

// TestGGUFModelMismatch: a worker serving one GGUF file and an engine
// serving another (the test model's tensors under another general.name, so
// another file identity; writing a second random model would take ~20 s
// under -race) do not pair: the engine's /health stays 503 "worker
// unavailable", a chat request is refused with 503 worker_unavailable, and
// the engine logs the mismatch naming both files.
func TestGGUFModelMismatch(t *testing.T) {
	engineFile := ggufModel(t)
	workerFile := filepath.Join(t.TempDir(), "other.gguf")
	renamedCopy(t, engineFile, workerFile, "e2e-llama3-other")
	ports, err := freeport.Ports(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	logs := &syncWriter{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	upErr := make(chan error, 1)
	go func() {
		// The worker's later --model wins over the one Up passes.
		st, err := stack.Up(ctx, stack.UpConfig{Exe: cbBin, APIAddr: addr, Plaintext: true, ModelPath: engineFile,
			WorkerArgs: []string{"--model", workerFile},
			Supervisor: stack.Config{Logs: logs, ReadyTimeout: 120 * time.Second}})
		if err == nil {
			_ = st.Shutdown(context.Background())
			err = fmt.Errorf("stack up succeeded")
		}
		upErr <- err
	}()
	base := "http://" + addr
	deadline := time.Now().Add(90 * time.Second)
	var health, chatBody string
	var healthCode, chatCode int
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no mismatch reported: /health %d %s, chat %d %s\nlogs:\n%s", healthCode, health, chatCode, chatBody, tail(logs.String(), 40))
		}
		time.Sleep(200 * time.Millisecond)
		resp, err := http.Get(base + "/health")
		if err != nil {
			continue
		}
		health, healthCode = readAll(resp), resp.StatusCode
		if healthCode == http.StatusOK {
			t.Fatalf("the engine is healthy with a worker serving another file: %s", health)
		}
		chatCode, chatBody = (&env{t: t, api: base}).rawChat(string(ggufChatBody("hello", 2, nil)))
		if healthCode == http.StatusServiceUnavailable && chatCode == http.StatusServiceUnavailable &&
			strings.Contains(chatBody, `"worker_unavailable"`) && mismatchLine(logs.String()) != "" {
			break
		}
	}
	line := mismatchLine(logs.String())
	for _, want := range []string{"e2e-llama3-other", ggufName} {
		if !strings.Contains(line, want) {
			t.Errorf("the mismatch log line does not name %q: %s", want, line)
		}
	}
	t.Logf("/health %d %s; chat %d %s; engine log: %s", healthCode, strings.TrimSpace(health), chatCode, strings.TrimSpace(chatBody), line)
	cancel()
	select {
	case err := <-upErr:
		if !strings.Contains(err.Error(), "context canceled") {
			t.Logf("stack up ended with %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("stack up did not return after its context was canceled")
	}
}

// renamedCopy writes the GGUF file src to dst with general.name set to
// name (another file identity).
func renamedCopy(t *testing.T, src, dst, name string) {
	t.Helper()
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kv := slices.Clone(f.KV)
	for i := range kv {
		if kv[i].Key == "general.name" {
			kv[i].Value = name
		}
	}
	var tensors []gguf.WriteTensor
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		tensors = append(tensors, gguf.WriteTensor{Name: ti.Name, Dims: ti.Dims, Type: ti.Type, Data: f.Data(ti)})
	}
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := gguf.Write(out, kv, tensors); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// mismatchLine is the engine's log line about a worker with another model
// file, or "".
func mismatchLine(logs string) string {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "cb-engine") && strings.Contains(l, "different model files") {
			return l
		}
	}
	return ""
}

// readAll reads and closes resp's body.
func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
