package fingerprint

import (
	"slices"

	"github.com/cacheblend/cacheblend/reuseplan"
)

// Match finds the reusable ranges of prompt[from:] (the part after the
// prefix leg's coverage) at any token offset: it computes the rolling hash
// of the W tokens at every offset (probe stride 1) and probes it in the
// table. Each hit is verified token by token against the stored chunk
// (collisions are rejected and counted), extended forward across consecutive
// live chunks of the same stored sequence while the tokens agree, and
// backward likewise down to from or the end of the previous match. The best
// (longest) candidate of at least MinMatch tokens is kept, and probing
// resumes at its end, so matches never overlap. Match allocates only for its
// result; it is safe for concurrent use with every other method.
func (t *Table) Match(prompt []int32, from int) Result {
	var res Result
	from = max(from, 0)
	w := t.window
	n := len(prompt)
	if n-from < w {
		return res
	}
	t.mu.RLock()
	defer t.mu.RUnlock()

	keys, heads, filter := t.keys, t.heads, t.filter
	mask, shift, fshift := t.mask, t.shift, t.fshift
	base, bw, seed, mixMul := t.base, t.basePowW1, t.seed, t.mixMul
	probes := 0
	lower := from // probing and backward extension never go below this
	p := from
	h := t.hashWindow(prompt[p : p+w])
	for {
		probes++
		k := h | 1
		m := k * fibMul
		if f := m >> fshift; filter[f>>6]&(1<<(f&63)) == 0 {
			goto next // definitely absent: the common case, no table access
		}
		for i := m >> shift; ; i = (i + 1) & mask {
			sk := keys[i]
			if sk == k {
				if e := heads[i]; e >= 0 {
					res.Stats.TableHits++
					if m, ok := t.verify(prompt, p, lower, e, &res.Stats); ok {
						res.Matches = append(res.Matches, m)
						res.Stats.Matches++
						res.Stats.HitTokens += m.Len()
						lower = m.Cur.End
					}
				}
				break
			}
			if sk == 0 {
				break
			}
		}
	next:
		if lower > p {
			// Resume after the match with a fresh window.
			p = lower
			if n-p < w {
				break
			}
			h = t.hashWindow(prompt[p : p+w])
			continue
		}
		if p+w >= n {
			break
		}
		out := (uint64(uint32(prompt[p])) ^ seed) * mixMul
		in := (uint64(uint32(prompt[p+w])) ^ seed) * mixMul
		h = (h-out*bw)*base + in
		p++
	}
	res.Stats.Probes = probes
	return res
}

// verify checks the candidates of entry list e against prompt[p:p+W],
// extends the verified ones and returns the longest match of at least
// MinMatch tokens. Caller holds the read lock.
func (t *Table) verify(prompt []int32, p, lower int, e int32, st *MatchStats) (Match, bool) {
	w := t.window
	win := prompt[p : p+w]
	var best Match
	var bestSeq *sequence
	found := false
	for c := 0; e >= 0 && c < t.maxCand; e, c = t.entries[e].next, c+1 {
		en := &t.entries[e]
		seq := en.seq
		cs := seq.chunkSize
		s0 := reuseplan.Chunk(int(en.chunk), cs, len(seq.tokens)).Start
		if !slices.Equal(win, seq.tokens[s0:s0+w]) {
			st.Collisions++
			continue
		}
		// Forward across consecutive live chunks.
		fwd := w
		for p+fwd < len(prompt) && s0+fwd < len(seq.tokens) &&
			prompt[p+fwd] == seq.tokens[s0+fwd] && seq.live[(s0+fwd)/cs] {
			fwd++
		}
		// Backward, never into the previous match or below from.
		back := 0
		for p-back > lower && s0-back > 0 &&
			prompt[p-back-1] == seq.tokens[s0-back-1] && seq.live[(s0-back-1)/cs] {
			back++
		}
		if back+fwd < t.minMatch {
			st.Short++
			continue
		}
		if found && back+fwd <= best.Len() {
			continue
		}
		best = Match{Match: reuseplan.Match{Cur: reuseplan.Range{Start: p - back, End: p + fwd}, StoredStart: s0 - back}, ChunkSize: cs}
		bestSeq = seq
		found = true
	}
	if found {
		// The sequence's keys, clipped to the chunks the stored range spans.
		best.Keys = bestSeq.keys
		best.Match, _ = best.Clip(best.Cur, best.ChunkSize)
		best.Keys = slices.Clone(best.Keys)
		best.Sequence = bestSeq.id
	}
	return best, found
}
