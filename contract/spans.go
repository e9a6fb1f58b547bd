package contract

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// SpanKind is the OpenTelemetry kind of a span.
type SpanKind string

// The span kinds used by the contract.
const (
	KindServer   SpanKind = "server"
	KindInternal SpanKind = "internal"
	KindClient   SpanKind = "client"
)

// AttrType is the type of a span attribute value.
type AttrType string

// The attribute types used by the contract.
const (
	AttrString AttrType = "string"
	AttrInt    AttrType = "int"
	AttrDouble AttrType = "double"
	AttrBool   AttrType = "bool"
)

// Phase is the stage of a request a span's time is attributed to by the trace page's
// breakdown (package tracestore), which groups spans by service and phase.
type Phase string

// The phases of the contract, a closed set. [PhaseRequest] is reserved for the root of a
// trace; the breakdown groups the root of whatever trace it shows as PhaseRequest.
const (
	// PhaseRequest is the root: the request as a whole (its time not covered by a child).
	PhaseRequest Phase = "request"
	// PhaseQueue is waiting for the scheduler.
	PhaseQueue Phase = "queue"
	// PhasePrefill is the engine's prefill through the first token.
	PhasePrefill Phase = "prefill"
	// PhaseDecode is the engine's decode steps after the first token.
	PhaseDecode Phase = "decode"
	// PhaseSchedule is the CacheBlend request and its scheduling.
	PhaseSchedule Phase = "schedule"
	// PhaseLookup is the KV reuse lookup, engine RPC and blend server legs.
	PhaseLookup Phase = "lookup"
	// PhaseL2Load is reading chunks from the blend server's L2 store.
	PhaseL2Load Phase = "l2 load"
	// PhaseExecute is a worker step.
	PhaseExecute Phase = "execute"
	// PhaseKVLoad is loading the reused KV into the worker's slots.
	PhaseKVLoad Phase = "kv load"
	// PhaseForward is the model forward (full recompute, check, partial recompute).
	PhaseForward Phase = "forward"
	// PhaseStore is storing KV chunks.
	PhaseStore Phase = "store"
	// PhaseRoute is a gateway forwarding the request to an engine (its CLIENT span's time not
	// covered by the engine).
	PhaseRoute Phase = "route"
)

// Phases returns every phase of the contract, in the order of a request. Each call returns a
// new slice.
func Phases() []Phase {
	return []Phase{PhaseRequest, PhaseQueue, PhasePrefill, PhaseDecode, PhaseSchedule, PhaseLookup,
		PhaseL2Load, PhaseExecute, PhaseKVLoad, PhaseForward, PhaseStore, PhaseRoute}
}

// Traces of the contract.
const (
	// TraceRequest is the trace of one inference request (the default).
	TraceRequest = "request"
	// TraceIngest is the trace of one document ingest.
	TraceIngest = "ingest"
	// TraceQuality is the trace of one online quality check (cb.quality).
	TraceQuality = "quality"
)

// Condition makes an optional span required: the span must be present exactly when the
// attribute Attribute of span Span (same trace) compares to Value with Op. A numeric Value
// compares with an int or double attribute (any Op); a text Value with a string attribute
// (eq or ne only).
type Condition struct {
	// Span is the name of the span carrying the attribute.
	Span string `yaml:"span"`
	// Attribute is an int, double or string attribute of that span.
	Attribute string `yaml:"attribute"`
	// Op is gt, ge, lt, le, eq or ne.
	Op string `yaml:"op"`
	// Value is the right-hand side: a number, or a string for eq and ne.
	Value CondValue `yaml:"value"`
}

// CondValue is the right-hand side of a [Condition]: a number, or a text when IsText.
type CondValue struct {
	// Number is the value of a numeric right-hand side.
	Number float64
	// Text is the value of a text right-hand side.
	Text string
	// IsText is true when the value is a text (a YAML string, e.g. `value: done`).
	IsText bool
}

// Num returns a numeric condition value.
func Num(f float64) CondValue { return CondValue{Number: f} }

// Text returns a text condition value.
func Text(s string) CondValue { return CondValue{Text: s, IsText: true} }

