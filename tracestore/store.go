package tracestore

import (
	"cmp"
	"container/list"
	"fmt"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/defaults"
)

// Defaults of [StoreConfig].
const (
	// DefaultMaxTraces is the default number of traces kept.
	DefaultMaxTraces = 10000
	// DefaultMaxSpans is the default number of spans kept across all traces.
	DefaultMaxSpans = 1000000
	// DefaultMaxBytes is the default memory budget of the stored spans: 256 MiB.
	DefaultMaxBytes = 256 << 20
	// DefaultMaxAttributes is the default cap on the attributes kept per span, per event
	// and per resource (OpenTelemetry's AttributeCountLimit default).
	DefaultMaxAttributes = 128
	// DefaultMaxEvents is the default cap on the events kept per span (OpenTelemetry's
	// EventCountLimit default).
	DefaultMaxEvents = 128
	// DefaultMaxLinks is the default cap on the links kept per span (OpenTelemetry's
	// LinkCountLimit default).
	DefaultMaxLinks = 128
	// DefaultMaxAttributeValueBytes is the default length limit of an attribute value and
	// of every other stored string: 64 KiB.
	DefaultMaxAttributeValueBytes = 64 << 10
)

// UnknownService is the service name given to spans whose resource has no service.name.
const UnknownService = "unknown_service"

// StoreConfig holds the optional limits of a [Store]. The zero value is usable: every
// field left 0 takes its default.
type StoreConfig struct {
	// MaxTraces caps the number of traces kept; the oldest trace (by first arrival) is
	// evicted to make room. 0 means DefaultMaxTraces (10000).
	MaxTraces int
	// MaxSpans caps the number of spans kept across all traces; the oldest traces are
	// evicted to make room, and spans of a single trace beyond the cap are rejected.
	// 0 means DefaultMaxSpans (1,000,000).
	MaxSpans int
	// MaxBytes is the memory budget of the store: the estimated heap bytes its spans keep
	// (names, attributes, events, links, their resources and scopes, and the store's own
	// bookkeeping per span and per trace), estimated once per span when it is added and
	// rounded up. The oldest traces (by first arrival) are evicted to stay within it; spans
	// of a single trace that alone would exceed it are rejected (and the trace counted as
	// truncated), so no trace can blow the budget. 0 means DefaultMaxBytes (256 MiB).
	MaxBytes int64
	// MaxAttributes caps the attributes kept per span, per span event and per resource;
	// the rest are dropped and counted in the span's dropped_attributes_count, as an
	// OpenTelemetry SDK does. 0 means DefaultMaxAttributes (128); negative means no cap.
	MaxAttributes int
	// MaxEvents caps the events kept per span (the first ones); the rest are counted in
	// dropped_events_count. 0 means DefaultMaxEvents (128); negative means no cap.
	MaxEvents int
	// MaxLinks caps the links kept per span (the first ones); the rest are counted in
	// dropped_links_count. 0 means DefaultMaxLinks (128); negative means no cap.
	MaxLinks int
	// MaxAttributeValueBytes is the length limit of a string or bytes attribute value (an
	// array or map value counts as its JSON text), and also of attribute keys, span and
	// event names, scope names and versions, status messages, trace states and service
	// names: longer ones are cut (at a UTF-8 boundary) and counted. 0 means
	// DefaultMaxAttributeValueBytes (64 KiB); negative means no limit.
	MaxAttributeValueBytes int
}

func (c StoreConfig) withDefaults() StoreConfig {
	defaults.Positive(&c.MaxTraces, DefaultMaxTraces)
	defaults.Positive(&c.MaxSpans, DefaultMaxSpans)
	defaults.Positive(&c.MaxBytes, DefaultMaxBytes)
	// The per-span limits: negative means no cap.
	c.MaxAttributes = cmp.Or(c.MaxAttributes, DefaultMaxAttributes)
	c.MaxEvents = cmp.Or(c.MaxEvents, DefaultMaxEvents)
	c.MaxLinks = cmp.Or(c.MaxLinks, DefaultMaxLinks)
	c.MaxAttributeValueBytes = cmp.Or(c.MaxAttributeValueBytes, DefaultMaxAttributeValueBytes)
	return c
}

