package model

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/reuseplan"
)

// UseConfig, in BlendInput.CheckLayer or BlendInput.RecompRatio, selects the
// model's configured value.
const UseConfig = -1

// BlendInput is a prompt whose KV cache is partly reused (a plain value; the
// model only reads it). Its zero CheckLayer and RecompRatio are real
// overrides (0): set them to UseConfig for the configured values.
type BlendInput struct {
	// Tokens is the whole prompt; the logits returned are those of its last
	// token.
	Tokens []int32
	// BlockTable covers positions [0, len(Tokens)).
	BlockTable []int32
	// PrefixReused: positions [0, PrefixReused) are an exact prefix reuse;
	// their K/V are in the cache and they are skipped entirely. When it
	// covers the whole prompt the last token is still recomputed (its
	// logits are needed).
	PrefixReused int
	// Reused are non-prefix ranges (inside [PrefixReused, len(Tokens)),
	// non-overlapping, any order) whose K/V the blend server has loaded
	// into the cache, already re-RoPE'd to their positions in this prompt.
	// Every other non-prefix token is new.
	Reused []reuseplan.Range
	// CheckLayer is the check layer cl; a negative value (UseConfig) means
	// Config.CheckLayer. Note that 0 is a valid override.
	CheckLayer int
	// RecompRatio is the fraction of reused tokens recomputed, in [0, 1]; a
	// negative value (UseConfig) means Config.RecompRatio. Note that 0 is a
	// valid override.
	RecompRatio float64
	// Await, when set, lets the load of the reused KV run concurrently with
	// the layers below the check layer, which recompute every non-prefix
	// token anyway (the loader must write only layers >= the check layer
	// of the Reused ranges; the prefix must be loaded already). BlendForward
	// calls it once, after those layers and before the check layer reads the
	// loaded K; it waits for the load and returns the ranges actually
	// loaded, a subset of Reused (the rest are computed like new tokens), or
	// an error that fails the forward. Reused is then the plan, assumed
	// loaded. Not supported on a sharded model (ErrInput).
	Await func() ([]reuseplan.Range, error)
	// Logits is how many trailing positions' logits BlendForward returns,
	// in position order, Vocab values each; those positions are always in
	// the important set. 0 means 1 (the last token's). At most the
	// positions after the prefix.
	Logits int
	// Select is the rule that picks the recomputed reused tokens: the
	// check layer's K deviation (SelectDeviation, the zero value:
	// CacheBlend's HKVD) or random tokens (SelectRandom, cb eval's
	// baseline), at the same ratio.
	Select Selection
	// SelectSeed seeds SelectRandom (the same seed picks the same tokens,
	// on every rank of a sharded model).
	SelectSeed uint64
}

// Selection is a rule that picks which reused tokens the check layer
// recomputes (BlendInput.Select).
type Selection uint8

const (
	// SelectDeviation picks the reused tokens whose fresh K at the check
	// layer deviates most from the loaded K (CacheBlend's HKVD).
	SelectDeviation Selection = iota
	// SelectRandom picks reused tokens uniformly at random.
	SelectRandom
)

// String is the rule's name in reports: "hkvd" or "random".
func (s Selection) String() string {
	switch s {
	case SelectDeviation:
		return "hkvd"
	case SelectRandom:
		return "random"
	}
	return fmt.Sprintf("selection(%d)", uint8(s))
}