// String renders the value as the contract writes it: a number, or a quoted text.
func (v CondValue) String() string {
	if v.IsText {
		return strconv.Quote(v.Text)
	}
	return strconv.FormatFloat(v.Number, 'g', -1, 64)
}

// UnmarshalYAML reads a scalar: an int or float is a number, a string a text; anything
// else (a bool, a null, a list, a map) is an error.
func (v *CondValue) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: when.value must be a number or a string", n.Line)
	}
	switch n.ShortTag() {
	case "!!int", "!!float":
		f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
		if err != nil {
			return fmt.Errorf("line %d: when.value %q: %v", n.Line, n.Value, err)
		}
		*v = Num(f)
	case "!!str":
		*v = Text(n.Value)
	default:
		return fmt.Errorf("line %d: when.value %q is %s, not a number or a string", n.Line, n.Value, n.ShortTag())
	}
	return nil
}

// Holds reports whether the number v satisfies the condition (false for a text Value or an
// unknown Op).
func (c *Condition) Holds(v float64) bool {
	if c.Value.IsText {
		return false
	}
	w := c.Value.Number
	switch c.Op {
	case "gt":
		return v > w
	case "ge":
		return v >= w
	case "lt":
		return v < w
	case "le":
		return v <= w
	case "eq":
		return v == w
	case "ne":
		return v != w
	}
	return false
}

// HoldsText reports whether the text s satisfies the condition (false for a numeric Value or
// an Op other than eq and ne).
func (c *Condition) HoldsText(s string) bool {
	if !c.Value.IsText {
		return false
	}
	switch c.Op {
	case "eq":
		return s == c.Value.Text
	case "ne":
		return s != c.Value.Text
	}
	return false
}

// Span is one span of the contract.
type Span struct {
	// Name is the span name, or a readable template when NamePattern is set.
	Name string `yaml:"name"`
	// NamePattern is an RE2 regexp matched against recorded names; empty means the exact Name.
	NamePattern string `yaml:"name_pattern"`
	// Trace is the trace the span belongs to; "" in the file means TraceRequest.
	Trace string `yaml:"trace"`
	// Service is the owning process (service.name).
	Service string `yaml:"service"`
	// Kind is the span kind.
	Kind SpanKind `yaml:"kind"`
	// Phase is the stage of the request the span's time is attributed to on the trace page.
	Phase Phase `yaml:"phase"`
	// Parent is the parent span's Name; empty for the root of a trace.
	Parent string `yaml:"parent"`
	// OtherParents are the span's parents in other traces: work that serves
	// several kinds of trace (the worker's cb.execute serves a request under
	// cb.request and a document ingest under cb.store_pre_computed). The span
	// and its subtree belong to the trace of each (see [Span.InTrace]); each
	// names a span of another trace than Parent's, with the same locality
	// (RemoteParent).
	OtherParents []string `yaml:"other_parents"`
	// RemoteParent is true when the parent lives in another process.
	RemoteParent bool `yaml:"remote_parent"`
	// Required is true when every successful sampled request has the span.
	Required bool `yaml:"required"`
	// When, for an optional span, is the condition under which it is required.
	When *Condition `yaml:"when"`
	// AlternativeTo names a sibling span this span replaces.
	AlternativeTo string `yaml:"alternative_to"`
	// MayRepeat is true when the span may occur more than once under one parent.
	MayRepeat bool `yaml:"may_repeat"`
	// Async is true for asynchronous follow-up work its parent does not wait for: the only
	// spans that may end after their parent. Every other child lies inside its parent's
	// interval (package tracecheck).
	Async bool `yaml:"async"`
	// Attributes are the required attributes and their types.
	Attributes map[string]AttrType `yaml:"attributes"`
	// OptionalAttributes may be present, with these types.
	OptionalAttributes map[string]AttrType `yaml:"optional_attributes"`
	// Events lists the event names the span may carry.
	Events []string `yaml:"events"`
	// Note is free documentation.
	Note string `yaml:"note"`
	// Caller marks a span of an optional caller above the roots of the traces (the gateway):
	// when a trace has it, it sits above the contract's root, which is then a remote child of
	// a caller span whose Calls names it. A caller span's Parent is another caller span, or
	// empty for the caller's own root; caller spans count for no trace's root.
	Caller bool `yaml:"caller"`
	// Calls, on a caller span, names the roots of traces (non-caller spans without a parent)
	// that may be its remote children.
	Calls []string `yaml:"calls"`

	re     *regexp.Regexp
	traces []string // every trace the span belongs to (Trace first), set by ParseSpans
}

