package tracestore

import (
	"container/list"
	"encoding/base64"
	"fmt"
	"sync"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// Defaults of [StoreConfig].
const (
	DefaultMaxTraces = 10000
	DefaultMaxSpans  = 1000000
)

// UnknownService is the service name given to spans whose resource has no service.name.
const UnknownService = "unknown_service"

// StoreConfig holds the optional limits of a [Store]. The zero value is usable.
type StoreConfig struct {
	// MaxTraces caps the number of traces kept; the oldest trace (by first arrival) is
	// evicted to make room. 0 means DefaultMaxTraces (10000).
	MaxTraces int
	// MaxSpans caps the number of spans kept across all traces; the oldest traces are
	// evicted to make room, and spans of a single trace beyond the cap are rejected.
	// 0 means DefaultMaxSpans (1,000,000).
	MaxSpans int
}

func (c StoreConfig) withDefaults() StoreConfig {
	if c.MaxTraces <= 0 {
		c.MaxTraces = DefaultMaxTraces
	}
	if c.MaxSpans <= 0 {
		c.MaxSpans = DefaultMaxSpans
	}
	return c
}

// StoreStats is a snapshot of a store's size and monotonic counters.
type StoreStats struct {
	// Traces and Spans are the current contents.
	Traces int `json:"traces"`
	Spans  int `json:"spans"`
	// ReceivedSpans counts every span passed to Add.
	ReceivedSpans uint64 `json:"receivedSpans"`
	// RejectedSpans counts spans refused: empty trace or span id, or a trace that alone
	// exceeds MaxSpans.
	RejectedSpans uint64 `json:"rejectedSpans"`
	// DuplicateSpans counts spans that replaced a stored span with the same trace and span
	// id (an exporter's retry).
	DuplicateSpans uint64 `json:"duplicateSpans"`
	// EvictedTraces and EvictedSpans count what the limits pushed out.
	EvictedTraces uint64 `json:"evictedTraces"`
	EvictedSpans  uint64 `json:"evictedSpans"`
}

// AddResult tells the caller of [Store.Add] what happened to its spans.
type AddResult struct {
	// Accepted counts spans stored (new or replacing a duplicate).
	Accepted int
	// Rejected counts spans refused; Reason describes the first refusal.
	Rejected int
	Reason   string
}

// Store is a bounded in-memory trace store: spans grouped by trace id, the oldest traces
// evicted when a limit is reached. Safe for concurrent use.
type Store struct {
	cfg StoreConfig

	mu       sync.RWMutex
	traces   map[pcommon.TraceID]*traceRec
	order    list.List // of *traceRec, oldest first
	nSpans   int
	services map[string]*serviceRec
	stats    StoreStats // counters only; Traces/Spans filled on read
}

type serviceRec struct {
	spans int
	ops   map[opKey]int
}

type opKey struct {
	name string
	kind ptrace.SpanKind
}

type traceRec struct {
	id    pcommon.TraceID
	spans []*span
	index map[pcommon.SpanID]int
	elem  *list.Element
	start int64 // earliest span start, unix ns
}

// NewStore returns an empty store.
func NewStore(cfg StoreConfig) *Store {
	return &Store{
		cfg:      cfg.withDefaults(),
		traces:   make(map[pcommon.TraceID]*traceRec),
		services: make(map[string]*serviceRec),
	}
}

// Stats returns the current size and counters.
func (s *Store) Stats() StoreStats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := s.stats
	st.Traces = len(s.traces)
	st.Spans = s.nSpans
	return st
}

// Add stores the spans of td. td is only read, during the call. Spans with an empty trace
// or span id are rejected; a span whose trace and span id are already stored replaces the
// stored one.
func (s *Store) Add(td ptrace.Traces) AddResult {
	spans, res := convertTraces(td)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.ReceivedSpans += uint64(len(spans) + res.Rejected)
	s.stats.RejectedSpans += uint64(res.Rejected)
	for _, sp := range spans {
		if s.insertLocked(sp) {
			res.Accepted++
			continue
		}
		res.Rejected++
		s.stats.RejectedSpans++
		if res.Reason == "" {
			res.Reason = fmt.Sprintf("trace %s exceeds the store's limit of %d spans", sp.traceID, s.cfg.MaxSpans)
		}
	}
	return res
}

