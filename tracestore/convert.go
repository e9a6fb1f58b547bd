package tracestore

import (
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// limits are the per-span caps applied while converting OTLP data (see [StoreConfig]); a
// negative value means no cap.
type limits struct {
	attrs, events, links, valueBytes int
}

func capOf(n int) int {
	if n < 0 {
		return int(^uint(0) >> 1)
	}
	return n
}

// converter turns pdata into the store's span model, applying the limits. Not safe for
// concurrent use; one per [Store.Add] call.
type converter struct {
	lim limits
	// seen holds the keys kept so far for the attribute list being built, once it is long
	// enough that a linear scan would cost more than a map (de-duplication stays O(n)).
	seen map[string]struct{}
	// counters for StoreStats
	droppedAttrs, droppedEvents, droppedLinks, truncated uint64
	// probes counts the key comparisons and map look-ups of de-duplication (for tests of
	// its cost).
	probes uint64
}

// linearScanMax is the length of a kept-attribute list up to which a duplicate key is
// looked for by scanning it; past it, a map is used.
const linearScanMax = 16

// convertLimited converts td's spans, applying lim; spans with an empty trace or span id
// are counted in the result, not returned. The converter holds the counts of what the
// limits left out.
func convertLimited(td ptrace.Traces, lim limits) ([]*span, AddResult, *converter) {
	c := &converter{lim: lim}
	var out []*span
	var res AddResult
	rss := td.ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		rs := rss.At(i)
		r := c.resource(rs.Resource())
		sss := rs.ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			ss := sss.At(j)
			var sc *scope // built on the first span kept, shared by the scope's spans
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
				if sc == nil {
					sc = c.scope(ss.Scope())
				}
				out = append(out, c.span(ps, sc, r))
			}
		}
	}
	return out, res, c
}

func (c *converter) resource(pr pcommon.Resource) *resource {
	r := &resource{service: UnknownService}
	m := pr.Attributes()
	for k, v := range m.All() {
		if v.Type() != pcommon.ValueTypeStr || v.Str() == "" {
			continue
		}
		switch k {
		case "service.name":
			r.service = c.str(v.Str())
		case "service.instance.id":
			r.instance = c.str(v.Str())
		}
	}
	var dropped uint32
	r.attrs, dropped = c.attrs(m, true)
	r.droppedAttrs = dropped + pr.DroppedAttributesCount()
	r.size = r.estimate()
	return r
}

func (c *converter) scope(ps pcommon.InstrumentationScope) *scope {
	sc := &scope{name: c.str(ps.Name()), version: c.str(ps.Version())}
	sc.size = sc.estimate()
	return sc
}

func (c *converter) span(ps ptrace.Span, sc *scope, r *resource) *span {
	truncatedBefore := c.truncated
	sp := &span{
		traceID:    ps.TraceID(),
		spanID:     ps.SpanID(),
		parentID:   ps.ParentSpanID(),
		name:       c.str(ps.Name()),
		kind:       ps.Kind(),
		start:      int64(ps.StartTimestamp()),
		end:        int64(ps.EndTimestamp()),
		flags:      ps.Flags(),
		traceState: c.str(ps.TraceState().AsRaw()),
		status:     ps.Status().Code(),
		statusMsg:  c.str(ps.Status().Message()),
		scope:      sc,
		res:        r,
	}
	var dropped uint32
	sp.attrs, dropped = c.attrs(ps.Attributes(), false)
	sp.droppedAttrs = satAdd(dropped, ps.DroppedAttributesCount())

	evs := ps.Events()
	nev := min(evs.Len(), capOf(c.lim.events))
	sp.events = make([]event, 0, nev)
	for i := 0; i < nev; i++ {
		e := evs.At(i)
		ev := event{time: int64(e.Timestamp()), name: c.str(e.Name())}
		ev.attrs, dropped = c.attrs(e.Attributes(), false)
		ev.droppedAttrs = satAdd(dropped, e.DroppedAttributesCount())
		sp.events = append(sp.events, ev)
	}
	sp.droppedEvents = satAdd(uint32(evs.Len()-nev), ps.DroppedEventsCount())
	c.droppedEvents += uint64(evs.Len() - nev)

	ls := ps.Links()
	nl := min(ls.Len(), capOf(c.lim.links))
	sp.links = make([]link, 0, nl)
	for i := 0; i < nl; i++ {
		sp.links = append(sp.links, link{traceID: ls.At(i).TraceID(), spanID: ls.At(i).SpanID()})
	}
	sp.droppedLinks = satAdd(uint32(ls.Len()-nl), ps.DroppedLinksCount())
	c.droppedLinks += uint64(ls.Len() - nl)

	sp.truncated = uint32(min(c.truncated-truncatedBefore, 1<<32-1))
	sp.size = sp.estimate()
	return sp
}

