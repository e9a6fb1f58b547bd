package events

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/telemetry"
)

// RootSpanName is the name of the option-B root span the tracing subscriber
// opens when a peer sent no trace context.
const RootSpanName = spanname.CBRequest

// DefaultSpanTTL is how long a span may stay open waiting for its END before
// the sweep ends it with status Error "end event lost".
const DefaultSpanTTL = 60 * time.Second

// ScopeName is the instrumentation scope of the tracer the tracing
// subscriber takes from its TracerProvider.
const ScopeName = "github.com/cacheblend/cacheblend/blend/events"

// LostEndDescription is the status description of a span ended by the sweep
// because its END event never came.
const LostEndDescription = "end event lost"

// ErrInvalidSpanDefs is wrapped by the error of [NewTracingSubscriber] for a
// span table that is not well formed.
var ErrInvalidSpanDefs = errors.New("invalid span definitions")

// SpanDef is one row of the tracing subscriber's span table: the span Name
// opened by a Start event and closed by the End event of the same request
// (and CopyID).
type SpanDef struct {
	// Name is the span name, unique in the table.
	Name string
	// Start and End are the event types that open and close the span.
	Start, End EventType
	// Parent is the Name of the definition whose open span (of the same
	// request, the most recently started one if several) is the parent.
	// Empty for a top-level span, whose parent comes from the START event's
	// trace context (see TraceContext). A START whose parent is not open is
	// not traced (counted as orphaned), nor are its children.
	Parent string
	// Kind is the span kind (internal when zero).
	Kind trace.SpanKind
	// StartAttrs and EndAttrs are the attributes copied from the START and
	// END events onto the span; nil copies all of them. request_id is always
	// set.
	StartAttrs, EndAttrs []attribute.Key
	// StampParent are END attributes also set on the parent span (e.g.
	// prefix_chunks of the prefix leg on cb.lookup).
	StampParent []attribute.Key
	// StampRoot are END attributes also set on the request's option-B
	// cb.request root, when there is one (the hit statistics).
	StampRoot []attribute.Key
	// DurationMsAttr, when set, is an attribute the span gets at END with its
	// duration in milliseconds (END time − START time), unless the END event
	// carries it already.
	DurationMsAttr attribute.Key
	// TraceContext makes a top-level span the remote child of the W3C
	// traceparent in the START event's TraceContext (with the tracestate of
	// its TraceState, which the span and its children carry), when that is
	// valid. A
	// valid but sampled-out context records nothing for the request. Without
	// a valid context the span is the root of a new trace, unless
	// RootFallback is set.
	TraceContext bool
	// RootFallback (option B): without a valid trace context, the span is a
	// child of the request's cb.request root, which is opened with the trace
	// id telemetry.TraceIDFromRequestID if it is not open yet.
	RootFallback bool
	// Async marks the span of an asynchronous copy: the request's option-B
	// root stays open while such a span is open.
	Async bool
	// GatesRoot marks the span whose end lets the option-B root close (the
	// retrieve): the root closes once one such span has ended, none is open
	// and no Async span is open.
	GatesRoot bool
}

