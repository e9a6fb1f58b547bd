package tracecheck

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
)

// Defaults of [Options].
const (
	DefaultCrossProcessTolerance = 5 * time.Millisecond
	DefaultSameProcessTolerance  = 500 * time.Microsecond
	DefaultHitRateTolerance      = 1e-6
)

// Options tune [CheckWith]. The zero value gives the defaults.
type Options struct {
	// CrossProcessTolerance is how far a child may stick out of its parent's interval when
	// the two were recorded by different services (clock skew between hosts). 0 means
	// DefaultCrossProcessTolerance (5 ms); negative means none.
	CrossProcessTolerance time.Duration
	// SameProcessTolerance is the same within one service. 0 means
	// DefaultSameProcessTolerance (0.5 ms); negative means none.
	SameProcessTolerance time.Duration
	// HitRateTolerance bounds |hit_rate − (prefix_hit_tokens + non_prefix_hit_tokens) /
	// requested_tokens| on cb.request. 0 means DefaultHitRateTolerance (1e-6).
	HitRateTolerance float64
	// Detached names spans that may end after their parent (asynchronous work the request
	// does not wait for). nil means {"cb.store"}; the contract documents it as ending after
	// the request's root.
	Detached []string
}

func (o Options) withDefaults() Options {
	tol := func(d, def time.Duration) time.Duration {
		switch {
		case d == 0:
			return def
		case d < 0:
			return 0
		}
		return d
	}
	o.CrossProcessTolerance = tol(o.CrossProcessTolerance, DefaultCrossProcessTolerance)
	o.SameProcessTolerance = tol(o.SameProcessTolerance, DefaultSameProcessTolerance)
	if o.HitRateTolerance <= 0 {
		o.HitRateTolerance = DefaultHitRateTolerance
	}
	if o.Detached == nil {
		o.Detached = []string{spanname.CBStore}
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
//     an `alternative_to` sibling stands in); a span of the other trace kind is flagged; a
//     span without may_repeat occurs at most once per parent;
//   - each contract span with its service, kind and parent (by name; a remote parent in
//     another service counts), and its required attributes present with the declared types
//     (optional attributes, when present, too);
//   - children inside their parent's interval, within the tolerance (cross-process or
//     same-process), except the end of Detached spans; no span ends before it starts;
//   - on cb.request, hit_rate == (prefix_hit_tokens + non_prefix_hit_tokens) /
//     requested_tokens within the tolerance, and the hits do not exceed the request.
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
	for _, rid := range sortedKeys(byRequest) {
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
}

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
	c.hitRate()
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
		return cmp2(c.t.Spans[b].Duration(), c.t.Spans[a].Duration())
	})
	return roots[0]
}

