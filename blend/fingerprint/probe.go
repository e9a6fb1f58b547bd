package fingerprint

// ChunkFingerprint is the fingerprint a stored chunk whose first tokens are
// tokens is registered under (the hash of its first W tokens), and false
// when the chunk is shorter than W (it gets none). It is what a fleet
// directory stores, so that [Table.Probes] of a prompt on another node
// finds the chunk.
func (t *Table) ChunkFingerprint(tokens []int32) (uint64, bool) {
	if len(tokens) < t.window {
		return 0, false
	}
	return t.hashWindow(tokens[:t.window]) | 1, true
}

// Probes returns the values [Table.Match] probes for prompt[from:]: the
// fingerprint of the W tokens at every offset p in [from, len(prompt)-W],
// in order. A fleet directory is probed with them in one batch.
func (t *Table) Probes(prompt []int32, from int) []uint64 {
	from = max(from, 0)
	w, n := t.window, len(prompt)
	if n-from < w {
		return nil
	}
	out := make([]uint64, 0, n-from-w+1)
	h := t.hashWindow(prompt[from : from+w])
	for p := from; ; p++ {
		out = append(out, h|1)
		if p+w >= n {
			break
		}
		h = (h-t.mix(prompt[p])*t.basePowW1)*t.base + t.mix(prompt[p+w])
	}
	return out
}

// Sibling returns an empty table with t's configuration (window, hash,
// minimum match and limits): matches against it are comparable with t's.
func (t *Table) Sibling() *Table {
	return NewTable(Config{Window: t.window, MinMatch: t.minMatch, Base: t.base, StaleStrikes: t.strikes, MaxCandidates: t.maxCand})
}