// insertLocked stores one span; false when it was rejected.
func (s *Store) insertLocked(sp *span) bool {
	rec, ok := s.traces[sp.traceID]
	if ok {
		if i, dup := rec.index[sp.spanID]; dup {
			old := rec.spans[i]
			s.forgetSpanLocked(old)
			rec.spans[i] = sp
			s.noteSpanLocked(sp)
			rec.start = min(rec.start, sp.start)
			s.stats.DuplicateSpans++
			return true
		}
		if len(rec.spans) >= s.cfg.MaxSpans {
			return false
		}
	} else {
		for len(s.traces) >= s.cfg.MaxTraces {
			s.evictOldestLocked(nil)
		}
		rec = &traceRec{id: sp.traceID, index: make(map[pcommon.SpanID]int), start: sp.start}
		rec.elem = s.order.PushBack(rec)
		s.traces[sp.traceID] = rec
	}
	for s.nSpans >= s.cfg.MaxSpans {
		if !s.evictOldestLocked(rec) {
			return false
		}
	}
	rec.index[sp.spanID] = len(rec.spans)
	rec.spans = append(rec.spans, sp)
	rec.start = min(rec.start, sp.start)
	s.nSpans++
	s.noteSpanLocked(sp)
	return true
}

// evictOldestLocked removes the oldest trace other than keep; false if there is none.
func (s *Store) evictOldestLocked(keep *traceRec) bool {
	for e := s.order.Front(); e != nil; e = e.Next() {
		rec := e.Value.(*traceRec)
		if rec == keep {
			continue
		}
		s.order.Remove(e)
		delete(s.traces, rec.id)
		for _, sp := range rec.spans {
			s.forgetSpanLocked(sp)
		}
		s.nSpans -= len(rec.spans)
		s.stats.EvictedTraces++
		s.stats.EvictedSpans += uint64(len(rec.spans))
		return true
	}
	return false
}

func (s *Store) noteSpanLocked(sp *span) {
	svc := s.services[sp.res.service]
	if svc == nil {
		svc = &serviceRec{ops: make(map[opKey]int)}
		s.services[sp.res.service] = svc
	}
	svc.spans++
	svc.ops[opKey{sp.name, sp.kind}]++
}

func (s *Store) forgetSpanLocked(sp *span) {
	svc := s.services[sp.res.service]
	if svc == nil {
		return
	}
	k := opKey{sp.name, sp.kind}
	if svc.ops[k]--; svc.ops[k] <= 0 {
		delete(svc.ops, k)
	}
	if svc.spans--; svc.spans <= 0 {
		delete(s.services, sp.res.service)
	}
}

// ---------------------------------------------------------------- the stored span model

type valueType uint8

const (
	valString valueType = iota
	valBool
	valInt
	valDouble
	valBytes // s holds the raw bytes
	valJSON  // arrays and maps: s holds their JSON rendering
)

type value struct {
	t valueType
	s string
	i int64
	f float64
	b bool
}

func (v value) String() string {
	switch v.t {
	case valBool:
		return fmt.Sprint(v.b)
	case valInt:
		return fmt.Sprint(v.i)
	case valDouble:
		return fmt.Sprint(v.f)
	case valBytes:
		return base64.StdEncoding.EncodeToString([]byte(v.s))
	}
	return v.s
}

// number returns a numeric attribute as float64.
func (v value) number() (float64, bool) {
	switch v.t {
	case valInt:
		return float64(v.i), true
	case valDouble:
		return v.f, true
	}
	return 0, false
}

type attr struct {
	key string
	val value
}

type attrs []attr

func (a attrs) get(key string) (value, bool) {
	for _, kv := range a {
		if kv.key == key {
			return kv.val, true
		}
	}
	return value{}, false
}

type resource struct {
	service string
	attrs   attrs // without service.name
}

type event struct {
	time  int64
	name  string
	attrs attrs
}