// InTrace reports whether the span belongs to the trace named trace: its own
// Trace, or, through OtherParents (its own or an ancestor's), another one.
func (s *Span) InTrace(trace string) bool {
	if s.traces == nil {
		return s.Trace == trace
	}
	return slices.Contains(s.traces, trace)
}

// TraceNames returns every trace the span belongs to, Trace first. Each call
// returns a new slice.
func (s *Span) TraceNames() []string {
	if s.traces == nil {
		return []string{s.Trace}
	}
	return slices.Clone(s.traces)
}

// Matches reports whether a recorded span name is this span.
func (s *Span) Matches(recorded string) bool {
	if s.re != nil {
		return s.re.MatchString(recorded)
	}
	return recorded == s.Name
}

// AttributeKeys returns the required attribute keys, sorted.
func (s *Span) AttributeKeys() []string { return sortedKeys(s.Attributes) }

// AttributeType returns the declared type of a required or optional attribute.
func (s *Span) AttributeType(key string) (AttrType, bool) {
	if t, ok := s.Attributes[key]; ok {
		return t, true
	}
	t, ok := s.OptionalAttributes[key]
	return t, ok
}

func sortedKeys(m map[string]AttrType) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// SpanSet is a validated spans.yaml.
type SpanSet struct {
	// Version is the contract format version.
	Version int `yaml:"version"`
	// Services are the service names that own spans.
	Services []string `yaml:"services"`
	// Spans in file order.
	Spans []Span `yaml:"spans"`

	index map[string]int
}

// Lookup returns the span whose Name is name. The result points into the set; read-only.
func (s *SpanSet) Lookup(name string) (*Span, bool) {
	i, ok := s.index[name]
	if !ok {
		return nil, false
	}
	return &s.Spans[i], true
}

// Match returns the contract span a recorded span name corresponds to: an exact Name first,
// then the first NamePattern that matches.
func (s *SpanSet) Match(recorded string) (*Span, bool) {
	if sp, ok := s.Lookup(recorded); ok && sp.re == nil {
		return sp, true
	}
	for i := range s.Spans {
		if s.Spans[i].re != nil && s.Spans[i].re.MatchString(recorded) {
			return &s.Spans[i], true
		}
	}
	return nil, false
}

// Root returns the root span of the named trace (TraceRequest or TraceIngest); a caller span
// (Span.Caller) is never a root.
func (s *SpanSet) Root(trace string) (*Span, bool) {
	for i := range s.Spans {
		if s.Spans[i].Trace == trace && s.Spans[i].Parent == "" && !s.Spans[i].Caller {
			return &s.Spans[i], true
		}
	}
	return nil, false
}

// Children returns the spans whose parent (Parent, or one of OtherParents) is
// the span named name, in file order.
func (s *SpanSet) Children(name string) []*Span {
	var out []*Span
	for i := range s.Spans {
		if s.Spans[i].Parent == name || slices.Contains(s.Spans[i].OtherParents, name) {
			out = append(out, &s.Spans[i])
		}
	}
	return out
}

// ParentIn returns the name of sp's parent in the trace named trace: the one of
// sp.OtherParents that belongs to it, else sp.Parent ("" for a root). In a
// trace sp reaches through an ancestor's OtherParents, its parent is Parent.
func (s *SpanSet) ParentIn(sp *Span, trace string) string {
	if sp.Trace == trace {
		return sp.Parent
	}
	for _, name := range sp.OtherParents {
		if op, ok := s.Lookup(name); ok && op.InTrace(trace) {
			return name
		}
	}
	return sp.Parent
}

// Traces returns the trace names of the set, sorted.
func (s *SpanSet) Traces() []string {
	var out []string
	for i := range s.Spans {
		if !slices.Contains(out, s.Spans[i].Trace) {
			out = append(out, s.Spans[i].Trace)
		}
	}
	sort.Strings(out)
	return out
}

// Spans parses and validates the embedded spans.yaml. Each call returns a new set.
func Spans() (*SpanSet, error) { return ParseSpans(spansYAML) }

