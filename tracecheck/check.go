package tracecheck

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
)

// Defaults of [Options].
const (
	// DefaultCrossProcessTolerance is how far a synchronous child recorded by another
	// process may stick out of its parent: the clock skew between processes (here, of one
	// host's wall clock read by different processes).
	DefaultCrossProcessTolerance = 200 * time.Microsecond
	// DefaultSameProcessTolerance is zero: within one process a synchronous child lies
	// inside its parent exactly.
	DefaultSameProcessTolerance = 0
	DefaultHitRateTolerance     = 1e-6
)

// Options tune [CheckWith]. The zero value gives the defaults.
type Options struct {
	// CrossProcessTolerance is how far a synchronous child may stick out of its parent's
	// interval when the two were recorded by different services (clock skew between
	// processes). 0 means DefaultCrossProcessTolerance (200 µs); negative means none.
	CrossProcessTolerance time.Duration
	// SameProcessTolerance is the same within one service. 0 and negative mean none (the
	// default): a process reads one clock, so its children lie inside their parents.
	SameProcessTolerance time.Duration
	// HitRateTolerance bounds |hit_rate − hit_tokens / requested_tokens| on cb.request and
	// cb.lookup. 0 means DefaultHitRateTolerance (1e-6).
	HitRateTolerance float64
}

func (o Options) withDefaults() Options {
	switch {
	case o.CrossProcessTolerance == 0:
		o.CrossProcessTolerance = DefaultCrossProcessTolerance
	case o.CrossProcessTolerance < 0:
		o.CrossProcessTolerance = 0
	}
	o.SameProcessTolerance = max(0, o.SameProcessTolerance)
	if o.HitRateTolerance <= 0 {
		o.HitRateTolerance = DefaultHitRateTolerance
	}
	return o
}

// Check validates traces against the span contract with the default [Options].
func Check(traces []Trace, spec *contract.SpanSet) Report {
	return CheckWith(traces, spec, Options{})
}

// CheckWith validates each trace against the span contract:
//
//   - one trace id: every span carries the trace's id, span ids are unique, and a request's
//     spans (by request_id) are not split over several traces;
//   - the root: exactly one span without a parent in the trace, and it is the contract's
//     root (the engine's SERVER span for a request), or a caller above it: a span outside
//     the contract (a load generator) or a caller span of the contract (the gateway's,
//     contract.Span.Caller), the contract's root then a remote child of a caller span that
//     names it in its calls;
//   - every required span present (required: true, or its `when` condition holds, unless
//     an `alternative_to` sibling stands in): a condition on the span's parent is checked
//     under every instance of the parent (the span must be under each one that satisfies
//     it), a condition on another span holds when any span of that name satisfies it; a
//     span of the other trace kind is flagged; a span without may_repeat occurs at most
//     once per parent;
//   - each contract span with its service, kind and parent (by name; a remote parent in
//     another service counts), and its required attributes present with the declared types
//     (optional attributes, when present, too);
//   - no span ends before it starts; a child starts no earlier than its parent and, unless
//     the contract marks it async (asynchronous follow-up work such as cb.store), ends no
//     later: exactly within one service, within CrossProcessTolerance across services (clock
//     skew). A trace read at microsecond precision (Trace.Precision) gets the rounding of
//     that representation on end comparisons, nothing more;
//   - the lookup statistics of cb.request (and cb.lookup) add up: hit_tokens =
//     prefix_hit_tokens + non_prefix_hit_tokens, hit_rate = hit_tokens / requested_tokens
//     within the tolerance, prefix_coverage_tokens + n_non_prefix_tokens = requested_tokens,
//     prefix_hit_tokens <= prefix_coverage_tokens, non_prefix_hit_tokens <=
//     n_non_prefix_tokens, no negative count; on cb.request requested_tokens =
//     n_prompt_tokens, and a request whose lookup is not done has zero hit statistics.
//
// A span shared by several traces (contract other_parents: the worker's cb.execute and
// its subtree under a document's cb.store_pre_computed) is checked against its parent in
// the trace's kind. An ingest trace may hold several documents (one
// cb.store_pre_computed each, under one gateway.attempt); each contract root's subtree
// carries one request id. A gateway.attempt with AttrAbandoned = true was given up by the
// gateway while its engine went on: its remote child may end after it, and spans of its
// subtree (or cut off the trace's tree, with no request id of the live part) may be
// missing or have lost parents — noted, not failed. Without the mark the rules hold.
//
// A request whose root has status ERROR or an error.type attribute is not required to
// have every span (the contract's required spans are those of a successful request). A
// trace with no span of the contract is skipped, not failed.
func CheckWith(traces []Trace, spec *contract.SpanSet, opts Options) Report {
	opts = opts.withDefaults()
	rep := Report{Traces: make([]TraceResult, 0, len(traces))}
	for i := range traces {
		rep.Traces = append(rep.Traces, checkTrace(&traces[i], spec, &opts))
	}
	// A request's spans belong to one trace.
	byRequest := map[string][]int{}
	for i := range traces {
		seen := map[string]bool{}
		for _, sp := range traces[i].Spans {
			if v, ok := sp.Attributes["request_id"]; ok && v.Type == ValueString && v.Str != "" && !seen[v.Str] {
				seen[v.Str] = true
				byRequest[v.Str] = append(byRequest[v.Str], i)
			}
		}
	}
	for _, rid := range slices.Sorted(maps.Keys(byRequest)) {
		idx := byRequest[rid]
		if len(idx) < 2 {
			continue
		}
		for _, i := range idx {
			var others []string
			for _, j := range idx {
				if j != i {
					others = append(others, traces[j].TraceID)
				}
			}
			rep.Traces[i].add(Violation{Rule: RuleOneTraceID,
				Message: fmt.Sprintf("request %s also has spans in trace %s", rid, strings.Join(others, ", "))})
		}
	}
	return rep
}