// BlendStats (a plain value) describes one BlendForward: the three phases' wall-clock
// bounds (for spans cb.full_recomp, cb.check and cb.partial) and the token
// counts. Phases that did not run have zero times.
type BlendStats struct {
	FullRecompStart, FullRecompEnd time.Time // layers 0..cl-1, every non-prefix token
	AwaitEnd                       time.Time // BlendInput.Await returned (zero without one)
	CheckStart, CheckEnd           time.Time // layer cl: K deviation, selection, important tokens
	PartialStart, PartialEnd       time.Time // layers cl+1..L-1, important tokens only

	CheckLayer   int     // cl used
	RecompRatio  float64 // ratio used
	PrefixTokens int     // tokens skipped as exact prefix reuse
	ReusedTokens int     // non-prefix tokens with loaded K/V
	NewTokens    int     // non-prefix tokens without loaded K/V
	// ImpCount is the important set: new tokens, the selected reused
	// tokens and always the last prompt token. Without reuse it is every
	// non-prefix token.
	ImpCount int
	// Selected is how many reused tokens were selected for recompute
	// (ceil(RecompRatio·ReusedTokens), plus those of the trailing tokens
	// whose logits are returned that are reused).
	Selected int
	// ImpEmpty is true when no reused token was selected for recompute.
	ImpEmpty bool
	// Dispatch names how the important set ran through the partial layers:
	// "unified" (one batch) or "full" (nothing reused: a plain prefill).
	Dispatch string
	// Blended is false when nothing was reused and the forward was a plain
	// prefill of the non-prefix part (only FullRecomp times are set; they
	// span every layer).
	Blended bool
}