var (
	spanNameRE = regexp.MustCompile(`^[a-z][a-z0-9_.]*$`)
	attrKeyRE  = regexp.MustCompile(`^[a-z][a-z0-9_.]*$`)
	traceRE    = regexp.MustCompile(`^[a-z][a-z_]*$`)
	serviceRE  = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	conditOps  = []string{"gt", "ge", "lt", "le", "eq", "ne"}
)

// ParseSpans parses and validates a spans file. Errors wrap [ErrInvalid] and list every
// violation: unknown fields, duplicate names, unknown services or kinds, parents that do not
// exist or belong to another trace, cycles, not exactly one root per trace, remote_parent not
// matching a change of service, a missing or unknown phase (or phase request off a root), bad
// attribute keys or types, a cb.* span without request_id, an async root, conditions that
// reference nothing or compare a string with a number (or a string with an order), alternatives
// that reference nothing, patterns that do not compile, caller spans whose parent is no caller
// or whose calls name no root in another service, other_parents that do not exist, are
// callers, share a trace with the span's parent or each other, or differ in locality.
func ParseSpans(data []byte) (*SpanSet, error) {
	var set SpanSet
	if err := decodeStrict(SpansFile, data, &set); err != nil {
		return nil, err
	}
	p := &problems{file: SpansFile}
	if set.Version != 1 {
		p.addf("version %d unsupported (want 1)", set.Version)
	}
	if len(set.Services) == 0 {
		p.addf("no services")
	}
	for i, svc := range set.Services {
		if !serviceRE.MatchString(svc) || slices.Contains(set.Services[:i], svc) {
			p.addf("service %q invalid or listed twice", svc)
		}
	}
	if len(set.Spans) == 0 {
		p.addf("no spans")
	}
	set.index = make(map[string]int, len(set.Spans))
	for i := range set.Spans {
		sp := &set.Spans[i]
		if sp.Trace == "" {
			sp.Trace = TraceRequest
		}
		validateSpan(p, &set, sp)
		if sp.Name == "" {
			continue
		}
		if _, dup := set.index[sp.Name]; dup {
			p.addf("%s: duplicate span name", sp.Name)
			continue
		}
		set.index[sp.Name] = i
	}
	validateTree(p, &set)
	if err := p.err(); err != nil {
		return nil, err
	}
	for i := range set.Spans {
		set.Spans[i].traces = set.traceClosure(&set.Spans[i], 0)
	}
	return &set, nil
}

// traceClosure is every trace sp belongs to: its own, its parent's, and those
// of its other parents (the set is validated: no cycle, every parent exists).
func (s *SpanSet) traceClosure(sp *Span, depth int) []string {
	out := []string{sp.Trace}
	if depth > len(s.Spans) {
		return out
	}
	parents := sp.OtherParents
	if sp.Parent != "" {
		parents = append([]string{sp.Parent}, parents...)
	}
	for _, name := range parents {
		if p, ok := s.Lookup(name); ok {
			for _, tr := range s.traceClosure(p, depth+1) {
				if !slices.Contains(out, tr) {
					out = append(out, tr)
				}
			}
		}
	}
	return out
}