// DefaultSpanDefs returns the span table of docs/design.md §6, in parent-first
// order: cb.lookup ⊃ {mp.lookup_prefetch, cb.fingerprint_match,
// cb.coordinator_match, cb.sparse_prefetch ⊃ cb.l2_load, cb.classify};
// cb.retrieve ⊃ cb.scatter; cb.store. The events and attributes of each span
// are written here; its kind and parent come from contract/spans.yaml: a
// span whose contract parent is in this process gets it as Parent, one
// with a remote parent is top level and takes its parent from the START
// event's trace context. An error (wrapping [ErrInvalidSpanDefs]) means the
// embedded contract lacks one of the spans. Each call returns a fresh slice.
func DefaultSpanDefs() ([]SpanDef, error) {
	lookupStats := []attribute.Key{
		AttrRequestedTokens, AttrPrefixHitTokens, AttrNonPrefixHitTokens, AttrHitTokens,
		AttrHitRate, AttrPrefixCoverageTokens, AttrNNonPrefixTokens, AttrFingerprintHits,
		AttrStorageHits, AttrStaleChunks,
	}
	defs := []SpanDef{
		{
			Name: spanname.CBLookup, Start: LookupStart, End: LookupEnd,
			EndAttrs:     append(append([]attribute.Key(nil), lookupStats...), AttrPrefixChunks, "pending_wait_ms", "unarrived_stores"),
			StampRoot:    append(append([]attribute.Key(nil), lookupStats...), AttrLookup),
			RootFallback: true,
		},
		{
			Name: spanname.MPLookupPrefetch, Start: PrefixLookupStart, End: PrefixLookupEnd,
			EndAttrs: []attribute.Key{AttrPrefixChunks}, StampParent: []attribute.Key{AttrPrefixChunks},
		},
		{
			Name: spanname.CBFingerprintMatch, Start: FingerprintMatchStart, End: FingerprintMatchEnd,
			EndAttrs: []attribute.Key{AttrNProbes, AttrTableHits, AttrMatches},
		},
		{
			Name: spanname.CBCoordinatorMatch, Start: CoordinatorMatchStart, End: CoordinatorMatchEnd,
			EndAttrs: []attribute.Key{AttrMatches, AttrTimedOut, AttrNProbes, AttrTableHits, "round_trips", "directory_hits"},
		},
		{
			Name: spanname.CBSparsePrefetch, Start: SparsePrefetchStart, End: SparsePrefetchEnd,
			EndAttrs: []attribute.Key{AttrNKeys, AttrL1Hits, AttrL2Misses},
		},
		{
			Name: spanname.CBL2Load, Start: L2LoadTaskStart, End: L2LoadTaskEnd,
			EndAttrs: []attribute.Key{AttrChunks, AttrBytes, AttrMs, "tier", "misses", "corrupt"}, DurationMsAttr: AttrMs,
		},
		{
			Name: spanname.CBClassify, Start: ClassifyStart, End: ClassifyEnd,
			EndAttrs: []attribute.Key{AttrFound, AttrStale, AttrPerRankOK, "pending"},
		},
		{Name: spanname.CBRetrieve, Start: RetrieveStart, End: RetrieveEnd, RootFallback: true, GatesRoot: true},
		{
			Name: spanname.CBScatter, Start: ScatterStart, End: ScatterEnd, Async: true,
			EndAttrs:       []attribute.Key{AttrScatteredTokens, AttrSlotWrites, AttrPartialBlocks, AttrNPrefixTokens, AttrNShiftedTokens, AttrDropped, AttrScatterMs},
			DurationMsAttr: AttrScatterMs,
		},
		{Name: spanname.CBStore, Start: StoreStart, End: StoreEnd},
	}
	return defs, fromContract(defs)
}

// fromContract sets the kind and the parent (or trace context) of every
// definition from contract/spans.yaml.
func fromContract(defs []SpanDef) error {
	set, err := contract.Spans()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSpanDefs, err)
	}
	kinds := map[contract.SpanKind]trace.SpanKind{
		contract.KindServer: trace.SpanKindServer, contract.KindInternal: trace.SpanKindInternal, contract.KindClient: trace.SpanKindClient,
	}
	for i := range defs {
		d := &defs[i]
		sp, ok := set.Lookup(d.Name)
		if !ok || sp.Service != Service {
			return fmt.Errorf("%w: %s is not a %s span of the contract", ErrInvalidSpanDefs, d.Name, Service)
		}
		d.Kind = kinds[sp.Kind]
		if sp.RemoteParent || sp.Parent == "" {
			d.TraceContext = true
		} else {
			d.Parent = sp.Parent
		}
	}
	return nil
}

// Service is the contract's service name of the blend server's spans.
const Service = "cb-blend"

// TracingOption configures [NewTracingSubscriber].
type TracingOption func(*tracingOptions)

type tracingOptions struct {
	ttl     time.Duration
	defs    []SpanDef
	defsSet bool
}

// WithSpanTTL sets how long a span may wait for its END before the sweep
// ends it (default [DefaultSpanTTL]; zero or negative keeps the default).
// An option-B root with nothing open and no event for this long is closed
// too.
func WithSpanTTL(d time.Duration) TracingOption {
	return func(o *tracingOptions) {
		if d > 0 {
			o.ttl = d
		}
	}
}