// StoreStats is a snapshot of a store's size, its byte budget and its monotonic counters.
type StoreStats struct {
	// Traces and Spans are the current contents.
	Traces int `json:"traces"`
	Spans  int `json:"spans"`
	// Bytes is the current estimated size of the contents (see StoreConfig.MaxBytes); it
	// never exceeds MaxBytes, the budget in force.
	Bytes    int64 `json:"bytes"`
	MaxBytes int64 `json:"maxBytes"`
	// ReceivedSpans counts every span passed to Add.
	ReceivedSpans uint64 `json:"receivedSpans"`
	// RejectedSpans counts spans refused: empty trace or span id, or a trace that alone
	// would exceed MaxSpans or MaxBytes. RejectedBytes is the estimated size of the spans
	// refused for a limit.
	RejectedSpans uint64 `json:"rejectedSpans"`
	RejectedBytes uint64 `json:"rejectedBytes"`
	// TruncatedTraces counts traces that lost spans to a per-trace limit (once each).
	TruncatedTraces uint64 `json:"truncatedTraces"`
	// DuplicateSpans counts spans that replaced a stored span with the same trace and span
	// id (an exporter's retry).
	DuplicateSpans uint64 `json:"duplicateSpans"`
	// EvictedTraces, EvictedSpans and EvictedBytes count what the limits pushed out.
	EvictedTraces uint64 `json:"evictedTraces"`
	EvictedSpans  uint64 `json:"evictedSpans"`
	EvictedBytes  uint64 `json:"evictedBytes"`
	// DroppedAttributes, DroppedEvents and DroppedLinks count what the per-span limits
	// left out (repeated attribute keys included); TruncatedValues counts strings cut to
	// MaxAttributeValueBytes.
	DroppedAttributes uint64 `json:"droppedAttributes"`
	DroppedEvents     uint64 `json:"droppedEvents"`
	DroppedLinks      uint64 `json:"droppedLinks"`
	TruncatedValues   uint64 `json:"truncatedValues"`
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
// evicted when a limit (traces, spans, bytes) is reached. Safe for concurrent use: Add
// takes a write lock for the insertion only (the conversion from pdata happens before),
// queries a read lock.
type Store struct {
	cfg StoreConfig
	lim limits

	mu       sync.RWMutex
	traces   map[pcommon.TraceID]*traceRec
	order    list.List  // of *traceRec, oldest first (by first arrival): the eviction order
	byStart  startIndex // newest first (by earliest span start): the request index's order
	nSpans   int
	bytes    int64
	services map[string]*serviceRec
	links    linkIndex  // linked trace id -> the stored spans of other traces linking to it
	stats    StoreStats // counters only; Traces/Spans/Bytes filled on read
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
	node  *skipNode
	start int64 // earliest span start, unix ns
	// bytes is the estimated size of the trace: its spans, each resource and scope they
	// share (charged once while shared counts spans holding it), and traceOverhead.
	bytes  int64
	shared map[any]int // *resource and *scope: how many of the trace's spans hold it
	// truncated is set when a per-trace limit refused one of its spans.
	truncated bool
	// negative counts spans that end before they start.
	negative int
	// version changes with every change of the trace; memo is its request-index row,
	// valid while memo.version == version.
	version uint64
	memo    atomic.Pointer[summaryMemo]
}

// NewStore returns an empty store with cfg's limits (defaults for fields left 0).
func NewStore(cfg StoreConfig) *Store {
	cfg = cfg.withDefaults()
	s := &Store{
		cfg: cfg,
		lim: limits{attrs: cfg.MaxAttributes, events: cfg.MaxEvents, links: cfg.MaxLinks,
			valueBytes: cfg.MaxAttributeValueBytes},
		traces:   make(map[pcommon.TraceID]*traceRec),
		services: make(map[string]*serviceRec),
		links:    make(linkIndex),
	}
	s.byStart.init()
	return s
}

// Config returns the store's limits, defaults filled in.
func (s *Store) Config() StoreConfig { return s.cfg }

// Stats returns the current size and counters.
func (s *Store) Stats() StoreStats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := s.stats
	st.Traces = len(s.traces)
	st.Spans = s.nSpans
	st.Bytes = s.bytes
	st.MaxBytes = s.cfg.MaxBytes
	return st
}

