package tracestore

import (
	"cmp"
	"slices"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// The link index: for each trace id, the stored spans of other traces whose links point
// into it. It answers "what refers to this request?" — e.g. the worker's online quality
// check (cb.quality, the root of its own trace, linked to the request's cb.model_forward)
// — without scanning the store. An entry lives exactly as long as the linking span: it is
// added when the span is stored and removed when the span is evicted or replaced, so the
// index holds at most one entry per stored link (MaxSpans × MaxLinks at most) and its
// bytes are charged to the linking span's estimate (linkSize). A link's target trace need
// not be stored: the entry stays while the linking span does.

// DefaultLinkedLimit is how many linking spans [Store.LinkedFrom] returns when the caller
// sets no limit.
const DefaultLinkedLimit = 100

// spanRef names one stored span.
type spanRef struct {
	trace pcommon.TraceID
	span  pcommon.SpanID
}

// linkIndex maps a linked trace id to the spans (of other traces) linking into it, each
// with how many of its links do. Not safe for concurrent use (the store's lock guards it).
type linkIndex map[pcommon.TraceID]map[spanRef]int

// add indexes sp's links to other traces.
func (x linkIndex) add(sp *span) {
	for _, l := range sp.links {
		if l.traceID == sp.traceID || l.traceID.IsEmpty() {
			continue
		}
		m := x[l.traceID]
		if m == nil {
			m = make(map[spanRef]int, 1)
			x[l.traceID] = m
		}
		m[spanRef{sp.traceID, sp.spanID}]++
	}
}

// remove takes sp's links out of the index.
func (x linkIndex) remove(sp *span) {
	ref := spanRef{sp.traceID, sp.spanID}
	for _, l := range sp.links {
		if l.traceID == sp.traceID || l.traceID.IsEmpty() {
			continue
		}
		m := x[l.traceID]
		if m == nil {
			continue
		}
		if m[ref]--; m[ref] <= 0 {
			delete(m, ref)
		}
		if len(m) == 0 {
			delete(x, l.traceID)
		}
	}
}

// entries counts the index's entries (for tests of its bound).
func (x linkIndex) entries() int {
	n := 0
	for _, m := range x {
		n += len(m)
	}
	return n
}

// LinkedSpan is a span of another trace that links to a trace (GET
// /api/traces/{id}/linked): e.g. the cb.quality check of a request.
type LinkedSpan struct {
	// TraceID and SpanID name the linking span; Name, Service and Instance
	// (service.instance.id, "" when none) what it is and which process recorded it.
	TraceID  string `json:"traceID"`
	SpanID   string `json:"spanID"`
	Name     string `json:"name"`
	Service  string `json:"service"`
	Instance string `json:"instance,omitempty"`
	// StartUnixMicro is its start; DurationNs end minus start as recorded.
	StartUnixMicro int64 `json:"startUnixMicro"`
	DurationNs     int64 `json:"durationNs"`
	// LinkedSpanIDs are the spans of the linked trace it points to.
	LinkedSpanIDs []string `json:"linkedSpanIDs"`
	// Tags are its attributes, typed as in the Jaeger model.
	Tags []jaeger.KeyValue `json:"tags"`
	// Error is true when its status is ERROR.
	Error bool `json:"error"`
}

// LinkedFrom returns the stored spans of other traces that link to the trace traceID (the
// trace itself need not be stored), oldest first, at most limit of them (0:
// DefaultLinkedLimit), and how many there are; false when the id is malformed. Its cost is
// in proportion to the spans linking to the trace, not to the store.
func (s *Store) LinkedFrom(traceID string, limit int) ([]LinkedSpan, int, bool) {
	tid, ok := parseTraceID(traceID)
	if !ok {
		return nil, 0, false
	}
	if limit <= 0 {
		limit = DefaultLinkedLimit
	}
	var spans []*span
	s.mu.RLock()
	for ref := range s.links[tid] {
		if rec := s.traces[ref.trace]; rec != nil {
			if i, ok := rec.index[ref.span]; ok {
				spans = append(spans, rec.spans[i])
			}
		}
	}
	s.mu.RUnlock()
	// Spans are immutable: converted without the lock.
	slices.SortFunc(spans, func(a, b *span) int {
		return cmp.Or(cmp.Compare(a.start, b.start), slices.Compare(a.traceID[:], b.traceID[:]), slices.Compare(a.spanID[:], b.spanID[:]))
	})
	total := len(spans)
	out := make([]LinkedSpan, 0, min(total, limit))
	for _, sp := range spans[:min(total, limit)] {
		ls := LinkedSpan{
			TraceID: sp.traceID.String(), SpanID: sp.spanID.String(), Name: sp.name,
			Service: sp.res.service, Instance: sp.res.instance,
			StartUnixMicro: sp.start / 1000, DurationNs: sp.duration(),
			Tags:  toTags(sp.attrs, nil),
			Error: sp.status == ptrace.StatusCodeError,
		}
		for _, l := range sp.links {
			if l.traceID == tid {
				ls.LinkedSpanIDs = append(ls.LinkedSpanIDs, l.spanID.String())
			}
		}
		out = append(out, ls)
	}
	return out, total, true
}