type checker struct {
	t      *Trace
	spec   *contract.SpanSet
	opts   *Options
	res    *TraceResult
	byID   map[string]int
	match  []*contract.Span // contract span of each recorded span, nil if none
	kind   string           // contract trace kind
	relax  bool             // failed request: presence not required
	rootIx int
	id     string // the trace id
	// abandoned marks the spans that may belong to an attempt the gateway abandoned
	// (AttrAbandoned; markAbandoned); anyAbandoned is set when the trace has one.
	abandoned    []bool
	anyAbandoned bool
}

// AttrAbandoned is the bool attribute of a gateway.attempt the gateway gave
// up on while the engine may still be working (a failover): its remote child
// may end after it, and spans of its subtree may be missing or detached (lost
// in the exports of a node cut off the network). Everywhere else the rules
// hold as usual.
const AttrAbandoned = "gateway.abandoned"

func checkTrace(t *Trace, spec *contract.SpanSet, opts *Options) TraceResult {
	res := TraceResult{TraceID: t.TraceID, RequestID: t.RequestID(), Spans: len(t.Spans)}
	if len(t.Spans) == 0 {
		res.add(Violation{Rule: RuleRoot, Message: "the trace has no spans"})
		return res
	}
	c := &checker{t: t, spec: spec, opts: opts, res: &res, byID: make(map[string]int, len(t.Spans)), match: make([]*contract.Span, len(t.Spans))}
	c.ids()
	root := c.root()
	if root < 0 {
		return res
	}
	c.rootIx = root
	res.Root = t.Spans[root].Name
	c.classify(root)
	if c.kind == "" {
		res.Skipped = true
		res.Notes = append(res.Notes, "no span of the contract; not checked")
		return res
	}
	res.Kind = c.kind
	c.markAbandoned()
	rs := &t.Spans[root]
	if et, ok := rs.Attributes["error.type"]; ok || rs.Error {
		c.relax = true
		why := "status ERROR"
		if ok {
			why = "error.type=" + et.String()
		}
		res.Notes = append(res.Notes, fmt.Sprintf("the request failed (%s): required spans not enforced", why))
	}
	c.checkRoot(root)
	for i := range t.Spans {
		c.checkSpan(i)
	}
	c.presence()
	c.lookupStats()
	c.requestIDs()
	return res
}