func validateSpan(p *problems, set *SpanSet, sp *Span) {
	name := sp.Name
	if name == "" {
		p.addf("span with empty name")
		name = "<unnamed>"
	}
	if sp.NamePattern != "" {
		re, err := regexp.Compile(sp.NamePattern)
		if err != nil {
			p.addf("%s: name_pattern: %v", name, err)
		} else {
			sp.re = re
		}
	} else if sp.Name != "" && !spanNameRE.MatchString(sp.Name) {
		p.addf("%s: name must match [a-z][a-z0-9_.]* (or give a name_pattern)", name)
	}
	if !traceRE.MatchString(sp.Trace) {
		p.addf("%s: trace %q invalid", name, sp.Trace)
	}
	if !slices.Contains(set.Services, sp.Service) {
		p.addf("%s: service %q is not one of %v", name, sp.Service, set.Services)
	}
	switch sp.Kind {
	case KindServer, KindInternal, KindClient:
	default:
		p.addf("%s: kind %q is not server, internal or client", name, sp.Kind)
	}
	switch {
	case sp.Phase == "":
		p.addf("%s: no phase", name)
	case !slices.Contains(Phases(), sp.Phase):
		p.addf("%s: phase %q is not one of %q", name, sp.Phase, Phases())
	case sp.Phase == PhaseRequest && sp.Parent != "":
		p.addf("%s: phase %q is reserved for the root of a trace", name, sp.Phase)
	}
	for key, t := range sp.Attributes {
		validateAttr(p, name, key, t)
		if _, both := sp.OptionalAttributes[key]; both {
			p.addf("%s: attribute %q is both required and optional", name, key)
		}
	}
	for key, t := range sp.OptionalAttributes {
		validateAttr(p, name, key, t)
	}
	if strings.HasPrefix(sp.Name, "cb.") && sp.Attributes["request_id"] != AttrString {
		p.addf("%s: every cb.* span requires request_id (string)", name)
	}
	if sp.Required && (sp.When != nil || sp.AlternativeTo != "") {
		p.addf("%s: a required span takes no when or alternative_to", name)
	}
	if sp.Async && sp.Parent == "" {
		p.addf("%s: async needs a parent (a root outlives nothing)", name)
	}
	for i, ev := range sp.Events {
		if ev == "" || slices.Contains(sp.Events[:i], ev) {
			p.addf("%s: event %q empty or listed twice", name, ev)
		}
	}
}

func validateAttr(p *problems, span, key string, t AttrType) {
	if !attrKeyRE.MatchString(key) {
		p.addf("%s: attribute key %q must match [a-z][a-z0-9_.]*", span, key)
	}
	switch t {
	case AttrString, AttrInt, AttrDouble, AttrBool:
	default:
		p.addf("%s: attribute %q has type %q, not string, int, double or bool", span, key, t)
	}
}

func validateTree(p *problems, set *SpanSet) {
	roots := map[string][]string{}
	for i := range set.Spans {
		sp := &set.Spans[i]
		if sp.Name == "" {
			continue
		}
		if sp.Caller || len(sp.Calls) > 0 {
			validateCaller(p, set, sp)
		}
		if sp.Parent == "" {
			if !sp.Caller {
				roots[sp.Trace] = append(roots[sp.Trace], sp.Name)
			}
			if sp.RemoteParent {
				p.addf("%s: a root has no remote parent", sp.Name)
			}
		} else if parent, ok := set.Lookup(sp.Parent); !ok {
			p.addf("%s: parent %q does not exist", sp.Name, sp.Parent)
		} else if parent.Caller != sp.Caller {
			p.addf("%s: parent %q is a caller span and %s is not, or the other way round (a trace's root is a remote child of a caller through calls)", sp.Name, sp.Parent, sp.Name)
		} else {
			if parent.Trace != sp.Trace {
				p.addf("%s: parent %q belongs to trace %q, not %q", sp.Name, sp.Parent, parent.Trace, sp.Trace)
			}
			if remote := parent.Service != sp.Service; remote != sp.RemoteParent {
				p.addf("%s: remote_parent is %v but parent %q is in %s and the span in %s",
					sp.Name, sp.RemoteParent, sp.Parent, parent.Service, sp.Service)
			}
		}
		validateOtherParents(p, set, sp)
		if c := sp.When; c != nil {
			validateCondition(p, set, sp, c)
		}
		if alt := sp.AlternativeTo; alt != "" {
			other, ok := set.Lookup(alt)
			switch {
			case !ok:
				p.addf("%s: alternative_to %q does not exist", sp.Name, alt)
			case other.Parent != sp.Parent || other.Trace != sp.Trace:
				p.addf("%s: alternative_to %q is not a sibling", sp.Name, alt)
			case other.AlternativeTo != "" || alt == sp.Name:
				p.addf("%s: alternative_to %q must name a span that is no alternative itself", sp.Name, alt)
			}
		}
		if sp.re != nil {
			for j := range set.Spans {
				o := &set.Spans[j]
				if o != sp && o.re == nil && sp.re.MatchString(o.Name) {
					p.addf("%s: name_pattern also matches span %q", sp.Name, o.Name)
				}
			}
		}
	}
	for trace, rs := range roots {
		if len(rs) != 1 {
			p.addf("trace %q has %d roots %v; want exactly one", trace, len(rs), rs)
		}
	}
	if _, ok := roots[TraceRequest]; !ok {
		p.addf("no root for trace %q", TraceRequest)
	}
	// Every parent chain must end at a root within len(spans) steps; otherwise there is a cycle.
	for i := range set.Spans {
		sp := &set.Spans[i]
		cur := sp
		for steps := 0; cur != nil && cur.Parent != ""; steps++ {
			if steps > len(set.Spans) {
				p.addf("%s: parent chain has a cycle", sp.Name)
				break
			}
			next, ok := set.Lookup(cur.Parent)
			if !ok {
				break
			}
			cur = next
		}
	}
}

