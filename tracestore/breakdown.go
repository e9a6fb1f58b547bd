package tracestore

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/contract"
)

// Breakdown is "where the time went" for one trace: per-span self time, the root's wall
// time shared out among the spans that were running, totals per service and phase, and the
// critical path. All times are nanoseconds; offsets are relative to the root's start.
//
// Every span is clipped to its parent's interval first (a child recorded by another process
// may stick out by the clock skew between hosts), so that the tree is well nested. Then:
//   - SelfNs of a span is its clipped duration minus the union of its children's clipped
//     intervals: the time it was the innermost open span of its own subtree.
//   - AttributedNs shares every instant of the root's interval equally among the innermost
//     spans open at that instant (a span is innermost when none of its children is open).
//     When siblings never overlap it equals SelfNs; when they do (e.g. engine.prefill and
//     cb.request running side by side) the overlap is split instead of counted twice, so the
//     attributed times of all spans sum exactly to the root's duration.
//   - The critical path walks back from the root's end, always descending into the child
//     that finished last before the current instant, as Jaeger's UI does, except that a
//     child still running at that instant counts as finishing there (so work that a
//     sibling waited on is found even when it ends later); its segments tile the root's
//     interval.
//
// Spans whose parent is not in the trace (a lost span, or a second root) are attached to
// the root and marked Detached.
type Breakdown struct {
	TraceID    string `json:"traceID"`
	RequestID  string `json:"requestID,omitempty"`
	RootSpanID string `json:"rootSpanID"`
	RootName   string `json:"rootName"`
	// StartUnixNano is the root's start time.
	StartUnixNano int64 `json:"startUnixNano"`
	// DurationNs is the root's duration; Groups' AttributedNs sum to it.
	DurationNs int64 `json:"durationNs"`
	// Spans in depth-first order, children by start time.
	Spans []SpanTiming `json:"spans"`
	// Lanes are the process instances that recorded Spans, one per distinct
	// (service, instance), in order of their first span's start.
	Lanes []Lane `json:"lanes"`
	// Groups aggregate Spans by process instance and phase, largest
	// attributed time first.
	Groups []GroupTiming `json:"groups"`
	// CriticalPath in time order.
	CriticalPath []PathSegment `json:"criticalPath"`
	// Detached counts spans attached to the root because their parent is missing.
	Detached int `json:"detached"`
}

// SpanTiming is one span of a [Breakdown].
type SpanTiming struct {
	SpanID   string `json:"spanID"`
	ParentID string `json:"parentID,omitempty"`
	Name     string `json:"name"`
	Service  string `json:"service"`
	// Instance is the service.instance.id of the span's process ("" when it
	// set none) and Lane the label of its lane (see [LaneName]).
	Instance string `json:"instance,omitempty"`
	Lane     string `json:"lane"`
	Kind     string `json:"kind,omitempty"`
	Phase    string `json:"phase"`
	Depth    int    `json:"depth"`
	// StartNs and DurationNs are as recorded (StartNs relative to the root's start).
	StartNs    int64 `json:"startNs"`
	DurationNs int64 `json:"durationNs"`
	// ClippedStartNs and ClippedEndNs bound the span after clipping to its parent;
	// equal when nothing is left.
	ClippedStartNs int64   `json:"clippedStartNs"`
	ClippedEndNs   int64   `json:"clippedEndNs"`
	SelfNs         int64   `json:"selfNs"`
	AttributedNs   float64 `json:"attributedNs"`
	CriticalNs     int64   `json:"criticalNs"`
	Detached       bool    `json:"detached,omitempty"`
	Error          bool    `json:"error,omitempty"`
}

// Lane is one process instance of a [Breakdown]: the two engines of a
// disaggregated request (prefill and decode, both cb-engine) or the engines of
// two nodes are two lanes.
type Lane struct {
	// Name is [LaneName] of Service and Instance; unique in a Breakdown.
	Name     string `json:"name"`
	Service  string `json:"service"`
	Instance string `json:"instance,omitempty"`
	// Spans is the number of spans the instance recorded in the trace.
	Spans int `json:"spans"`
}

// LaneName labels a process instance: "service@instance", or the service
// alone when the process exported no service.instance.id. cb processes set
// service.instance.id to the host:port of their main listener, so the label
// is node-qualified (cb-engine@127.0.0.1:8001).
func LaneName(service, instance string) string {
	if instance == "" {
		return service
	}
	return service + "@" + instance
}

// GroupTiming is the total of the spans of one process instance and phase.
type GroupTiming struct {
	Service      string  `json:"service"`
	Instance     string  `json:"instance,omitempty"`
	Lane         string  `json:"lane"`
	Phase        string  `json:"phase"`
	Spans        int     `json:"spans"`
	SelfNs       int64   `json:"selfNs"`
	AttributedNs float64 `json:"attributedNs"`
	CriticalNs   int64   `json:"criticalNs"`
	// Fraction is AttributedNs over the root's duration.
	Fraction float64 `json:"fraction"`
}