// ids checks the trace id of every span and the uniqueness of span ids.
func (c *checker) ids() {
	c.id = c.t.TraceID
	if c.id == "" {
		c.id = c.t.Spans[0].TraceID
		c.res.TraceID = c.id
	}
	var foreign []string
	for i := range c.t.Spans {
		sp := &c.t.Spans[i]
		if sp.TraceID != c.id {
			foreign = append(foreign, fmt.Sprintf("%s (%s)", sp.Name, sp.TraceID))
		}
		if _, dup := c.byID[sp.SpanID]; dup {
			c.res.add(Violation{Rule: RuleOneTraceID, Span: sp.Name, SpanID: sp.SpanID, Message: "span id used twice in the trace"})
			continue
		}
		c.byID[sp.SpanID] = i
	}
	if len(foreign) > 0 {
		c.res.add(Violation{Rule: RuleOneTraceID,
			Message: fmt.Sprintf("%d span(s) carry another trace id than %s: %s", len(foreign), c.id, abbreviate(foreign, 5))})
	}
}

// parent returns the index of a span's parent in the trace, or -1.
func (c *checker) parent(i int) int {
	p := c.t.Spans[i].ParentSpanID
	if p == "" {
		return -1
	}
	if j, ok := c.byID[p]; ok && j != i {
		return j
	}
	return -1
}

// root finds the one span without a parent in the trace; several are reported.
func (c *checker) root() int {
	var roots []int
	for i := range c.t.Spans {
		if c.parent(i) < 0 {
			roots = append(roots, i)
		}
	}
	if len(roots) == 0 { // every span has a parent in the trace: a cycle
		c.res.add(Violation{Rule: RuleRoot, Message: "no root: the parent links form a cycle"})
		return -1
	}
	// The longest parentless span is the root; checkSpan reports the others.
	slices.SortStableFunc(roots, func(a, b int) int {
		return cmp.Compare(c.t.Spans[b].Duration(), c.t.Spans[a].Duration())
	})
	return roots[0]
}

// classify matches every span to the contract and decides the trace kind: that of the
// root's contract span when it is a contract root, else the kind most spans belong to.
func (c *checker) classify(root int) {
	count := map[string]int{}
	for i := range c.t.Spans {
		if cs, ok := c.spec.Match(c.t.Spans[i].Name); ok {
			c.match[i] = cs
			if !cs.Caller { // a caller belongs to whichever trace it calls
				count[cs.Trace]++
			}
		}
	}
	if cs := c.match[root]; cs != nil && cs.Parent == "" && !cs.Caller {
		c.kind = cs.Trace
		return
	}
	// Under a caller (or with the root lost), the trace is that of the contract roots
	// it holds: spans shared by several traces (other_parents) do not decide.
	roots := map[string]int{}
	for i, cs := range c.match {
		if cs != nil && cs.Parent == "" && !cs.Caller && c.parentRoot(i) {
			roots[cs.Trace]++
		}
	}
	if len(roots) > 0 {
		count = roots
	}
	best := 0
	for _, k := range slices.Sorted(maps.Keys(count)) {
		if count[k] > best {
			c.kind, best = k, count[k]
		}
	}
}

// parentRoot reports whether span i has no parent in the trace that is a non-caller
// contract span (a contract root as recorded: under a caller, a foreign span, or nothing).
func (c *checker) parentRoot(i int) bool {
	p := c.parent(i)
	return p < 0 || c.match[p] == nil || c.match[p].Caller
}

