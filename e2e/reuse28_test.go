package e2e

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// newDocument is a document of about n tokens of the built-in tokenizer
// (words of a seeded generator: new to every stack).
func newDocument(seed uint64, words int) string {
	r := rand.New(rand.NewPCG(seed, 28))
	vocab := strings.Fields("river stone lantern copper meadow harbor violet engine orchard signal " +
		"marble winter falcon ledger canyon silver garden thunder compass velvet archive summit")
	var b strings.Builder
	for i := range words {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[r.IntN(len(vocab))])
	}
	return b.String()
}

// backToBack sends two chat requests at once one after the other, each with
// the same new document after a different preamble (another offset), and
// returns the second's usage: its reuse of the first's KV.
func backToBack(t *testing.T, e *env, seed uint64) (prompt, nonPrefix, prefix int) {
	t.Helper()
	doc := newDocument(seed, 330)
	ask := func(preamble string) map[string]any {
		return e.chat("", preamble+"\n\nDocument:\n"+doc+"\n\nQuestion: what is the first word?", 2)
	}
	ask(fmt.Sprintf("Request %d. You answer briefly.", seed))
	out := ask(fmt.Sprintf("Request %d, second: a longer preamble that moves the document to another offset of the prompt. You answer in one word.", seed))
	u := out["usage"].(map[string]any)
	cb, _ := u["cacheblend"].(map[string]any)
	num := func(m map[string]any, k string) int {
		v, _ := m[k].(float64)
		return int(v)
	}
	return num(u, "prompt_tokens"), num(cb, "non_prefix_hit_tokens"), num(cb, "prefix_hit_tokens")
}

// TestBackToBackReuseOfANewDocument (issue 28): a request sent right after
// another, with the same new ~2k-token document at another offset, reuses
// the document: its lookup waits for the first request's store, still in
// flight (fingerprints not registered yet), instead of missing it. On one
// node (the default model) and through the gateway over two nodes.
func TestBackToBackReuseOfANewDocument(t *testing.T) {
	t.Run("node", func(t *testing.T) {
		e := startEnv(t, options{})
		for i := range 3 {
			t0 := time.Now()
			prompt, np, p := backToBack(t, e, uint64(100+i))
			t.Logf("pair %d: second request: %d prompt tokens, %d reused at another offset (non-prefix), %d prefix (%v)",
				i, prompt, np, p, time.Since(t0).Round(time.Millisecond))
			if prompt < 1800 || np < prompt*3/4 {
				t.Errorf("pair %d: %d of %d prompt tokens reused at the new offset, want at least 3/4", i, np, prompt)
			}
		}
	})
	t.Run("gateway", func(t *testing.T) {
		e := startGatewayNodes(t, 2, nil, nil)
		for i := range 3 {
			t0 := time.Now()
			prompt, np, p := backToBack(t, e, uint64(200+i))
			t.Logf("pair %d through the gateway: second request: %d prompt tokens, %d reused at another offset, %d prefix (%v)",
				i, prompt, np, p, time.Since(t0).Round(time.Millisecond))
			if prompt < 1800 || np < prompt*3/4 {
				t.Errorf("pair %d: %d of %d prompt tokens reused at the new offset, want at least 3/4", i, np, prompt)
			}
		}
	})
}