// BlendForward runs the CacheBlend selective-recompute forward (docs/design.md §5)
// and returns the logits of the last prompt token (of the last in.Logits
// tokens, in order, when asked):
//
//   - prefix positions [0, PrefixReused) are skipped;
//   - layers 0..cl-1 recompute every other token, overwriting its K/V;
//   - at layer cl the fresh K of every reused token is compared with the
//     loaded K (squared L2 over all KV heads); the ceil(ratio·reused) most
//     deviating reused tokens (or random ones, SelectRandom), every new
//     token and the tokens whose logits are returned form the important set, whose K/V alone are rewritten at layer cl;
//   - layers cl+1..L-1 compute only the important set, attending over the
//     whole cache and writing K/V for the important tokens only.
//
// With nothing reused it is a plain prefill of [PrefixReused, len(Tokens)).
func (m *Model) BlendForward(kv *kvcache.Memory, in BlendInput) ([]float32, BlendStats, error) {
	var st BlendStats
	if err := m.checkKV(kv); err != nil {
		return nil, st, err
	}
	total := len(in.Tokens)
	if total == 0 {
		return nil, st, fmt.Errorf("%w: blend of an empty prompt", ErrInput)
	}
	if total > m.cfg.MaxPositions {
		return nil, st, fmt.Errorf("%w: prompt of %d tokens, model accepts %d positions", ErrPosition, total, m.cfg.MaxPositions)
	}
	if err := m.checkTokens(in.Tokens); err != nil {
		return nil, st, err
	}
	cl, ratio := in.CheckLayer, in.RecompRatio
	if cl < 0 {
		cl = m.cfg.CheckLayer
	}
	if ratio < 0 {
		ratio = m.cfg.RecompRatio
	}
	if cl >= m.cfg.Layers {
		return nil, st, fmt.Errorf("%w: check layer %d, model has %d layers", ErrInput, cl, m.cfg.Layers)
	}
	if math.IsNaN(ratio) || ratio > 1 {
		return nil, st, fmt.Errorf("%w: recompute ratio %v outside [0, 1]", ErrInput, ratio)
	}
	if in.Select > SelectRandom {
		return nil, st, fmt.Errorf("%w: selection rule %v", ErrInput, in.Select)
	}
	prefix := in.PrefixReused
	if prefix < 0 || prefix > total {
		return nil, st, fmt.Errorf("%w: prefix of %d tokens in a prompt of %d", ErrInput, prefix, total)
	}
	if prefix == total {
		prefix = total - 1
	}
	ranges, err := sortedRanges(in.Reused, in.PrefixReused, total)
	if err != nil {
		return nil, st, err
	}
	if in.Await != nil && m.tp != nil {
		return nil, st, fmt.Errorf("%w: a concurrent KV load (Await) on a sharded model", ErrInput)
	}

	ws := m.getWS()
	defer m.putWS(ws)
	// A sharded model's ranks reuse only what every rank loaded.
	prefix, ranges, err = m.agreeReused(ws, total, prefix, ranges)
	if err != nil {
		return nil, st, err
	}
	if prefix == total {
		prefix = total - 1
	}
	slots := ws.int(intCtx, total)
	if err := mapSlots(slots, in.BlockTable, kv.Layout()); err != nil {
		return nil, st, err
	}

	n := total - prefix // rows: positions [prefix, total)
	nl, err := logitRows(in.Logits, n)
	if err != nil {
		return nil, st, err
	}
	pos := ws.int(intPos, n)
	for i := range pos {
		pos[i] = prefix + i
	}
	reused := make([]bool, n)
	nReused := markReused(reused, ranges, prefix)
	st.CheckLayer, st.RecompRatio = cl, ratio
	st.PrefixTokens = prefix
	st.ReusedTokens = nReused
	st.NewTokens = n - nReused
	all := &batch{pos: pos, slot: slots[prefix:total], seqs: []seqInfo{{r0: 0, r1: n, ctx: total, slots: slots}}}
	m.angles(all, ws, anglesRows)
	d := m.cfg.Dim
	x := dense(ws.f32(bufXAll, n*d), n, d)
	m.embedRows(x, in.Tokens[prefix:])

	out := make([]float32, nl*m.cfg.Vocab)
	if nReused == 0 {
		st.Dispatch = "full"
		st.ImpCount = n
		st.ImpEmpty = true
		st.FullRecompStart = time.Now()
		if err := m.forwardLayers(ws, kv, 0, x, all, nl); err != nil {
			return nil, st, err
		}
		m.logits(ws, dense(out, nl, m.cfg.Vocab), x.view(n-nl, 0, nl, d))
		st.FullRecompEnd = time.Now()
		return out, st, nil
	}
	st.Blended = true
	st.Dispatch = "unified"

	// Phase 1: full recompute of layers 0..cl-1.
	st.FullRecompStart = time.Now()
	for l := range cl {
		if err := m.layer(ws, kv, l, x, all); err != nil {
			return nil, st, err
		}
	}
	st.FullRecompEnd = time.Now()

	// The concurrent load ends before the check layer reads it; what it
	// could not load is computed like new tokens.
	if in.Await != nil {
		got, err := in.Await()
		st.AwaitEnd = time.Now()
		if err != nil {
			return nil, st, fmt.Errorf("model: awaiting the KV load: %w", err)
		}
		loaded, err := sortedRanges(got, prefix, total)
		if err != nil {
			return nil, st, fmt.Errorf("awaited load: %w", err)
		}
		clear(reused)
		nReused = markReused(reused, loaded, prefix)
		st.ReusedTokens, st.NewTokens = nReused, n-nReused
	}

	// Phase 2: the check layer.
	st.CheckStart = time.Now()
	lw := &m.layers[cl]
	kvd := m.kvDim
	dev := ws.f32(bufDev, n)
	// mlpRows rows at a time, so the normed rows and their keys stay the
	// size of a prefill chunk's buffers (a 2,000-token prompt's would be
	// 20 MiB at Llama-3.2-1B's width).
	for c0 := 0; c0 < n; c0 += mlpRows {
		c1 := min(n, c0+mlpRows)
		h := dense(ws.f32(bufH, (c1-c0)*d), c1-c0, d)
		m.normRows(h, x.view(c0, 0, c1-c0, d), lw.attnNorm)
		kf := dense(ws.f32(bufQKV, (c1-c0)*kvd), c1-c0, kvd)
		m.projectQKV(lw, kf, h, m.qDim, m.qDim+kvd)
		m.rowChunks(c1-c0, func(r0, r1 int) {
			old := make([]float32, kvd) // the cached K, as stored (F16 rounding included)
			for i := c0 + r0; i < c0+r1; i++ {
				if !reused[i] {
					dev[i] = 0
					continue
				}
				k := kf.row(i - c0)
				m.rotate(k, all, i)
				kv.Read(kvcache.Keys, cl, all.slot[i], old)
				var acc float32
				for j, v := range k {
					e := v - old[j]
					acc += e * e
				}
				dev[i] = acc
			}
		})
	}
	// Each rank measured its KV heads: the sum is the whole deviation, the
	// same on every rank, so every rank selects the same tokens.
	if err := m.allReduce(dev); err != nil {
		return nil, st, err
	}
	order := ws.int(intOrder, 0)
	for i := range n {
		if reused[i] {
			order = append(order, i)
		}
	}
	if in.Select == SelectRandom {
		rng := rand.New(rand.NewPCG(in.SelectSeed, in.SelectSeed^0x9e3779b97f4a7c15))
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	} else {
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(dev[b], dev[a]) })
	}
	keep := int(math.Ceil(ratio * float64(nReused)))
	keep = min(keep, nReused)
	important := make([]bool, n)
	for i := range n {
		important[i] = !reused[i]
	}
	for _, i := range order[:keep] {
		important[i] = true
	}
	st.Selected = keep
	for i := n - nl; i < n; i++ { // the positions whose logits are returned
		if reused[i] && !important[i] {
			st.Selected++
		}
		important[i] = true
	}
	st.ImpEmpty = st.Selected == 0
	ws.ints[intOrder] = order[:0]

	imp := ws.int(intImp, 0)
	for i := range n {
		if important[i] {
			imp = append(imp, i)
		}
	}
	ws.ints[intImp] = imp[:0]
	ni := len(imp)
	st.ImpCount = ni
	posImp := ws.int(intPosImp, ni)
	slotImp := ws.int(intSlotImp, ni)
	xi := dense(ws.f32(bufX, ni*d), ni, d)
	hi := dense(ws.f32(bufOut, ni*d), ni, d)
	for r, i := range imp {
		posImp[r] = pos[i]
		slotImp[r] = all.slot[i]
		copy(xi.row(r), x.row(i))
	}
	m.normRows(hi, xi, lw.attnNorm) // as the check layer's chunks normed them
	ib := &batch{pos: posImp, slot: slotImp, seqs: []seqInfo{{r0: 0, r1: ni, ctx: total, slots: slots}}}
	m.angles(ib, ws, anglesImp)
	qkv := dense(ws.f32(bufQKV, ni*m.qkvDim), ni, m.qkvDim)
	m.projectQKV(lw, qkv, hi, 0, m.qkvDim)
	m.ropeAndStore(kv, cl, qkv, ib, true)
	if err := m.attendAndMLP(ws, kv, cl, xi, qkv, ib); err != nil {
		return nil, st, err
	}
	st.CheckEnd = time.Now()

	// Phase 3: partial layers cl+1..L-1 on the important set.
	st.PartialStart = st.CheckEnd
	if err := m.forwardLayers(ws, kv, cl+1, xi, ib, nl); err != nil {
		return nil, st, err
	}
	m.logits(ws, dense(out, nl, m.cfg.Vocab), xi.view(ni-nl, 0, nl, d))
	st.PartialEnd = time.Now()
	return out, st, nil
}