// markAbandoned marks the spans that may belong to an abandoned attempt: the subtrees
// of the client spans marked abandoned (abandonAttrs: a gateway.attempt, a kv.transfer), and, when the trace has
// such an attempt, the spans cut off the root's tree (their parent lost) unless they
// carry (or sit under a span carrying) a request id of the tree's live part.
func (c *checker) markAbandoned() {
	n := len(c.t.Spans)
	c.abandoned = make([]bool, n)
	attached := make([]bool, n)
	for i := range c.t.Spans {
		if c.isAbandonedAttempt(i) {
			c.anyAbandoned = true
		}
		top := i
		for p, steps := c.parent(i), 0; p >= 0 && steps < n; p, steps = c.parent(p), steps+1 {
			if c.isAbandonedAttempt(p) {
				c.abandoned[i] = true
			}
			top = p
		}
		attached[i] = top == c.rootIx
	}
	if !c.anyAbandoned {
		return
	}
	live := map[string]bool{}
	for i := range c.t.Spans {
		if v, ok := c.t.Spans[i].Attributes["request_id"]; ok && v.Type == ValueString && attached[i] && !c.abandoned[i] {
			live[v.Str] = true
		}
	}
	for i := range c.t.Spans {
		if attached[i] {
			continue
		}
		id := ""
		for j, steps := i, 0; j >= 0 && steps <= n && id == ""; j, steps = c.parent(j), steps+1 {
			if v, ok := c.t.Spans[j].Attributes["request_id"]; ok && v.Type == ValueString {
				id = v.Str
			}
		}
		c.abandoned[i] = id == "" || !live[id]
	}
}

func (c *checker) checkRoot(root int) {
	want, ok := c.spec.Root(c.kind)
	if !ok {
		return
	}
	sp := &c.t.Spans[root]
	if c.match[root] == nil || c.match[root].Caller {
		// A caller that traces too (a load generator, the gateway) may sit above the
		// contract's root: fine when the contract root's ancestors are all outside the
		// contract or caller spans (checkSpan checks the caller span's calls).
		for i := range c.t.Spans {
			if c.match[i] != want {
				continue
			}
			outside := true
			for p, steps := c.parent(i), 0; p >= 0 && steps < len(c.t.Spans); p, steps = c.parent(p), steps+1 {
				if c.match[p] != nil && !c.match[p].Caller {
					outside = false
					break
				}
			}
			if outside {
				what := "a caller outside the contract"
				if c.match[root] != nil {
					what = "the contract's caller above it"
				}
				c.res.Notes = append(c.res.Notes, fmt.Sprintf("the request's root %q [%s] has %s: %q [%s]",
					c.t.Spans[i].Name, c.t.Spans[i].Service, what, sp.Name, sp.Service))
				return
			}
		}
	}
	if cs := c.match[root]; cs != want {
		c.res.add(Violation{Rule: RuleRoot, Span: sp.Name, SpanID: sp.SpanID, Service: sp.Service,
			Message: fmt.Sprintf("the root is %q [%s], want %q [%s]", sp.Name, sp.Service, want.Name, want.Service)})
	}
}

func (c *checker) tolerance(a, b *Span) time.Duration {
	if a.Service != b.Service {
		return c.opts.CrossProcessTolerance
	}
	return c.opts.SameProcessTolerance
}

// rounding is how early an end may read because of the trace's precision: a start and a
// duration each truncated lose less than one unit each.
func (c *checker) rounding() time.Duration {
	if p := c.t.Precision; p > 0 {
		return 2*p - 1
	}
	return 0
}