func cmp2(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
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
	best := 0
	for _, k := range sortedKeys(count) {
		if count[k] > best {
			c.kind, best = k, count[k]
		}
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

func (c *checker) checkSpan(i int) {
	sp := &c.t.Spans[i]
	v := func(rule Rule, format string, args ...any) {
		c.res.add(Violation{Rule: rule, Span: sp.Name, SpanID: sp.SpanID, Service: sp.Service, Message: fmt.Sprintf(format, args...)})
	}
	if sp.End.Before(sp.Start) {
		v(RuleInterval, "ends %s before it starts", sp.Start.Sub(sp.End))
	}
	p := c.parent(i)
	if p >= 0 {
		ps := &c.t.Spans[p]
		tol := c.tolerance(sp, ps)
		if d := ps.Start.Sub(sp.Start); d > tol {
			v(RuleInterval, "starts %s before its parent %s [%s] (tolerance %s)", d, ps.Name, ps.Service, tol)
		}
		if d := sp.End.Sub(ps.End); d > tol && !slices.Contains(c.opts.Detached, sp.Name) {
			v(RuleInterval, "ends %s after its parent %s [%s] (tolerance %s)", d, ps.Name, ps.Service, tol)
		}
	}
	cs := c.match[i]
	if p < 0 && i != c.rootIx {
		msg := "a second root: no parent"
		if sp.ParentSpanID != "" {
			msg = fmt.Sprintf("parent %s is not in the trace (a lost span, or broken propagation)", sp.ParentSpanID)
		}
		if cs != nil && cs.Parent != "" && cs.Trace == c.kind {
			want, _ := c.spec.Lookup(cs.Parent)
			msg += fmt.Sprintf("; want parent %s [%s]", want.Name, want.Service)
		}
		v(RuleParent, "%s", msg)
	}
	if cs == nil {
		return
	}
	if cs.Trace != c.kind && !cs.Caller {
		v(RuleWrongTrace, "belongs to the %s trace, found in a %s trace", cs.Trace, c.kind)
		return
	}
	if sp.Service != cs.Service {
		v(RuleService, "recorded by %s, want %s", sp.Service, cs.Service)
	}
	if sp.Kind != "" && sp.Kind != cs.Kind {
		v(RuleKind, "kind %s, want %s", sp.Kind, cs.Kind)
	}
	if cs.Parent != "" && p >= 0 {
		if want, _ := c.spec.Lookup(cs.Parent); c.match[p] != want {
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
	for _, key := range sortedKeys(cs.OptionalAttributes) {
		want := cs.OptionalAttributes[key]
		if got, ok := sp.Attributes[key]; ok && !typeMatches(got, want) {
			v(RuleAttrType, "attribute %s is %s %q, want %s", key, got.Type, got.String(), want)
		}
	}
}

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
		if cs != nil && (cs.Trace == c.kind || cs.Caller) {
			found[cs] = append(found[cs], i)
		}
	}
	for k := range c.spec.Spans {
		cs := &c.spec.Spans[k]
		if cs.Trace != c.kind && !cs.Caller {
			continue
		}
		if idx := found[cs]; len(idx) > 0 {
			if !cs.MayRepeat {
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
			continue
		}
		if cs.Parent != "" {
			// A child is required only under its parent; a missing parent is reported
			// itself, with its subtree.
			if parent, _ := c.spec.Lookup(cs.Parent); len(found[parent]) == 0 {
				continue
			}
		}
		required, why := c.required(cs, found)
		if !required {
			continue
		}
		for k2 := range c.spec.Spans {
			alt := &c.spec.Spans[k2]
			if alt.AlternativeTo == cs.Name && len(found[alt]) > 0 {
				required = false
			}
		}
		if !required {
			continue
		}
		if c.relax {
			continue
		}
		msg := "required span missing"
		if why != "" {
			msg += " (" + why + ")"
		}
		if len(c.spec.Children(cs.Name)) > 0 {
			msg += ", with its subtree"
		}
		c.res.add(Violation{Rule: RuleMissing, Span: cs.Name, Service: cs.Service, Message: msg})
	}
}

// required tells whether a contract span must be present, and why when conditional.
func (c *checker) required(cs *contract.Span, found map[*contract.Span][]int) (bool, string) {
	if cs.Required {
		return true, ""
	}
	w := cs.When
	if w == nil {
		return false, ""
	}
	on, ok := c.spec.Lookup(w.Span)
	if !ok || len(found[on]) == 0 {
		return false, ""
	}
	v, ok := c.t.Spans[found[on][0]].Attributes[w.Attribute]
	if !ok {
		return false, ""
	}
	n, ok := v.Number()
	if !ok || !w.Holds(n) {
		return false, ""
	}
	return true, fmt.Sprintf("%s.%s = %s %s %g", w.Span, w.Attribute, v.String(), w.Op, w.Value)
}

// hitRate checks hit_rate on cb.request against its parts.
func (c *checker) hitRate() {
	for i := range c.t.Spans {
		sp := &c.t.Spans[i]
		if sp.Name != spanname.CBRequest {
			continue
		}
		hr, ok1 := sp.Attributes["hit_rate"]
		p, ok2 := sp.Attributes["prefix_hit_tokens"]
		np, ok3 := sp.Attributes["non_prefix_hit_tokens"]
		req, ok4 := sp.Attributes["requested_tokens"]
		if !ok1 || !ok2 || !ok3 || !ok4 || p.Type != ValueInt || np.Type != ValueInt || req.Type != ValueInt {
			continue // reported as missing or mistyped attributes
		}
		rate, ok := hr.Number()
		if !ok {
			continue
		}
		v := func(format string, args ...any) {
			c.res.add(Violation{Rule: RuleHitRate, Span: sp.Name, SpanID: sp.SpanID, Service: sp.Service, Message: fmt.Sprintf(format, args...)})
		}
		hits := p.Int + np.Int
		switch {
		case p.Int < 0 || np.Int < 0 || req.Int < 0:
			v("negative token count: prefix %d, non-prefix %d, requested %d", p.Int, np.Int, req.Int)
		case hits > req.Int:
			v("prefix_hit_tokens %d + non_prefix_hit_tokens %d exceed requested_tokens %d", p.Int, np.Int, req.Int)
		case req.Int == 0:
			if rate != 0 {
				v("hit_rate %g with requested_tokens 0, want 0", rate)
			}
		default:
			want := float64(hits) / float64(req.Int)
			if math.IsNaN(rate) || math.Abs(rate-want) > c.opts.HitRateTolerance {
				v("hit_rate %g, but (prefix_hit_tokens %d + non_prefix_hit_tokens %d) / requested_tokens %d = %g",
					rate, p.Int, np.Int, req.Int, want)
			}
		}
	}
}

// requestIDs flags a trace whose cb.* spans carry different request ids.
func (c *checker) requestIDs() {
	ids := map[string]int{}
	for i := range c.t.Spans {
		if v, ok := c.t.Spans[i].Attributes["request_id"]; ok && v.Type == ValueString {
			ids[v.Str]++
		}
	}
	if len(ids) > 1 {
		c.res.add(Violation{Rule: RuleOneTraceID,
			Message: fmt.Sprintf("spans of several requests in one trace: request ids %s", strings.Join(sortedKeys(ids), ", "))})
	}
}

func abbreviate(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + fmt.Sprintf(", … (%d more)", len(items)-n)
}