// Add stores the spans of td. td is only read, during the call. Spans with an empty trace
// or span id are rejected; a span whose trace and span id are already stored replaces the
// stored one. The per-span limits of [StoreConfig] apply first; then the oldest traces are
// evicted as needed to keep within MaxTraces, MaxSpans and MaxBytes, and a span that its
// own trace could not hold within MaxSpans or MaxBytes is rejected.
func (s *Store) Add(td ptrace.Traces) AddResult {
	spans, res, conv := convertLimited(td, s.lim)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.ReceivedSpans += uint64(len(spans) + res.Rejected)
	s.stats.RejectedSpans += uint64(res.Rejected)
	s.stats.DroppedAttributes += conv.droppedAttrs
	s.stats.DroppedEvents += conv.droppedEvents
	s.stats.DroppedLinks += conv.droppedLinks
	s.stats.TruncatedValues += conv.truncated
	for _, sp := range spans {
		reason := s.insertLocked(sp)
		if reason == "" {
			res.Accepted++
			continue
		}
		res.Rejected++
		s.stats.RejectedSpans++
		s.stats.RejectedBytes += uint64(sp.size)
		if res.Reason == "" {
			res.Reason = reason
		}
	}
	return res
}

// sharedCostLocked is what storing sp in rec (nil: a new trace) adds for the resource and
// scope it shares with other spans.
func sharedCostLocked(rec *traceRec, sp *span) int64 {
	var n int64
	if rec == nil || rec.shared[sp.res] == 0 {
		n += sp.res.size + sharedEntry
	}
	if rec == nil || rec.shared[sp.scope] == 0 {
		n += sp.scope.size + sharedEntry
	}
	return n
}

// freedBySharedLocked is what replacing old by sp in rec frees of the resource and scope
// that old alone holds.
func freedBySharedLocked(rec *traceRec, old, sp *span) int64 {
	var n int64
	if old.res != sp.res && rec.shared[old.res] == 1 {
		n += old.res.size + sharedEntry
	}
	if old.scope != sp.scope && rec.shared[old.scope] == 1 {
		n += old.scope.size + sharedEntry
	}
	return n
}

func (rec *traceRec) unref(p any) {
	if rec.shared[p]--; rec.shared[p] <= 0 {
		delete(rec.shared, p)
	}
}