// WithSpanDefs replaces the span table (default [DefaultSpanDefs]).
func WithSpanDefs(defs []SpanDef) TracingOption {
	return func(o *tracingOptions) {
		o.defs = append([]SpanDef(nil), defs...)
		o.defsSet = true
	}
}

// TracingStats are the tracing subscriber's counters.
type TracingStats struct {
	// Open is the number of spans waiting for their END (including those of
	// sampled-out requests, which record nothing).
	Open int64
	// Roots counts the option-B cb.request roots opened.
	Roots uint64
	// Lost counts spans ended without their END: by the TTL sweep, or
	// because a START of the same span (request, name, copy) arrived while
	// it was still open.
	Lost uint64
	// Unpaired counts END events without an open START; they are ignored.
	Unpaired uint64
	// Orphaned counts START events whose parent span was not open; they are
	// not traced.
	Orphaned uint64
	// Invalid counts events without a request id; they are ignored.
	Invalid uint64
}

// TracingSubscriber is the [Subscriber] that turns paired events into
// OpenTelemetry spans (see the package documentation and [SpanDef]). Spans
// start at their START event's Time and end at their END event's Time.
//
// HandleEvent must be called from one goroutine at a time (the bus's drain
// goroutine); Stats is safe for concurrent use.
type TracingSubscriber struct {
	tracer  trace.Tracer
	ttl     time.Duration
	defs    []compiledDef
	byStart [numEventTypes]int16 // def index + 1
	byEnd   [numEventTypes]int16
	reqs    map[string]*reqState

	open                                     atomic.Int64
	roots, lost, unpaired, orphaned, invalid atomic.Uint64
}

type compiledDef struct {
	SpanDef
	parent int // index of the parent def, -1 for top level
}

type openSpan struct {
	def    int
	copyID uint64
	span   trace.Span      // nil when not traced (sampled out or orphaned)
	ctx    context.Context // carries span; nil when span is nil
	start  time.Time
	parent *openSpan
}

type reqState struct {
	open       []*openSpan
	root       trace.Span // the open option-B root, or nil
	rootCtx    context.Context
	rootSC     trace.SpanContext // the last option-B root, kept after it closed
	rootErr    string
	pending    int  // open Async spans
	gateEnded  bool // a GatesRoot span has ended
	sampledOut bool // a START carried a valid, sampled-out context
	lost       bool
	last       time.Time // latest event time seen
}

// NewTracingSubscriber returns a tracing subscriber that creates spans with
// a tracer of tp (scope [ScopeName]). For option-B roots to carry the trace
// id derived from the request id, tp must use an id generator that honours
// telemetry.ContextWithTraceID, such as provider.NewIDGenerator (package
// telemetry/provider). A malformed span table is an error wrapping
// [ErrInvalidSpanDefs].
func NewTracingSubscriber(tp trace.TracerProvider, opts ...TracingOption) (*TracingSubscriber, error) {
	if tp == nil {
		return nil, errors.New("new tracing subscriber: nil TracerProvider")
	}
	o := tracingOptions{ttl: DefaultSpanTTL}
	for _, opt := range opts {
		opt(&o)
	}
	if !o.defsSet {
		var err error
		if o.defs, err = DefaultSpanDefs(); err != nil {
			return nil, fmt.Errorf("new tracing subscriber: %w", err)
		}
	}
	s := &TracingSubscriber{
		tracer: tp.Tracer(ScopeName),
		ttl:    o.ttl,
		reqs:   make(map[string]*reqState),
	}
	if err := s.compile(o.defs); err != nil {
		return nil, fmt.Errorf("new tracing subscriber: %w", err)
	}
	return s, nil
}