// sortedRanges returns the reused ranges sorted, checked to lie inside
// [prefix, total), non-empty and non-overlapping.
func sortedRanges(in []reuseplan.Range, prefix, total int) ([]reuseplan.Range, error) {
	ranges := slices.Clone(in)
	slices.SortFunc(ranges, func(a, b reuseplan.Range) int { return cmp.Compare(a.Start, b.Start) })
	for i, r := range ranges {
		if r.Start < prefix || r.End > total || r.Start >= r.End {
			return nil, fmt.Errorf("%w: reused range [%d, %d) outside [%d, %d) or empty", ErrInput, r.Start, r.End, prefix, total)
		}
		if i > 0 && r.Start < ranges[i-1].End {
			return nil, fmt.Errorf("%w: reused ranges [%d, %d) and [%d, %d) overlap", ErrInput, ranges[i-1].Start, ranges[i-1].End, r.Start, r.End)
		}
	}
	return ranges, nil
}

// markReused sets reused[p-prefix] for every position p >= prefix of the
// ranges and returns how many it set.
func markReused(reused []bool, ranges []reuseplan.Range, prefix int) int {
	n := 0
	for _, r := range ranges {
		for p := max(r.Start, prefix); p < r.End; p++ {
			reused[p-prefix] = true
			n++
		}
	}
	return n
}