// insertLocked stores one span; it returns why it was rejected, or "".
func (s *Store) insertLocked(sp *span) string {
	rec := s.traces[sp.traceID]
	cost := sp.size + sharedCostLocked(rec, sp)
	if rec == nil {
		cost += traceOverhead
		if cost > s.cfg.MaxBytes {
			s.stats.TruncatedTraces++
			return s.bytesReason(sp)
		}
		if !s.makeRoomLocked(nil, 1, cost, true) {
			return s.bytesReason(sp) // unreachable: an empty store has room
		}
		rec = &traceRec{id: sp.traceID, index: make(map[pcommon.SpanID]int), start: sp.start, bytes: traceOverhead}
		rec.elem = s.order.PushBack(rec)
		s.traces[sp.traceID] = rec
		s.bytes += traceOverhead
		s.byStart.insert(rec)
		return s.appendLocked(rec, sp, cost-traceOverhead)
	}

	if i, dup := rec.index[sp.spanID]; dup {
		old := rec.spans[i]
		delta := cost - old.size - freedBySharedLocked(rec, old, sp)
		if rec.bytes+delta > s.cfg.MaxBytes {
			return s.truncateLocked(rec, s.bytesReason(sp))
		}
		if !s.makeRoomLocked(rec, 0, delta, false) {
			return s.truncateLocked(rec, s.bytesReason(sp))
		}
		s.forgetSpanLocked(old)
		rec.unref(old.res)
		rec.unref(old.scope)
		if old.end < old.start {
			rec.negative--
		}
		rec.spans[i] = sp
		s.chargeLocked(rec, sp, delta)
		s.stats.DuplicateSpans++
		return ""
	}
	if len(rec.spans) >= s.cfg.MaxSpans {
		return s.truncateLocked(rec, fmt.Sprintf("trace %s exceeds the store's limit of %d spans", sp.traceID, s.cfg.MaxSpans))
	}
	if rec.bytes+cost > s.cfg.MaxBytes {
		return s.truncateLocked(rec, s.bytesReason(sp))
	}
	if !s.makeRoomLocked(rec, 1, cost, false) {
		return s.truncateLocked(rec, s.bytesReason(sp))
	}
	return s.appendLocked(rec, sp, cost)
}

func (s *Store) bytesReason(sp *span) string {
	return fmt.Sprintf("trace %s exceeds the store's memory budget of %d bytes", sp.traceID, s.cfg.MaxBytes)
}

func (s *Store) truncateLocked(rec *traceRec, reason string) string {
	if !rec.truncated {
		rec.truncated = true
		rec.version++
		s.stats.TruncatedTraces++
	}
	return reason
}

// appendLocked adds sp, whose cost was checked, as a new span of rec.
func (s *Store) appendLocked(rec *traceRec, sp *span, cost int64) string {
	rec.index[sp.spanID] = len(rec.spans)
	rec.spans = append(rec.spans, sp)
	s.nSpans++
	s.chargeLocked(rec, sp, cost)
	return ""
}

// chargeLocked accounts for sp, now stored in rec, and cost, the bytes it added.
func (s *Store) chargeLocked(rec *traceRec, sp *span, cost int64) {
	if rec.shared == nil {
		rec.shared = make(map[any]int, 2)
	}
	rec.shared[sp.res]++
	rec.shared[sp.scope]++
	rec.bytes += cost
	s.bytes += cost
	if sp.end < sp.start {
		rec.negative++
	}
	if sp.start < rec.start {
		s.byStart.remove(rec)
		rec.start = sp.start
		s.byStart.insert(rec)
	}
	rec.version++
	s.noteSpanLocked(sp)
}

// makeRoomLocked evicts the oldest traces other than keep until spans more spans and
// bytes more bytes (and, with newTrace, one more trace) fit; false if evicting every
// other trace would not do.
func (s *Store) makeRoomLocked(keep *traceRec, spans int, bytes int64, newTrace bool) bool {
	for (newTrace && len(s.traces) >= s.cfg.MaxTraces) || s.nSpans+spans > s.cfg.MaxSpans || s.bytes+bytes > s.cfg.MaxBytes {
		if !s.evictOldestLocked(keep) {
			return false
		}
	}
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
		s.byStart.remove(rec)
		delete(s.traces, rec.id)
		for _, sp := range rec.spans {
			s.forgetSpanLocked(sp)
		}
		s.nSpans -= len(rec.spans)
		s.bytes -= rec.bytes
		s.stats.EvictedTraces++
		s.stats.EvictedSpans += uint64(len(rec.spans))
		s.stats.EvictedBytes += uint64(rec.bytes)
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
	s.links.add(sp)
}

func (s *Store) forgetSpanLocked(sp *span) {
	s.links.remove(sp)
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
