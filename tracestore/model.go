package tracestore

import (
	"encoding/base64"
	"fmt"
	"unsafe"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// The stored span model, and the estimate of what each piece keeps on the heap.

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

// attrs holds unique keys (see converter.attrs).
type attrs []attr

func (a attrs) get(key string) (value, bool) {
	for _, kv := range a {
		if kv.key == key {
			return kv.val, true
		}
	}
	return value{}, false
}

// resource is shared by the spans of one ResourceSpans.
type resource struct {
	service      string
	instance     string // service.instance.id; "" when the process set none
	attrs        attrs  // without service.name
	droppedAttrs uint32
	size         int64 // estimate(), charged once to each trace that holds one of its spans
}

// scope is shared by the spans of one ScopeSpans.
type scope struct {
	name, version string
	size          int64
}

type event struct {
	time         int64
	name         string
	attrs        attrs
	droppedAttrs uint32
}

type link struct {
	traceID pcommon.TraceID
	spanID  pcommon.SpanID
}

// span is immutable once stored.
type span struct {
	traceID    pcommon.TraceID
	spanID     pcommon.SpanID
	parentID   pcommon.SpanID
	name       string
	kind       ptrace.SpanKind
	start, end int64 // unix ns, as recorded (OTLP's unsigned nanoseconds, bit for bit)
	flags      uint32
	traceState string
	attrs      attrs
	events     []event
	links      []link
	status     ptrace.StatusCode
	statusMsg  string
	scope      *scope
	res        *resource
	spanLoss
	// size is estimate(): the bytes this span keeps on the heap, its shared resource and
	// scope excepted.
	size int64
}

// spanLoss is what the limits (and the sender) left out of a span: dropped attributes,
// events and links as OTLP counts them (the sender's count plus ours), and values cut to
// the length limit.
type spanLoss struct {
	droppedAttrs, droppedEvents, droppedLinks, truncated uint32
}

// duration is end minus start as recorded: negative when the span ends before it starts
// (clock trouble at the sender), never repaired.
func (sp *span) duration() int64 { return sp.end - sp.start }

// ---------------------------------------------------------------- size estimates

// Fixed costs, in bytes, of the pieces of the store (struct sizes plus the bookkeeping
// around them). The estimate errs on the high side: it is a budget, not a measurement.
var (
	// spanOverhead: the span struct; its slot in traceRec.spans (with append slack); its
	// traceRec.index entry; a share of the service/operation counts and of the summary.
	spanOverhead = int64(unsafe.Sizeof(span{})) + 16 + 64 + 80 + 16
	attrOverhead = int64(unsafe.Sizeof(attr{}))
	eventSize    = int64(unsafe.Sizeof(event{}))
	// linkSize: the link, and its entry in the store's link index (linkindex.go).
	linkSize = int64(unsafe.Sizeof(link{})) + linkIndexEntry
	// traceOverhead: traceRec, its list element, skip-list node, map entries and memo.
	traceOverhead = int64(unsafe.Sizeof(traceRec{})) + 48 + 160 + 64 + 48 + 512
	// linkIndexEntry: one entry of the link index (its map slot, and a share of the
	// per-trace map it sits in).
	linkIndexEntry = int64(unsafe.Sizeof(spanRef{})) + 8 + 64
	// sharedEntry: one entry of traceRec.shared.
	sharedEntry = int64(64)
)

// strCost is what a string's bytes take in the allocator (size classes round up by at most
// 1/8, plus a small-object minimum).
func strCost(s string) int64 {
	if len(s) == 0 {
		return 0
	}
	n := int64(len(s))
	return n + n/8 + 8
}

func (a attrs) estimate() int64 {
	n := int64(cap(a)) * attrOverhead
	for _, kv := range a {
		n += strCost(kv.key) + strCost(kv.val.s)
	}
	return n
}

func (sp *span) estimate() int64 {
	n := spanOverhead + strCost(sp.name) + strCost(sp.traceState) + strCost(sp.statusMsg) +
		sp.attrs.estimate() + int64(cap(sp.events))*eventSize + int64(cap(sp.links))*linkSize
	for _, ev := range sp.events {
		n += strCost(ev.name) + ev.attrs.estimate()
	}
	return n
}

func (r *resource) estimate() int64 {
	return int64(unsafe.Sizeof(resource{})) + strCost(r.service) + r.attrs.estimate()
}

func (sc *scope) estimate() int64 {
	return int64(unsafe.Sizeof(scope{})) + strCost(sc.name) + strCost(sc.version)
}