func (c *checker) checkSpan(i int) {
	sp := &c.t.Spans[i]
	v := func(rule Rule, format string, args ...any) {
		c.res.add(Violation{Rule: rule, Span: sp.Name, SpanID: sp.SpanID, Service: sp.Service, Message: fmt.Sprintf(format, args...)})
	}
	if sp.End.Before(sp.Start) {
		v(RuleInterval, "ends %s before it starts", sp.Start.Sub(sp.End))
	}
	cs := c.match[i]
	p := c.parent(i)
	if p >= 0 {
		ps := &c.t.Spans[p]
		tol := c.tolerance(sp, ps)
		if d := ps.Start.Sub(sp.Start); d > tol {
			v(RuleInterval, "starts %s before its parent %s [%s] (tolerance %s)", d, ps.Name, ps.Service, tol)
		}
		async := cs != nil && cs.Async && cs.InTrace(c.kind)
		if c.isAbandonedAttempt(p) || c.abandoned[i] {
			// The caller gave up on the call: the callee may go on, and the
			// cancellation reaches the callee's own remote callees late.
			async = true
		}
		if d := sp.End.Sub(ps.End); d > tol+c.rounding() && !async {
			v(RuleInterval, "ends %s after its parent %s [%s] (tolerance %s; only async spans may outlive their parent)", d, ps.Name, ps.Service, tol)
		}
	}
	if p < 0 && i != c.rootIx {
		msg := "a second root: no parent"
		if sp.ParentSpanID != "" {
			msg = fmt.Sprintf("parent %s is not in the trace (a lost span, or broken propagation)", sp.ParentSpanID)
		}
		if pn := c.parentName(cs); pn != "" {
			want, _ := c.spec.Lookup(pn)
			msg += fmt.Sprintf("; want parent %s [%s]", want.Name, want.Service)
		}
		if c.abandoned[i] {
			c.res.Notes = append(c.res.Notes, fmt.Sprintf("%s [%s] %s: %s (accepted: the trace has an abandoned attempt)",
				sp.Name, sp.Service, sp.SpanID, msg))
		} else {
			v(RuleParent, "%s", msg)
		}
	}
	if cs == nil {
		return
	}
	if !cs.InTrace(c.kind) && !cs.Caller {
		v(RuleWrongTrace, "belongs to the %s trace, found in a %s trace", cs.Trace, c.kind)
		return
	}
	if sp.Service != cs.Service {
		v(RuleService, "recorded by %s, want %s", sp.Service, cs.Service)
	}
	if sp.Kind != "" && sp.Kind != cs.Kind {
		v(RuleKind, "kind %s, want %s", sp.Kind, cs.Kind)
	}
	if pn := c.parentName(cs); pn != "" && p >= 0 {
		if want, _ := c.spec.Lookup(pn); c.match[p] != want {
			ps := &c.t.Spans[p]
			v(RuleParent, "parent is %s [%s], want %s [%s]", ps.Name, ps.Service, want.Name, want.Service)
		}
	}
	if cs.Parent == "" && !cs.Caller && p >= 0 {
		// A trace's root under a caller span: the caller must name it in its calls.
		if pc := c.match[p]; pc != nil && pc.Caller && !slices.Contains(pc.Calls, cs.Name) {
			ps := &c.t.Spans[p]
			v(RuleParent, "parent is the caller span %s [%s], which calls only %q", ps.Name, ps.Service, pc.Calls)
		}
	}
	for _, key := range cs.AttributeKeys() {
		want := cs.Attributes[key]
		got, ok := sp.Attributes[key]
		if !ok {
			v(RuleAttrMissing, "attribute %s (%s) missing", key, want)
			continue
		}
		if !typeMatches(got, want) {
			v(RuleAttrType, "attribute %s is %s %q, want %s", key, got.Type, got.String(), want)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(cs.OptionalAttributes)) {
		want := cs.OptionalAttributes[key]
		if got, ok := sp.Attributes[key]; ok && !typeMatches(got, want) {
			v(RuleAttrType, "attribute %s is %s %q, want %s", key, got.Type, got.String(), want)
		}
	}
}

// parentName is the name of contract span cs's parent in the trace's kind ("" for a
// root, or when cs is nil or belongs to another trace).
func (c *checker) parentName(cs *contract.Span) string {
	if cs == nil || !cs.InTrace(c.kind) && !cs.Caller {
		return ""
	}
	if cs.Caller {
		return cs.Parent
	}
	return c.spec.ParentIn(cs, c.kind)
}

// isAbandonedAttempt reports whether span i is a gateway.attempt with AttrAbandoned = true.
func (c *checker) isAbandonedAttempt(i int) bool {
	sp := &c.t.Spans[i]
	key, ok := abandonAttrs[sp.Name]
	if !ok {
		return false
	}
	v, ok := sp.Attributes[key]
	return ok && v.Type == ValueBool && v.Bool
}

// abandonAttrs are the client spans a caller may give up on while the
// callee goes on, and the bool attribute that says it did: a gateway
// attempt (AttrAbandoned) and a prefill engine's hand-over to a decode
// engine (AttrHandoffAbandoned).
var abandonAttrs = map[string]string{
	spanname.GatewayAttempt: AttrAbandoned,
	spanname.KVTransfer:     AttrHandoffAbandoned,
}

// AttrHandoffAbandoned is the bool attribute of a kv.transfer the prefill
// engine gave up on (see AttrAbandoned).
const AttrHandoffAbandoned = "abandoned"

func typeMatches(v Value, t contract.AttrType) bool {
	switch t {
	case contract.AttrString:
		return v.Type == ValueString
	case contract.AttrInt:
		return v.Type == ValueInt
	case contract.AttrDouble:
		return v.Type == ValueDouble
	case contract.AttrBool:
		return v.Type == ValueBool
	}
	return false
}

// presence checks required spans and repetitions.
func (c *checker) presence() {
	found := map[*contract.Span][]int{}
	for i, cs := range c.match {
		if cs != nil && (cs.InTrace(c.kind) || cs.Caller) {
			found[cs] = append(found[cs], i)
		}
	}
	missing := func(cs *contract.Span, where, why string) {
		msg := "required span missing" + where
		if why != "" {
			msg += " (" + why + ")"
		}
		if len(c.spec.Children(cs.Name)) > 0 {
			msg += ", with its subtree"
		}
		c.res.add(Violation{Rule: RuleMissing, Span: cs.Name, Service: cs.Service, Message: msg})
	}
	for k := range c.spec.Spans {
		cs := &c.spec.Spans[k]
		if !cs.InTrace(c.kind) && !cs.Caller {
			continue
		}
		idx := found[cs]
		if len(idx) > 0 && !cs.MayRepeat {
			perParent := map[string]int{}
			for _, i := range idx {
				perParent[c.t.Spans[i].ParentSpanID]++
			}
			for _, n := range perParent {
				if n > 1 {
					c.res.add(Violation{Rule: RuleRepeated, Span: cs.Name, Service: cs.Service,
						Message: fmt.Sprintf("occurs %d times under one parent; the contract allows one", n)})
					break
				}
			}
		}
		var parent *contract.Span
		if pn := c.parentName(cs); pn != "" {
			// A child is required only under its parent; a missing parent is reported
			// itself, with its subtree.
			if parent, _ = c.spec.Lookup(pn); len(found[parent]) == 0 {
				continue
			}
		}
		if c.relax {
			continue
		}
		if w := cs.When; w != nil && !cs.Required && parent != nil && w.Span == parent.Name {
			// A condition on the parent is checked under every parent instance.
			for _, pi := range found[parent] {
				if c.abandoned[pi] {
					continue // spans of an abandoned attempt may be lost
				}
				ok, why := c.holds(w, pi)
				if ok && !c.hasChild(pi, cs, found) {
					ps := &c.t.Spans[pi]
					missing(cs, fmt.Sprintf(" under %s (span %s)", ps.Name, ps.SpanID), why)
				}
			}
			continue
		}
		if len(idx) > 0 {
			continue
		}
		if parent != nil && !slices.ContainsFunc(found[parent], func(pi int) bool { return !c.abandoned[pi] }) {
			continue // only parents in abandoned subtrees, whose spans may be lost
		}
		required, why := c.required(cs, found)
		if !required || c.alternativePresent(cs, found, nil) {
			continue
		}
		missing(cs, "", why)
	}
}

// alternativePresent reports whether a span standing in for cs (alternative_to) is in
// the trace, under the recorded span under when it is not nil.
func (c *checker) alternativePresent(cs *contract.Span, found map[*contract.Span][]int, under *Span) bool {
	for k := range c.spec.Spans {
		alt := &c.spec.Spans[k]
		if alt.AlternativeTo != cs.Name {
			continue
		}
		for _, i := range found[alt] {
			if under == nil || c.t.Spans[i].ParentSpanID == under.SpanID {
				return true
			}
		}
	}
	return false
}

// hasChild reports whether the recorded span pi has a child of contract span cs (or of
// an alternative to it).
func (c *checker) hasChild(pi int, cs *contract.Span, found map[*contract.Span][]int) bool {
	ps := &c.t.Spans[pi]
	for _, i := range found[cs] {
		if c.t.Spans[i].ParentSpanID == ps.SpanID {
			return true
		}
	}
	return c.alternativePresent(cs, found, ps)
}

// required tells whether a contract span must be present in the trace, and why when
// conditional: required, or its condition holds on some span of the condition's name.
func (c *checker) required(cs *contract.Span, found map[*contract.Span][]int) (bool, string) {
	if cs.Required {
		return true, ""
	}
	w := cs.When
	if w == nil {
		return false, ""
	}
	on, ok := c.spec.Lookup(w.Span)
	if !ok {
		return false, ""
	}
	for _, i := range found[on] {
		if ok, why := c.holds(w, i); ok {
			return true, why
		}
	}
	return false, ""
}

// holds evaluates a condition on the recorded span i, and says why it holds.
func (c *checker) holds(w *contract.Condition, i int) (bool, string) {
	v, ok := c.t.Spans[i].Attributes[w.Attribute]
	if !ok {
		return false, ""
	}
	if w.Value.IsText {
		if v.Type != ValueString || !w.HoldsText(v.Str) {
			return false, ""
		}
	} else if n, ok := v.Number(); !ok || !w.Holds(n) {
		return false, ""
	}
	return true, fmt.Sprintf("%s.%s = %s %s %s", w.Span, w.Attribute, v.String(), w.Op, w.Value)
}

// Lookup outcomes: the values of cb.request's lookup attribute (see contract/spans.yaml).
const (
	// LookupDone is a lookup the blend server answered.
	LookupDone = "done"
	// LookupSkipped is a request served without a lookup (reuse off, no blend server).
	LookupSkipped = "skipped"
)

// lookupStats checks the statistics on cb.request and cb.lookup against each other.
func (c *checker) lookupStats() {
	for i := range c.t.Spans {
		sp := &c.t.Spans[i]
		if sp.Name != spanname.CBRequest && sp.Name != spanname.CBLookup {
			continue
		}
		v := func(format string, args ...any) {
			c.res.add(Violation{Rule: RuleHitRate, Span: sp.Name, SpanID: sp.SpanID, Service: sp.Service, Message: fmt.Sprintf(format, args...)})
		}
		ints := map[string]int64{}
		complete := true
		for _, k := range []string{"requested_tokens", "prefix_hit_tokens", "non_prefix_hit_tokens", "hit_tokens",
			"prefix_coverage_tokens", "n_non_prefix_tokens", "fingerprint_hits", "storage_hits", "stale_chunks"} {
			a, ok := sp.Attributes[k]
			if !ok || a.Type != ValueInt {
				complete = false // reported as a missing or mistyped attribute
				continue
			}
			if a.Int < 0 {
				v("negative %s %d", k, a.Int)
			}
			ints[k] = a.Int
		}
		hr, ok := sp.Attributes["hit_rate"]
		rate, isNum := hr.Number()
		if !ok || !isNum || !complete {
			continue
		}
		req, p, np, hits := ints["requested_tokens"], ints["prefix_hit_tokens"], ints["non_prefix_hit_tokens"], ints["hit_tokens"]
		cov, nnp := ints["prefix_coverage_tokens"], ints["n_non_prefix_tokens"]
		if hits != p+np {
			v("hit_tokens %d, but prefix_hit_tokens %d + non_prefix_hit_tokens %d = %d", hits, p, np, p+np)
		}
		switch {
		case hits > req:
			v("hit_tokens %d exceed requested_tokens %d", hits, req)
		case req == 0:
			if rate != 0 {
				v("hit_rate %g with requested_tokens 0, want 0", rate)
			}
		default:
			want := float64(hits) / float64(req)
			if math.IsNaN(rate) || math.Abs(rate-want) > c.opts.HitRateTolerance {
				v("hit_rate %g, but hit_tokens %d / requested_tokens %d = %g", rate, hits, req, want)
			}
		}
		if cov+nnp != req {
			v("prefix_coverage_tokens %d + n_non_prefix_tokens %d != requested_tokens %d", cov, nnp, req)
		}
		if p > cov {
			v("prefix_hit_tokens %d exceed prefix_coverage_tokens %d", p, cov)
		}
		if np > nnp {
			v("non_prefix_hit_tokens %d exceed n_non_prefix_tokens %d", np, nnp)
		}
		if sp.Name != spanname.CBRequest {
			continue
		}
		if n, ok := sp.Attributes["n_prompt_tokens"]; ok && n.Type == ValueInt && n.Int != req {
			v("requested_tokens %d, but n_prompt_tokens %d", req, n.Int)
		}
		if lk, ok := sp.Attributes["lookup"]; ok && lk.Type == ValueString && lk.Str != LookupDone {
			if hits != 0 || cov != 0 || ints["fingerprint_hits"] != 0 || ints["storage_hits"] != 0 || ints["stale_chunks"] != 0 {
				v("lookup %q (no result), but hit statistics are not zero: hit_tokens %d, prefix_coverage_tokens %d, fingerprint_hits %d, storage_hits %d, stale_chunks %d",
					lk.Str, hits, cov, ints["fingerprint_hits"], ints["storage_hits"], ints["stale_chunks"])
			}
		}
	}
}

// requestIDs flags spans of several requests in one request subtree: the spans under
// each contract root of the trace (a request's SERVER span, each document's
// cb.store_pre_computed, each attempt's engine span under the gateway) carry one
// request id. Spans outside every such subtree (a caller's, or ones whose parent is
// lost) count with the trace's only subtree when it has one.
func (c *checker) requestIDs() {
	group := make([]int, len(c.t.Spans)) // the topmost contract root above (or at) each span; -1 none
	groups := map[int]bool{}
	for i := range c.t.Spans {
		group[i] = -1
		for j, steps := i, 0; j >= 0 && steps <= len(c.t.Spans); j, steps = c.parent(j), steps+1 {
			if cs := c.match[j]; cs != nil && cs.Parent == "" && !cs.Caller && cs.Trace == c.kind {
				group[i] = j
			}
		}
		if group[i] >= 0 {
			groups[group[i]] = true
		}
	}
	if len(groups) <= 1 {
		for i := range group {
			group[i] = 0
		}
	}
	ids := map[int]map[string]int{}
	for i := range c.t.Spans {
		if v, ok := c.t.Spans[i].Attributes["request_id"]; ok && v.Type == ValueString {
			if ids[group[i]] == nil {
				ids[group[i]] = map[string]int{}
			}
			ids[group[i]][v.Str]++
		}
	}
	for _, g := range slices.Sorted(maps.Keys(ids)) {
		if len(ids[g]) > 1 {
			where := ""
			if g >= 0 && len(groups) > 1 {
				where = fmt.Sprintf(" under %s (span %s)", c.t.Spans[g].Name, c.t.Spans[g].SpanID)
			}
			c.res.add(Violation{Rule: RuleOneTraceID,
				Message: fmt.Sprintf("spans of several requests in one trace%s: request ids %s", where, strings.Join(slices.Sorted(maps.Keys(ids[g])), ", "))})
		}
	}
}

func abbreviate(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + fmt.Sprintf(", … (%d more)", len(items)-n)
}
