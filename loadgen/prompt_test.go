package loadgen

import (
	"strings"
	"testing"
)

func TestPromptGen(t *testing.T) {
	docs := cfgDocs(Config{API: "http://x"})
	g := promptGen{docs: docs, k: 3, maxPrefix: 100, seed: 42}
	orders := map[string]bool{}
	prefixes := map[int]bool{}
	for i := range 200 {
		p := g.build(i)
		if q := g.build(i); q.content != p.content {
			t.Fatalf("prompt %d is not deterministic", i)
		}
		if len(p.docs) != 3 || p.prefix < 0 || p.prefix > 100 {
			t.Fatalf("prompt %d: docs %v prefix %d", i, p.docs, p.prefix)
		}
		seen := map[string]bool{}
		for j, id := range p.docs {
			if seen[id] {
				t.Fatalf("prompt %d repeats %s", i, id)
			}
			seen[id] = true
			var text string
			for _, d := range docs {
				if d.ID == id {
					text = d.Text
				}
			}
			if !strings.HasPrefix(p.content[p.offsets[j]:], text) {
				t.Fatalf("prompt %d: %s not at offset %d", i, id, p.offsets[j])
			}
		}
		if !strings.HasSuffix(p.content, questions[i%len(questions)]) {
			t.Fatalf("prompt %d does not end with its question", i)
		}
		head := promptHeader
		if p.prefix > 0 {
			head = p.content[:p.prefix] + "\n\n" + promptHeader
			if strings.ContainsAny(p.content[:p.prefix], "\n") {
				t.Fatalf("filler holds a newline: %q", p.content[:p.prefix])
			}
		}
		if !strings.HasPrefix(p.content, head) || p.offsets[0] != len(head) {
			t.Fatalf("prompt %d: first document at %d, want %d", i, p.offsets[0], len(head))
		}
		orders[strings.Join(p.docs, ",")] = true
		prefixes[p.prefix] = true
	}
	// Random subsets in random order, and filler lengths spread over the range.
	if len(orders) < 50 || len(prefixes) < 50 {
		t.Errorf("%d distinct orders, %d distinct prefix lengths in 200 prompts", len(orders), len(prefixes))
	}
	if a, b := g.build(1).content, (promptGen{docs: docs, k: 3, maxPrefix: 100, seed: 43}).build(1).content; a == b {
		t.Error("the seed does not change the prompt")
	}
	if p := (promptGen{docs: docs, k: 2}).build(5); p.prefix != 0 || !strings.HasPrefix(p.content, promptHeader) {
		t.Errorf("no filler expected: %q", p.content[:40])
	}
}