func (s *TracingSubscriber) compile(defs []SpanDef) error {
	if len(defs) == 0 {
		return fmt.Errorf("%w: empty table", ErrInvalidSpanDefs)
	}
	index := make(map[string]int, len(defs))
	for i, d := range defs {
		switch {
		case d.Name == "":
			return fmt.Errorf("%w: definition %d has no name", ErrInvalidSpanDefs, i)
		case d.Name == RootSpanName:
			return fmt.Errorf("%w: %q is reserved for the option-B root", ErrInvalidSpanDefs, d.Name)
		case !d.Start.IsStart():
			return fmt.Errorf("%w: %s: start type %v is not a START type", ErrInvalidSpanDefs, d.Name, d.Start)
		case !d.End.IsEnd():
			return fmt.Errorf("%w: %s: end type %v is not an END type", ErrInvalidSpanDefs, d.Name, d.End)
		case s.byStart[d.Start] != 0:
			return fmt.Errorf("%w: %s: start type %v used twice", ErrInvalidSpanDefs, d.Name, d.Start)
		case s.byEnd[d.End] != 0:
			return fmt.Errorf("%w: %s: end type %v used twice", ErrInvalidSpanDefs, d.Name, d.End)
		case d.TraceContext && d.Parent != "":
			return fmt.Errorf("%w: %s: a span with a trace context has no parent definition", ErrInvalidSpanDefs, d.Name)
		case d.RootFallback && !d.TraceContext:
			return fmt.Errorf("%w: %s: RootFallback needs TraceContext", ErrInvalidSpanDefs, d.Name)
		}
		if _, dup := index[d.Name]; dup {
			return fmt.Errorf("%w: name %q used twice", ErrInvalidSpanDefs, d.Name)
		}
		parent := -1
		if d.Parent != "" {
			p, ok := index[d.Parent]
			if !ok {
				return fmt.Errorf("%w: %s: parent %q is not defined before it", ErrInvalidSpanDefs, d.Name, d.Parent)
			}
			parent = p
		}
		index[d.Name] = i
		s.byStart[d.Start] = int16(i + 1)
		s.byEnd[d.End] = int16(i + 1)
		s.defs = append(s.defs, compiledDef{SpanDef: d, parent: parent})
	}
	return nil
}

// EventTypes returns the event types the subscriber handles: the START and
// END types of its table and [Tick]. Register it with
// bus.Subscribe(s, s.EventTypes()...).
func (s *TracingSubscriber) EventTypes() []EventType {
	types := make([]EventType, 0, 2*len(s.defs)+1)
	for _, d := range s.defs {
		types = append(types, d.Start, d.End)
	}
	return append(types, Tick)
}

// Stats returns the subscriber's counters. It is safe for concurrent use.
func (s *TracingSubscriber) Stats() TracingStats {
	return TracingStats{
		Open:     s.open.Load(),
		Roots:    s.roots.Load(),
		Lost:     s.lost.Load(),
		Unpaired: s.unpaired.Load(),
		Orphaned: s.orphaned.Load(),
		Invalid:  s.invalid.Load(),
	}
}

// HandleEvent implements [Subscriber]. Events of types outside the table are
// ignored; a [Tick] runs the TTL sweep with the tick's Time as "now".
func (s *TracingSubscriber) HandleEvent(ev Event) {
	if ev.Type == Tick {
		s.sweep(ev.Time)
		return
	}
	if !ev.Type.Valid() {
		return
	}
	if ev.RequestID == "" {
		if s.byStart[ev.Type] != 0 || s.byEnd[ev.Type] != 0 {
			s.invalid.Add(1)
		}
		return
	}
	if i := s.byStart[ev.Type]; i != 0 {
		s.startSpan(int(i-1), &ev)
	} else if i := s.byEnd[ev.Type]; i != 0 {
		s.endSpan(int(i-1), &ev)
	}
}

func (s *TracingSubscriber) startSpan(di int, ev *Event) {
	r := s.reqs[ev.RequestID]
	if r == nil {
		r = &reqState{}
		s.reqs[ev.RequestID] = r
	}
	r.touch(ev.Time)
	d := &s.defs[di]

	var parentCtx context.Context
	var parent *openSpan
	traced := true
	switch {
	case d.parent >= 0:
		if ev.ParentCopyID != 0 {
			parent = r.find(d.parent, ev.ParentCopyID)
		} else {
			parent = r.latest(d.parent)
		}
		switch {
		case parent == nil:
			s.orphaned.Add(1)
			traced = false
		case parent.span == nil:
			traced = false
		default:
			parentCtx = parent.ctx
		}
	case d.TraceContext:
		sc := parseTraceContext(ev.TraceContext, ev.TraceState)
		switch {
		case sc.IsValid() && !sc.IsSampled():
			r.sampledOut = true
			traced = false
		case sc.IsValid():
			parentCtx = trace.ContextWithRemoteSpanContext(context.Background(), sc)
		case d.RootFallback && r.sampledOut:
			traced = false
		case d.RootFallback:
			parentCtx = s.rootContext(r, ev)
		default:
			parentCtx = context.Background()
		}
	default:
		parentCtx = context.Background()
	}

	if prev := r.find(di, ev.CopyID); prev != nil {
		s.endLost(r, prev, ev.Time)
	}
	o := &openSpan{def: di, copyID: ev.CopyID, start: ev.Time, parent: parent}
	if traced {
		attrs := make([]attribute.KeyValue, 0, 1+len(ev.Attrs))
		attrs = append(attrs, AttrRequestID.String(ev.RequestID))
		attrs = appendAttrs(attrs, ev.Attrs, d.StartAttrs)
		o.ctx, o.span = s.tracer.Start(parentCtx, d.Name,
			trace.WithTimestamp(ev.Time), trace.WithSpanKind(d.Kind), trace.WithAttributes(attrs...))
	}
	r.open = append(r.open, o)
	if d.Async {
		r.pending++
	}
	s.open.Add(1)
}