type link struct {
	traceID pcommon.TraceID
	spanID  pcommon.SpanID
}

// span is immutable once stored.
type span struct {
	traceID      pcommon.TraceID
	spanID       pcommon.SpanID
	parentID     pcommon.SpanID
	name         string
	kind         ptrace.SpanKind
	start, end   int64 // unix ns
	flags        uint32
	traceState   string
	attrs        attrs
	events       []event
	links        []link
	status       ptrace.StatusCode
	statusMsg    string
	scopeName    string
	scopeVersion string
	res          *resource
}

func (sp *span) duration() int64 { return max(0, sp.end-sp.start) }

func convertTraces(td ptrace.Traces) ([]*span, AddResult) {
	var out []*span
	var res AddResult
	rss := td.ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		rs := rss.At(i)
		r := &resource{service: UnknownService}
		for k, v := range rs.Resource().Attributes().All() {
			if k == "service.name" && v.Type() == pcommon.ValueTypeStr {
				if v.Str() != "" {
					r.service = v.Str()
				}
				continue
			}
			r.attrs = appendAttr(r.attrs, k, v)
		}
		sss := rs.ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			ss := sss.At(j)
			scope := ss.Scope()
			spans := ss.Spans()
			for k := 0; k < spans.Len(); k++ {
				ps := spans.At(k)
				if ps.TraceID().IsEmpty() || ps.SpanID().IsEmpty() {
					res.Rejected++
					if res.Reason == "" {
						res.Reason = "span with an empty trace or span id"
					}
					continue
				}
				out = append(out, convertSpan(ps, scope, r))
			}
		}
	}
	return out, res
}

func convertSpan(ps ptrace.Span, scope pcommon.InstrumentationScope, r *resource) *span {
	sp := &span{
		traceID:      ps.TraceID(),
		spanID:       ps.SpanID(),
		parentID:     ps.ParentSpanID(),
		name:         ps.Name(),
		kind:         ps.Kind(),
		start:        int64(ps.StartTimestamp()),
		end:          int64(ps.EndTimestamp()),
		flags:        ps.Flags(),
		traceState:   ps.TraceState().AsRaw(),
		status:       ps.Status().Code(),
		statusMsg:    ps.Status().Message(),
		scopeName:    scope.Name(),
		scopeVersion: scope.Version(),
		res:          r,
	}
	for k, v := range ps.Attributes().All() {
		sp.attrs = appendAttr(sp.attrs, k, v)
	}
	evs := ps.Events()
	for i := 0; i < evs.Len(); i++ {
		e := evs.At(i)
		ev := event{time: int64(e.Timestamp()), name: e.Name()}
		for k, v := range e.Attributes().All() {
			ev.attrs = appendAttr(ev.attrs, k, v)
		}
		sp.events = append(sp.events, ev)
	}
	ls := ps.Links()
	for i := 0; i < ls.Len(); i++ {
		sp.links = append(sp.links, link{traceID: ls.At(i).TraceID(), spanID: ls.At(i).SpanID()})
	}
	return sp
}

// appendAttr appends k=v unless k is already present (OTLP maps may repeat keys; the first
// wins, as in pcommon.Map.Get).
func appendAttr(a attrs, k string, v pcommon.Value) attrs {
	if _, dup := a.get(k); dup {
		return a
	}
	return append(a, attr{key: k, val: fromPdata(v)})
}

func fromPdata(v pcommon.Value) value {
	switch v.Type() {
	case pcommon.ValueTypeStr:
		return value{t: valString, s: v.Str()}
	case pcommon.ValueTypeBool:
		return value{t: valBool, b: v.Bool()}
	case pcommon.ValueTypeInt:
		return value{t: valInt, i: v.Int()}
	case pcommon.ValueTypeDouble:
		return value{t: valDouble, f: v.Double()}
	case pcommon.ValueTypeBytes:
		return value{t: valBytes, s: string(v.Bytes().AsRaw())}
	case pcommon.ValueTypeEmpty:
		return value{t: valString}
	default:
		return value{t: valJSON, s: v.AsString()}
	}
}
