package fingerprint

import (
	"math/rand/v2"
	"testing"
)

// TestProbesFindRegisteredChunks: the probe at a chunk's stored position in
// a prompt equals the chunk's fingerprint, at any offset, and the rolling
// values equal a fresh hash of each window.
func TestProbesFindRegisteredChunks(t *testing.T) {
	tab := NewTable(Config{})
	r := rand.New(rand.NewPCG(3, 4))
	doc := make([]int32, 100)
	for i := range doc {
		doc[i] = r.Int32N(50000)
	}
	for _, off := range []int{0, 1, 17, 333} {
		prompt := make([]int32, off+len(doc)+5)
		for i := range prompt {
			prompt[i] = r.Int32N(50000)
		}
		copy(prompt[off:], doc)
		probes := tab.Probes(prompt, 0)
		if len(probes) != len(prompt)-tab.Window()+1 {
			t.Fatalf("offset %d: %d probes", off, len(probes))
		}
		fp, ok := tab.ChunkFingerprint(doc)
		if !ok || probes[off] != fp {
			t.Fatalf("offset %d: probe %x, chunk fingerprint %x", off, probes[off], fp)
		}
		for p := range probes {
			if want := tab.hashWindow(prompt[p:p+tab.Window()]) | 1; probes[p] != want {
				t.Fatalf("offset %d: rolling probe %d = %x, fresh hash %x", off, p, probes[p], want)
			}
		}
	}
	if _, ok := tab.ChunkFingerprint(doc[:3]); ok {
		t.Fatal("a chunk shorter than W got a fingerprint")
	}
	if tab.Probes(doc[:5], 0) != nil {
		t.Fatal("probes of a prompt shorter than W")
	}
}