// rootContext returns the context to parent an option-B span under: the
// request's open cb.request root, opening it if needed. A request whose root
// closed already (a second retrieve) parents under the closed root.
func (s *TracingSubscriber) rootContext(r *reqState, ev *Event) context.Context {
	if r.root != nil {
		return r.rootCtx
	}
	if r.rootSC.IsValid() {
		return trace.ContextWithSpanContext(context.Background(), r.rootSC)
	}
	ctx := telemetry.ContextWithTraceID(context.Background(), telemetry.TraceIDFromRequestID(ev.RequestID))
	_, root := s.tracer.Start(ctx, RootSpanName, trace.WithTimestamp(ev.Time),
		trace.WithAttributes(AttrRequestID.String(ev.RequestID)))
	r.root = root
	r.rootCtx = trace.ContextWithSpan(context.Background(), root)
	r.rootSC = root.SpanContext()
	r.rootErr = ""
	r.gateEnded = false
	s.roots.Add(1)
	return r.rootCtx
}

func (s *TracingSubscriber) endSpan(di int, ev *Event) {
	r := s.reqs[ev.RequestID]
	var o *openSpan
	if r != nil {
		o = r.find(di, ev.CopyID)
	}
	if o == nil {
		s.unpaired.Add(1)
		return
	}
	r.touch(ev.Time)
	s.remove(r, o)
	d := &s.defs[di]
	if o.span != nil && o.span.IsRecording() {
		attrs := appendAttrs(make([]attribute.KeyValue, 0, len(ev.Attrs)+1), ev.Attrs, d.EndAttrs)
		if d.DurationMsAttr != "" {
			if _, ok := ev.Attr(d.DurationMsAttr); !ok {
				attrs = append(attrs, d.DurationMsAttr.Float64(float64(ev.Time.Sub(o.start))/float64(time.Millisecond)))
			}
		}
		o.span.SetAttributes(attrs...)
		if len(d.StampParent) > 0 && o.parent != nil && o.parent.span != nil {
			o.parent.span.SetAttributes(appendAttrs(nil, ev.Attrs, d.StampParent)...)
		}
		if ev.Err != nil {
			o.span.SetStatus(codes.Error, ev.Err.Error())
		}
	}
	if o.span != nil {
		o.span.End(trace.WithTimestamp(ev.Time))
	}
	if r.root != nil {
		if len(d.StampRoot) > 0 {
			r.root.SetAttributes(appendAttrs(nil, ev.Attrs, d.StampRoot)...)
		}
		if ev.Err != nil && r.rootErr == "" {
			r.rootErr = d.Name + ": " + ev.Err.Error()
		}
	}
	if d.GatesRoot {
		r.gateEnded = true
	}
	s.maybeCloseRoot(r, ev.Time)
	s.maybeForget(ev.RequestID, r, ev.Time)
}

// maybeCloseRoot ends the open option-B root once a gating span (the
// retrieve) has ended, none is open, and no asynchronous copy is pending.
func (s *TracingSubscriber) maybeCloseRoot(r *reqState, at time.Time) {
	if r.root == nil || !r.gateEnded || r.pending > 0 || r.gateOpen(s) {
		return
	}
	s.closeRoot(r, at)
}