// PathSegment is one piece of the critical path: span SpanID was the bottleneck from
// StartNs to EndNs (relative to the root's start).
type PathSegment struct {
	SpanID  string `json:"spanID"`
	Name    string `json:"name"`
	Service string `json:"service"`
	Lane    string `json:"lane"`
	StartNs int64  `json:"startNs"`
	EndNs   int64  `json:"endNs"`
}

// Phase names the stage of a request a span belongs to, for grouping: the phase the span
// contract (contract/spans.yaml) gives the span — queue, prefill, decode, schedule, lookup,
// l2 load, execute, kv load, forward, store (see [contract.Phases]). The root is "request"
// whatever its name; any other span the contract does not name exactly (an unknown span, or
// one named by a pattern such as a second SERVER span) is its own phase: its name.
func Phase(name string, isRoot bool) string {
	if isRoot {
		return string(contract.PhaseRequest)
	}
	if p, ok := contractPhases()[name]; ok {
		return string(p)
	}
	return name
}

// contractPhases maps every span the embedded contract names exactly to its phase. The
// contract package's tests keep the embedded file valid; were it not, no span would have a
// contract phase and each would be grouped under its own name.
var contractPhases = sync.OnceValue(func() map[string]contract.Phase {
	set, err := contract.Spans()
	if err != nil {
		return nil
	}
	m := make(map[string]contract.Phase, len(set.Spans))
	for _, sp := range set.Spans {
		if sp.NamePattern == "" {
			m[sp.Name] = sp.Phase
		}
	}
	return m
})

// tree is a trace's spans arranged under one root.
type tree struct {
	spans    []*span
	root     int
	parent   []int // -1 for the root
	children [][]int
	detached []bool
}

// buildTree picks the root (among spans whose parent is not in the trace: the longest,
// then the earliest, then the smallest id) and attaches every other parentless span, and
// any span on a parent cycle, to it. spans must be non-empty.
func buildTree(spans []*span) *tree {
	n := len(spans)
	t := &tree{spans: spans, root: -1, parent: make([]int, n), children: make([][]int, n), detached: make([]bool, n)}
	byID := make(map[pcommon.SpanID]int, n)
	for i, sp := range spans {
		byID[sp.spanID] = i
	}
	for i, sp := range spans {
		p, ok := byID[sp.parentID]
		if sp.parentID.IsEmpty() || !ok || p == i {
			t.parent[i] = -1
			if t.root < 0 || betterRoot(spans[i], spans[t.root]) {
				t.root = i
			}
			continue
		}
		t.parent[i] = p
	}
	if t.root < 0 { // every span is on a parent cycle: take the best of them all
		t.root = 0
		for i := range spans {
			if betterRoot(spans[i], spans[t.root]) {
				t.root = i
			}
		}
		t.parent[t.root] = -1
	}
	for i := range spans {
		if i != t.root && t.parent[i] < 0 {
			t.parent[i] = t.root
			t.detached[i] = true
		}
	}
	// Break parent cycles: walk up from every span; a walk that meets itself detaches the
	// span where it closed the loop.
	const (
		unknown = iota
		onPath
		reaches
	)
	state := make([]uint8, n)
	state[t.root] = reaches
	var path []int
	for i := range spans {
		path = path[:0]
		v := i
		for state[v] == unknown {
			state[v] = onPath
			path = append(path, v)
			v = t.parent[v]
		}
		if state[v] == onPath { // cycle closed at v
			t.parent[v] = t.root
			t.detached[v] = true
		}
		for _, u := range path {
			state[u] = reaches
		}
	}
	for i := range spans {
		if p := t.parent[i]; p >= 0 {
			t.children[p] = append(t.children[p], i)
		}
	}
	for i := range t.children {
		slices.SortFunc(t.children[i], func(a, b int) int {
			return cmp.Or(cmp.Compare(spans[a].start, spans[b].start), strings.Compare(spans[a].name, spans[b].name), cmp.Compare(a, b))
		})
	}
	return t
}

// betterRoot reports whether a makes a better root than b: longer, then earlier, then with
// the smaller id.
func betterRoot(a, b *span) bool {
	return cmp.Or(cmp.Compare(b.duration(), a.duration()), cmp.Compare(a.start, b.start),
		strings.Compare(a.spanID.String(), b.spanID.String())) < 0
}

// order returns the spans in depth-first order with their depths.
func (t *tree) order() (order, depth []int) {
	depth = make([]int, len(t.spans))
	stack := []int{t.root}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		order = append(order, v)
		ch := t.children[v]
		for j := len(ch) - 1; j >= 0; j-- {
			depth[ch[j]] = depth[v] + 1
			stack = append(stack, ch[j])
		}
	}
	return order, depth
}