// attrs converts an attribute map, keeping the first occurrence of each key (OTLP maps may
// repeat keys; the first wins, as in pcommon.Map.Get) and at most lim.attrs entries. It
// returns how many entries were not kept: repeated keys and those over the limit. With
// isResource, string-valued service.name entries are left out (and not counted): the
// resource's service holds the first non-empty one. The cost is O(len(m)).
func (c *converter) attrs(m pcommon.Map, isResource bool) (attrs, uint32) {
	n := m.Len()
	limit := capOf(c.lim.attrs)
	if n == 0 {
		return nil, 0
	}
	out := make(attrs, 0, min(n, limit))
	clear(c.seen)
	useMap := false
	dropped := 0
	for k, v := range m.All() {
		if isResource && k == "service.name" && v.Type() == pcommon.ValueTypeStr {
			continue
		}
		if len(out) >= limit {
			dropped++
			continue
		}
		k = c.str(k)
		if c.has(out, useMap, k) {
			dropped++
			continue
		}
		out = append(out, attr{key: k, val: c.value(v)})
		switch {
		case useMap:
			c.seen[k] = struct{}{}
		case len(out) > linearScanMax:
			if c.seen == nil {
				c.seen = make(map[string]struct{}, min(n, limit))
			}
			for _, kv := range out {
				c.seen[kv.key] = struct{}{}
			}
			useMap = true
		}
	}
	c.droppedAttrs += uint64(dropped)
	if len(out) == 0 {
		out = nil
	}
	return out, uint32(min(dropped, 1<<32-1))
}

func (c *converter) has(out attrs, useMap bool, k string) bool {
	if useMap {
		c.probes++
		_, ok := c.seen[k]
		return ok
	}
	for _, kv := range out {
		c.probes++
		if kv.key == k {
			return true
		}
	}
	return false
}

func (c *converter) value(v pcommon.Value) value {
	switch v.Type() {
	case pcommon.ValueTypeStr:
		return value{t: valString, s: c.str(v.Str())}
	case pcommon.ValueTypeBool:
		return value{t: valBool, b: v.Bool()}
	case pcommon.ValueTypeInt:
		return value{t: valInt, i: v.Int()}
	case pcommon.ValueTypeDouble:
		return value{t: valDouble, f: v.Double()}
	case pcommon.ValueTypeBytes:
		raw := v.Bytes().AsRaw()
		if limit := capOf(c.lim.valueBytes); len(raw) > limit {
			raw = raw[:limit]
			c.truncated++
		}
		return value{t: valBytes, s: string(raw)}
	case pcommon.ValueTypeEmpty:
		return value{t: valString}
	default:
		return value{t: valJSON, s: c.str(v.AsString())}
	}
}

// str applies the length limit to a string: a longer one is cut at a UTF-8 boundary and
// copied, so that the stored prefix does not keep the whole original alive.
func (c *converter) str(s string) string {
	limit := capOf(c.lim.valueBytes)
	if len(s) <= limit {
		return s
	}
	c.truncated++
	n := limit
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.Clone(s[:n])
}

func satAdd(a, b uint32) uint32 {
	if s := a + b; s >= a {
		return s
	}
	return 1<<32 - 1
}