func (s *TracingSubscriber) closeRoot(r *reqState, at time.Time) {
	switch {
	case r.rootErr != "":
		r.root.SetStatus(codes.Error, r.rootErr)
	case r.lost:
		r.root.SetStatus(codes.Error, LostEndDescription)
	}
	r.root.End(trace.WithTimestamp(at))
	r.root, r.rootCtx = nil, nil
}

// maybeForget drops the state of a request with nothing open and nothing to
// remember: no option-B root (whose context a later retrieve parents under)
// and no sampled-out mark (which keeps a later context-less START from
// opening a root). Those are kept until the sweep finds them idle.
func (s *TracingSubscriber) maybeForget(id string, r *reqState, now time.Time) {
	if len(r.open) > 0 || r.root != nil {
		return
	}
	if !r.rootSC.IsValid() && !r.sampledOut {
		delete(s.reqs, id)
		return
	}
	if now.Sub(r.last) >= s.ttl {
		delete(s.reqs, id)
	}
}

// sweep ends the spans older than the TTL (status Error "end event lost"),
// closes option-B roots that can close, and forgets idle requests.
func (s *TracingSubscriber) sweep(now time.Time) {
	for id, r := range s.reqs {
		for i := 0; i < len(r.open); {
			if o := r.open[i]; now.Sub(o.start) >= s.ttl {
				s.endLost(r, o, now) // removes r.open[i]
				continue
			}
			i++
		}
		if r.root != nil {
			s.maybeCloseRoot(r, now)
		}
		if r.root != nil && len(r.open) == 0 && now.Sub(r.last) >= s.ttl {
			// Nothing open and nothing heard for a TTL: the retrieve that
			// would close the root is not coming (a lookup without hits).
			s.closeRoot(r, r.last)
		}
		s.maybeForget(id, r, now)
	}
}

// endLost ends o without its END event and removes it from r.
func (s *TracingSubscriber) endLost(r *reqState, o *openSpan, at time.Time) {
	s.remove(r, o)
	if o.span != nil {
		o.span.SetStatus(codes.Error, LostEndDescription)
		o.span.End(trace.WithTimestamp(at))
	}
	r.lost = true
	s.lost.Add(1)
}

func (s *TracingSubscriber) remove(r *reqState, o *openSpan) {
	for i, x := range r.open {
		if x == o {
			last := len(r.open) - 1
			r.open[i] = r.open[last]
			r.open[last] = nil
			r.open = r.open[:last]
			if s.defs[o.def].Async {
				r.pending--
			}
			s.open.Add(-1)
			return
		}
	}
}

func (r *reqState) touch(t time.Time) {
	if t.After(r.last) {
		r.last = t
	}
}

func (r *reqState) find(def int, copyID uint64) *openSpan {
	for _, o := range r.open {
		if o.def == def && o.copyID == copyID {
			return o
		}
	}
	return nil
}

// latest returns the most recently started open span of def, or nil.
func (r *reqState) latest(def int) *openSpan {
	var best *openSpan
	for _, o := range r.open {
		if o.def == def && (best == nil || o.start.After(best.start)) {
			best = o
		}
	}
	return best
}

// gateOpen reports whether a GatesRoot span of r is open.
func (r *reqState) gateOpen(s *TracingSubscriber) bool {
	for _, o := range r.open {
		if s.defs[o.def].GatesRoot {
			return true
		}
	}
	return false
}

// appendAttrs appends the attributes of src whose key is in keys (all of
// them when keys is nil) to dst.
func appendAttrs(dst, src []attribute.KeyValue, keys []attribute.Key) []attribute.KeyValue {
	if keys == nil {
		return append(dst, src...)
	}
	for _, kv := range src {
		for _, k := range keys {
			if kv.Key == k {
				dst = append(dst, kv)
				break
			}
		}
	}
	return dst
}

// parseTraceContext returns the remote span context of the W3C traceparent
// tp (parsed strictly by telemetry.ParseTraceparent) carrying the tracestate
// ts (dropped when invalid), or the zero (invalid) span context when tp is
// empty or malformed.
func parseTraceContext(tp, ts string) trace.SpanContext {
	sc, _ := telemetry.SpanContextFromStrings(tp, ts)
	return sc
}