func computeBreakdown(spans []*span) Breakdown {
	if len(spans) == 0 {
		return Breakdown{}
	}
	t := buildTree(spans)
	order, depth := t.order()
	n := len(spans)
	root := spans[t.root]
	base := root.start

	// Clip to the parent, top-down.
	cs := make([]int64, n)
	ce := make([]int64, n)
	for _, v := range order {
		sp := spans[v]
		s, e := sp.start, max(sp.start, sp.end)
		if p := t.parent[v]; p >= 0 {
			s = min(max(s, cs[p]), ce[p])
			e = max(min(e, ce[p]), s)
		}
		cs[v], ce[v] = s, e
	}

	self := selfTimes(t, cs, ce)
	attributed := attribute(t, depth, cs, ce)
	path, critical := criticalPath(t, cs, ce)

	bd := Breakdown{
		TraceID:       root.traceID.String(),
		RootSpanID:    root.spanID.String(),
		RootName:      root.name,
		StartUnixNano: base,
		DurationNs:    ce[t.root] - cs[t.root],
		Spans:         make([]SpanTiming, 0, n),
	}
	if rid, ok := requestID(spans); ok {
		bd.RequestID = rid
	}
	groups := map[[2]string]*GroupTiming{}
	lanes := map[string]int{}       // lane name -> index in bd.Lanes
	laneStart := map[string]int64{} // lane name -> its earliest span start
	for _, v := range order {
		sp := spans[v]
		st := SpanTiming{
			SpanID:         sp.spanID.String(),
			Name:           sp.name,
			Service:        sp.res.service,
			Instance:       sp.res.instance,
			Lane:           LaneName(sp.res.service, sp.res.instance),
			Kind:           kindTag(sp.kind),
			Phase:          Phase(sp.name, v == t.root),
			Depth:          depth[v],
			StartNs:        sp.start - base,
			DurationNs:     sp.duration(),
			ClippedStartNs: cs[v] - base,
			ClippedEndNs:   ce[v] - base,
			SelfNs:         self[v],
			AttributedNs:   attributed[v],
			CriticalNs:     critical[v],
			Detached:       t.detached[v],
			Error:          sp.status == ptrace.StatusCodeError,
		}
		if !sp.parentID.IsEmpty() {
			st.ParentID = sp.parentID.String()
		}
		if t.detached[v] {
			bd.Detached++
		}
		bd.Spans = append(bd.Spans, st)
		if i, ok := lanes[st.Lane]; ok {
			bd.Lanes[i].Spans++
			laneStart[st.Lane] = min(laneStart[st.Lane], sp.start)
		} else {
			lanes[st.Lane] = len(bd.Lanes)
			bd.Lanes = append(bd.Lanes, Lane{Name: st.Lane, Service: st.Service, Instance: st.Instance, Spans: 1})
			laneStart[st.Lane] = sp.start
		}
		k := [2]string{st.Lane, st.Phase}
		g := groups[k]
		if g == nil {
			g = &GroupTiming{Service: st.Service, Instance: st.Instance, Lane: st.Lane, Phase: st.Phase}
			groups[k] = g
		}
		g.Spans++
		g.SelfNs += st.SelfNs
		g.AttributedNs += st.AttributedNs
		g.CriticalNs += st.CriticalNs
	}
	for _, g := range groups {
		if bd.DurationNs > 0 {
			g.Fraction = g.AttributedNs / float64(bd.DurationNs)
		}
		bd.Groups = append(bd.Groups, *g)
	}
	slices.SortFunc(bd.Groups, func(a, b GroupTiming) int {
		return cmp.Or(cmp.Compare(b.AttributedNs, a.AttributedNs), strings.Compare(a.Lane, b.Lane), strings.Compare(a.Phase, b.Phase))
	})
	slices.SortStableFunc(bd.Lanes, func(a, b Lane) int {
		return cmp.Or(cmp.Compare(laneStart[a.Name], laneStart[b.Name]), strings.Compare(a.Name, b.Name))
	})
	for _, seg := range path {
		sp := spans[seg.v]
		bd.CriticalPath = append(bd.CriticalPath, PathSegment{
			SpanID: sp.spanID.String(), Name: sp.name, Service: sp.res.service,
			Lane:    LaneName(sp.res.service, sp.res.instance),
			StartNs: seg.start - base, EndNs: seg.end - base,
		})
	}
	return bd
}

