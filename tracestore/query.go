package tracestore

import (
	"cmp"
	"encoding/hex"
	"slices"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// Services returns the names of the services with stored spans, sorted.
func (s *Store) Services() []string {
	s.mu.RLock()
	out := make([]string, 0, len(s.services))
	for name := range s.services {
		out = append(out, name)
	}
	s.mu.RUnlock()
	slices.Sort(out)
	return out
}

// Operations returns the span names (with their kinds) stored for a service, sorted by
// name then kind.
func (s *Store) Operations(service string) []jaeger.Operation {
	s.mu.RLock()
	var out []jaeger.Operation
	if svc := s.services[service]; svc != nil {
		for k := range svc.ops {
			out = append(out, jaeger.Operation{Name: k.name, SpanKind: kindTag(k.kind)})
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b jaeger.Operation) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.SpanKind, b.SpanKind))
	})
	return out
}

// parseTraceID accepts 1 to 32 hex digits (Jaeger drops leading zeros of 64-bit ids).
func parseTraceID(id string) (pcommon.TraceID, bool) {
	if !jaeger.IsTraceID(id) {
		return pcommon.TraceID{}, false
	}
	var tid pcommon.TraceID
	if _, err := hex.Decode(tid[:], []byte(jaeger.NormalizeTraceID(id))); err != nil {
		return pcommon.TraceID{}, false
	}
	return tid, true
}

// snapshot returns a copy of a trace's span list (the spans themselves are immutable).
func (s *Store) snapshot(id string) ([]*span, bool) {
	tid, ok := parseTraceID(id)
	if !ok {
		return nil, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	rec := s.traces[tid]
	if rec == nil {
		return nil, false
	}
	return slices.Clone(rec.spans), true
}

// Trace returns one trace in the Jaeger model; false when the id is malformed or unknown.
func (s *Store) Trace(traceID string) (jaeger.Trace, bool) { return view(s, traceID, toJaeger) }

// Breakdown computes where one trace's time went (see [Breakdown]); false when the id is
// malformed or unknown.
func (s *Store) Breakdown(traceID string) (Breakdown, bool) {
	return view(s, traceID, computeBreakdown)
}

// PTraces returns one trace as OTLP data (a fresh copy owned by the caller); false when the
// id is malformed or unknown.
func (s *Store) PTraces(traceID string) (ptrace.Traces, bool) { return view(s, traceID, toPdata) }

// view returns one trace converted by conv; false when the id is malformed or unknown.
func view[T any](s *Store, traceID string, conv func([]*span) T) (T, bool) {
	spans, ok := s.snapshot(traceID)
	if !ok {
		var zero T
		return zero, false
	}
	return conv(spans), true
}

type candidate struct {
	start int64
	spans []*span
}

// FindTraces searches the store with Jaeger's semantics (see [jaeger.Query]): newest
// traces first (by earliest span start), at most q.Limit (default jaeger.DefaultLimit).
func (s *Store) FindTraces(q jaeger.Query) []jaeger.Trace { return findAs(s, q, toJaeger) }

// FindPTraces is [Store.FindTraces] returning each trace as OTLP data (fresh copies owned
// by the caller), with full nanosecond precision and typed attributes.
func (s *Store) FindPTraces(q jaeger.Query) []ptrace.Traces { return findAs(s, q, toPdata) }

// findAs returns the traces s.find(q) finds, each converted by conv.
func findAs[T any](s *Store, q jaeger.Query, conv func([]*span) T) []T {
	cands := s.find(q)
	out := make([]T, 0, len(cands))
	for _, c := range cands {
		out = append(out, conv(c.spans))
	}
	return out
}

func (s *Store) find(q jaeger.Query) []candidate {
	limit := q.Limit
	if limit <= 0 {
		limit = jaeger.DefaultLimit
	}
	var cands []candidate
	s.mu.RLock()
	if len(q.TraceIDs) > 0 {
		seen := make(map[*traceRec]bool)
		for _, id := range q.TraceIDs {
			if tid, ok := parseTraceID(id); ok {
				if rec := s.traces[tid]; rec != nil && !seen[rec] {
					seen[rec] = true
					cands = append(cands, candidate{rec.start, rec.spans})
				}
			}
		}
		slices.SortStableFunc(cands, func(a, b candidate) int { return cmp.Compare(b.start, a.start) })
		if len(cands) > limit {
			cands = cands[:limit]
		}
	} else {
		// Newest first from the index: the search stops at limit matches.
		for n := s.byStart.first(); n != nil && len(cands) < limit; n = n.next[0] {
			if matchTrace(n.rec, &q) {
				cands = append(cands, candidate{n.rec.start, n.rec.spans})
			}
		}
	}
	for i := range cands {
		cands[i].spans = slices.Clone(cands[i].spans)
	}
	s.mu.RUnlock()
	return cands
}

func matchTrace(rec *traceRec, q *jaeger.Query) bool {
	for _, sp := range rec.spans {
		if matchSpan(sp, q) {
			return true
		}
	}
	return false
}

func matchSpan(sp *span, q *jaeger.Query) bool {
	if q.Service != "" && sp.res.service != q.Service {
		return false
	}
	if q.Operation != "" && sp.name != q.Operation {
		return false
	}
	if !q.Start.IsZero() && sp.start < q.Start.UnixNano() {
		return false
	}
	if !q.End.IsZero() && sp.start > q.End.UnixNano() {
		return false
	}
	d := sp.duration()
	if q.MinDuration > 0 && d < int64(q.MinDuration) {
		return false
	}
	if q.MaxDuration > 0 && d > int64(q.MaxDuration) {
		return false
	}
	for k, want := range q.Tags {
		if !spanHasTag(sp, k, want) {
			return false
		}
	}
	return true
}

func spanHasTag(sp *span, key, want string) bool {
	if v, ok := sp.attrs.get(key); ok {
		return v.String() == want
	}
	if v, ok := sp.res.attrs.get(key); ok {
		return v.String() == want
	}
	switch key {
	case "span.kind":
		return kindTag(sp.kind) == want
	case "error":
		return (sp.status == ptrace.StatusCodeError) == (want == "true")
	case "otel.status_code":
		return statusTag(sp.status) == want
	}
	for _, ev := range sp.events {
		if v, ok := ev.attrs.get(key); ok && v.String() == want {
			return true
		}
	}
	return false
}
