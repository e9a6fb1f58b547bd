package gateway

import (
	"math/rand/v2"
	"testing"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/tokenizer"
)

// doc returns n tokens of a pseudo-random document (seeded: reproducible).
func doc(seed uint64, n int) []int32 {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(r.IntN(256))
	}
	return out
}

// chat returns the engine's prompt tokens of a user message.
func chat(content string) []int32 {
	return promptTokens(nil, &api.Generation{Operation: api.OperationChat, Messages: []api.Message{{Role: "user", Content: content}}})
}

func TestReuseIndexMatchesRoutedPrompts(t *testing.T) {
	x := newReuseIndex("m", 256, 1<<20, 100)
	docText := "Answer using these documents.\n\n" + randomText(1, 1200)
	p1 := chat(docText + "\n\nQuestion: what is it about?")
	p2 := chat(docText + "\n\nQuestion: who wrote it, and when?")
	if n := x.Match(p2); n != 0 {
		t.Fatalf("empty index matched %d tokens", n)
	}
	x.Register(p1)
	n := x.Match(p2)
	common := commonPrefix(p1, p2)
	if n < common-16 || n > common {
		t.Fatalf("matched %d tokens, want about the %d the prompts share", n, common)
	}
	// A second prompt for the same document brings no new full chunk: not registered.
	x.Register(p2)
	if seqs, _ := x.Stats(); seqs != 1 {
		t.Fatalf("%d registrations after a repeat, want 1", seqs)
	}
	// A document registered on its own matches inside a prompt, at any offset.
	other := randomText(2, 900)
	x.Register(tokenizer.Tokenizer{}.Encode(other))
	if n := x.Match(chat("Some preamble of a different length. " + other + " Question?")); n < 880 {
		t.Fatalf("document inside a prompt: matched %d of its 900 tokens", n)
	}
}

func TestReuseIndexIsBounded(t *testing.T) {
	// Room for about three 1,000-token prompts.
	x := newReuseIndex("m", 256, 3*(8*1100+32*5), 100)
	var prompts [][]int32
	for i := range 6 {
		prompts = append(prompts, chat(randomText(uint64(10+i), 1000)))
		x.Register(prompts[i])
	}
	seqs, bytes := x.Stats()
	if seqs != 3 || bytes > 3*(8*1100+32*5) {
		t.Fatalf("%d registrations, %d bytes: over the bound", seqs, bytes)
	}
	if n := x.Match(prompts[0]); n > 100 {
		t.Fatalf("an evicted prompt still matches %d tokens", n)
	}
	if n := x.Match(prompts[5]); n < 990 {
		t.Fatalf("the newest prompt matches %d tokens", n)
	}
	// The sequence cap, and LRU: a match touches its registration.
	y := newReuseIndex("m", 256, 1<<30, 2)
	y.Register(prompts[0])
	y.Register(prompts[1])
	y.Register(prompts[0]) // touched: prompts[1] is now the oldest
	y.Register(prompts[2])
	if y.Match(prompts[0]) < 990 || y.Match(prompts[1]) > 100 || y.Match(prompts[2]) < 990 {
		t.Fatalf("LRU eviction: %d %d %d", y.Match(prompts[0]), y.Match(prompts[1]), y.Match(prompts[2]))
	}
}

func TestReuseIndexRebuildsSharedChunks(t *testing.T) {
	// Prompts sharing a 512-token prefix: evicting one leaves its shared chunks referenced by
	// the table; the rebuild keeps memory bounded and the live prompts matched.
	prefix := randomText(99, 512)
	x := newReuseIndex("m", 256, 4*(8*1300+32*6), 1000)
	var last []int32
	for i := range 40 {
		last = chat(prefix + randomText(uint64(200+i), 700))
		x.Register(last)
		if _, b := x.Stats(); b > x.maxBytes {
			t.Fatalf("bytes %d over %d", b, x.maxBytes)
		}
		if x.dead > x.maxBytes {
			t.Fatalf("dead bytes %d over %d: no rebuild", x.dead, x.maxBytes)
		}
	}
	if n := x.Match(last); n < len(last)-16 {
		t.Fatalf("the last prompt matches %d of %d tokens", n, len(last))
	}
}

// randomText returns n bytes of printable pseudo-random text (one token each).
func randomText(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
		if r.IntN(6) == 0 {
			b[i] = ' '
		}
	}
	return string(b)
}

func commonPrefix(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// BenchmarkExpectedHits: the routing cost of kv-aware per request and engine — matching a
// 1,500-token prompt against an engine's reuse index holding 2,000 prompts: one that holds
// the prompt's document, and one that does not (every offset probed).
func BenchmarkExpectedHits(b *testing.B) {
	x := newReuseIndex("m", 256, DefaultIndexBytes, DefaultIndexSequences)
	for i := range 2000 {
		x.Register(chat(randomText(uint64(1000+i), 1500)))
	}
	for _, bc := range []struct {
		name   string
		prompt []int32
		min    int
	}{
		{"held", chat(randomText(1500, 1500)[:1400] + " a question of this request?"), 1300},
		{"not-held", chat(randomText(99999, 1500)), 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if n := x.Match(bc.prompt); n < bc.min || bc.min == 0 && n > 0 {
				b.Fatalf("matched %d", n)
			}
			b.ReportAllocs()
			for b.Loop() {
				x.Match(bc.prompt)
			}
			b.ReportMetric(float64(len(bc.prompt))*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mtokens/s")
		})
	}
}