// selfTimes returns each span's clipped duration minus the union of its children's.
func selfTimes(t *tree, cs, ce []int64) []int64 {
	self := make([]int64, len(t.spans))
	for v := range t.spans {
		covered := int64(0)
		curS, curE := int64(0), int64(0)
		open := false
		// children are sorted by recorded start; clipped starts keep that order except where
		// clipping raised several to the parent's start, so sort a copy by clipped start.
		ch := slices.Clone(t.children[v])
		slices.SortFunc(ch, func(a, b int) int { return cmp.Compare(cs[a], cs[b]) })
		for _, c := range ch {
			if ce[c] <= cs[c] {
				continue
			}
			if !open || cs[c] > curE {
				if open {
					covered += curE - curS
				}
				curS, curE, open = cs[c], ce[c], true
			} else if ce[c] > curE {
				curE = ce[c]
			}
		}
		if open {
			covered += curE - curS
		}
		self[v] = ce[v] - cs[v] - covered
	}
	return self
}

// attribute shares the root's interval among the innermost open spans, with a sweep over
// the span boundaries. g accumulates dt/k (k = number of innermost open spans); a span
// collects the growth of g while it is innermost.
func attribute(t *tree, depth []int, cs, ce []int64) []float64 {
	n := len(t.spans)
	// At one instant: ends before starts; ends deepest first, starts shallowest first
	// (order: the depth, negated for an end).
	const (
		isEnd = iota
		isStart
	)
	type ev struct {
		at          int64
		kind, order int
		v           int
	}
	evs := make([]ev, 0, 2*n)
	for v := 0; v < n; v++ {
		if ce[v] > cs[v] {
			evs = append(evs, ev{cs[v], isStart, depth[v], v}, ev{ce[v], isEnd, -depth[v], v})
		}
	}
	slices.SortFunc(evs, func(a, b ev) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.kind, b.kind), cmp.Compare(a.order, b.order), cmp.Compare(a.v, b.v))
	})
	out := make([]float64, n)
	active := make([]bool, n)
	openChildren := make([]int, n)
	inner := make([]bool, n)
	entry := make([]float64, n)
	g, k := 0.0, 0
	var last int64
	enter := func(v int) { inner[v], entry[v] = true, g; k++ }
	leave := func(v int) { out[v] += g - entry[v]; inner[v] = false; k-- }
	for i, e := range evs {
		if i > 0 && e.at > last && k > 0 {
			g += float64(e.at-last) / float64(k)
		}
		last = e.at
		p := t.parent[e.v]
		if e.kind == isStart {
			active[e.v] = true
			if p >= 0 && active[p] {
				if openChildren[p]++; openChildren[p] == 1 && inner[p] {
					leave(p)
				}
			}
			if openChildren[e.v] == 0 {
				enter(e.v)
			}
			continue
		}
		if inner[e.v] {
			leave(e.v)
		}
		active[e.v] = false
		if p >= 0 && active[p] {
			if openChildren[p]--; openChildren[p] == 0 {
				enter(p)
			}
		}
	}
	return out
}

type segment struct {
	v          int
	start, end int64
}

// criticalPath walks back from the root's end (see [Breakdown]); it returns the segments in
// time order and the time each span spends on the path.
func criticalPath(t *tree, cs, ce []int64) ([]segment, []int64) {
	n := len(t.spans)
	// Non-empty children by clipped start (then end).
	byStart := make([][]int, n)
	for v := range n {
		for _, c := range t.children[v] {
			if ce[c] > cs[c] {
				byStart[v] = append(byStart[v], c)
			}
		}
		slices.SortFunc(byStart[v], func(a, b int) int {
			return cmp.Or(cmp.Compare(cs[a], cs[b]), cmp.Compare(ce[a], ce[b]), cmp.Compare(a, b))
		})
	}
	// open[v] counts v's children that start before the cursor; the cursor only moves back
	// in time, so it only shrinks.
	open := make([]int, n)
	for v := range n {
		open[v] = len(byStart[v])
	}
	var segs []segment
	on := make([]int64, n)
	push := func(v int, s, e int64) {
		if e > s {
			segs = append(segs, segment{v, s, e})
			on[v] += e - s
		}
	}
	cur, cursor := t.root, ce[t.root]
	for {
		ch := byStart[cur]
		for open[cur] > 0 && cs[ch[open[cur]-1]] >= cursor {
			open[cur]--
		}
		// The child that finished last before the cursor; a child still running at the
		// cursor counts as finishing there (the one that ends soonest after it wins).
		best, bestEnd := -1, int64(0)
		for _, c := range ch[:open[cur]] {
			e := min(ce[c], cursor)
			if best < 0 || e > bestEnd || e == bestEnd && (ce[c] < ce[best] || ce[c] == ce[best] && cs[c] > cs[best]) {
				best, bestEnd = c, e
			}
		}
		if best >= 0 {
			push(cur, bestEnd, cursor)
			cur, cursor = best, bestEnd
			continue
		}
		push(cur, cs[cur], cursor)
		if cur == t.root {
			break
		}
		cursor = cs[cur]
		cur = t.parent[cur]
	}
	slices.Reverse(segs)
	return segs, on
}