// validateOtherParents checks a span's OtherParents: spans of the contract
// that are no callers, each of another trace than the span's own and than
// each other, with the locality remote_parent declares.
func validateOtherParents(p *problems, set *SpanSet, sp *Span) {
	if len(sp.OtherParents) > 0 && (sp.Parent == "" || sp.Caller) {
		p.addf("%s: other_parents on a root or a caller span", sp.Name)
		return
	}
	seen := []string{sp.Trace}
	for _, name := range sp.OtherParents {
		op, ok := set.Lookup(name)
		switch {
		case !ok:
			p.addf("%s: other parent %q does not exist", sp.Name, name)
		case op.Caller:
			p.addf("%s: other parent %q is a caller span", sp.Name, name)
		case slices.Contains(seen, op.Trace):
			p.addf("%s: other parent %q belongs to trace %q, which the span already has a parent in", sp.Name, name, op.Trace)
		default:
			seen = append(seen, op.Trace)
			if remote := op.Service != sp.Service; remote != sp.RemoteParent {
				p.addf("%s: remote_parent is %v but other parent %q is in %s and the span in %s",
					sp.Name, sp.RemoteParent, name, op.Service, sp.Service)
			}
		}
	}
}

// validateCaller checks a caller span (Span.Caller) and its calls.
func validateCaller(p *problems, set *SpanSet, sp *Span) {
	if !sp.Caller {
		p.addf("%s: calls on a span that is not a caller", sp.Name)
		return
	}
	if sp.When != nil || sp.AlternativeTo != "" {
		p.addf("%s: a caller span takes no when or alternative_to", sp.Name)
	}
	for i, name := range sp.Calls {
		callee, ok := set.Lookup(name)
		switch {
		case !ok:
			p.addf("%s: calls %q, which does not exist", sp.Name, name)
		case callee.Caller || callee.Parent != "":
			p.addf("%s: calls %q, which is not the root of a trace", sp.Name, name)
		case callee.Service == sp.Service:
			p.addf("%s: calls %q in its own service %s (a call crosses processes)", sp.Name, name, sp.Service)
		case slices.Contains(sp.Calls[:i], name):
			p.addf("%s: calls %q twice", sp.Name, name)
		}
	}
}

func validateCondition(p *problems, set *SpanSet, sp *Span, c *Condition) {
	if sp.Required {
		return // reported by validateSpan
	}
	if !slices.Contains(conditOps, c.Op) {
		p.addf("%s: when.op %q is not one of %v", sp.Name, c.Op, conditOps)
	}
	other, ok := set.Lookup(c.Span)
	if !ok {
		p.addf("%s: when.span %q does not exist", sp.Name, c.Span)
		return
	}
	if other.Trace != sp.Trace {
		p.addf("%s: when.span %q is in another trace", sp.Name, c.Span)
	}
	t, ok := other.AttributeType(c.Attribute)
	switch {
	case !ok:
		p.addf("%s: when.attribute %q is not an attribute of %s", sp.Name, c.Attribute, c.Span)
	case c.Value.IsText && t != AttrString:
		p.addf("%s: when.value %s is a string but when.attribute %q of %s is %s", sp.Name, c.Value, c.Attribute, c.Span, t)
	case c.Value.IsText && c.Op != "eq" && c.Op != "ne":
		p.addf("%s: when.op %q does not compare strings (eq or ne)", sp.Name, c.Op)
	case !c.Value.IsText && t != AttrInt && t != AttrDouble:
		p.addf("%s: when.attribute %q of %s is %s, not numeric", sp.Name, c.Attribute, c.Span, t)
	}
}
