package gateway

import (
	"testing"
)

func TestKVAwarePrefersReuse(t *testing.T) {
	p := newPolicy(PolicyKVAware, DefaultAlpha, DefaultSpreadMargin)
	r := &RouteRequest{Operation: "chat", PromptTokens: 1000}
	c := []Candidate{
		{Name: "a", Load: 1, ExpectedHitTokens: 50},
		{Name: "b", Load: 2, ExpectedHitTokens: 900},
	}
	d := p.Choose(r, c, 0)
	if d.Index != 1 || d.Reason != ReasonReuse {
		t.Fatalf("decision %+v, want b for reuse", d)
	}
	if want := 0.9 - DefaultAlpha*2; d.Score < want-1e-9 || d.Score > want+1e-9 {
		t.Fatalf("score %v, want %v", d.Score, want)
	}
}

func TestKVAwareSpreadsBeyondTheMargin(t *testing.T) {
	p := newPolicy(PolicyKVAware, DefaultAlpha, 2)
	r := &RouteRequest{Operation: "chat", PromptTokens: 1000}
	// b holds the prompt but has 3 requests more than a: beyond the margin of 2.
	c := []Candidate{
		{Name: "a", Load: 0.1, ExpectedHitTokens: 0},
		{Name: "b", Load: 3.2, ExpectedHitTokens: 1000},
	}
	if d := p.Choose(r, c, 0); d.Index != 0 || d.Reason != ReasonSpread {
		t.Fatalf("decision %+v, want a (spread)", d)
	}
	// Within the margin it stays where the KV is.
	c[1].Load = 2
	if d := p.Choose(r, c, 0); d.Index != 1 || d.Reason != ReasonReuse {
		t.Fatalf("decision %+v, want b (reuse)", d)
	}
	// Spreading picks the best score among the engines within the margin of the least load.
	c = []Candidate{
		{Name: "a", Load: 0, ExpectedHitTokens: 0},
		{Name: "b", Load: 9, ExpectedHitTokens: 1000},
		{Name: "c", Load: 1, ExpectedHitTokens: 500},
	}
	if d := p.Choose(r, c, 0); d.Index != 2 || d.Reason != ReasonSpread {
		t.Fatalf("decision %+v, want c (spread, half reuse)", d)
	}
}

func TestKVAwareNewDocumentsSpread(t *testing.T) {
	p := newPolicy(PolicyKVAware, DefaultAlpha, DefaultSpreadMargin)
	r := &RouteRequest{Operation: "chat", PromptTokens: 700}
	// No reuse anywhere, same load: the engine with fewer recent requests.
	c := []Candidate{{Name: "a", Recent: 5}, {Name: "b", Recent: 1}}
	if d := p.Choose(r, c, 0); d.Index != 1 || d.Reason != ReasonLoad {
		t.Fatalf("decision %+v, want b (fewer recent requests)", d)
	}
	// Less KV held comes before fewer recent requests: new KV goes where it fits.
	c = []Candidate{{Name: "a", KVHeld: 0.5, Recent: 1}, {Name: "b", KVHeld: 0.1, Recent: 5}}
	for _, name := range []string{PolicyKVAware, PolicyLeastLoaded} {
		if d := newPolicy(name, DefaultAlpha, DefaultSpreadMargin).Choose(r, c, 0); d.Index != 1 {
			t.Fatalf("%s: decision %+v, want b (less KV held)", name, d)
		}
	}
	// A complete tie rotates.
	c = []Candidate{{Name: "a"}, {Name: "b"}}
	if a, b := p.Choose(r, c, 0), p.Choose(r, c, 1); a.Index == b.Index {
		t.Fatalf("a tie did not rotate: %+v %+v", a, b)
	}
}

func TestLeastLoadedAndRoundRobin(t *testing.T) {
	r := &RouteRequest{Operation: "chat", PromptTokens: 10}
	c := []Candidate{{Name: "a", Load: 3}, {Name: "b", Load: 1, ExpectedHitTokens: 0}, {Name: "c", Load: 2, ExpectedHitTokens: 10}}
	if d := newPolicy(PolicyLeastLoaded, 0, 0).Choose(r, c, 7); d.Index != 1 || d.Score != -1 || d.Reason != ReasonLoad {
		t.Fatalf("least-loaded %+v", d)
	}
	rr := newPolicy(PolicyRoundRobin, 0, 0)
	seen := map[int]int{}
	for i := range uint64(9) {
		d := rr.Choose(r, c, i)
		if d.Reason != ReasonRotation {
			t.Fatalf("round-robin %+v", d)
		}
		seen[d.Index]++
	}
	if seen[0] != 3 || seen[1] != 3 || seen[2] != 3 {
		t.Fatalf("round-robin spread %v", seen)
	}
}
