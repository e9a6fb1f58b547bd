package tracestore

import (
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// toPdata rebuilds OTLP data from stored spans: one ResourceSpans per distinct resource,
// one ScopeSpans per instrumentation scope. Timestamps are as received; the dropped
// counts are the sender's plus what the store's limits left out.
func toPdata(spans []*span) ptrace.Traces {
	td := ptrace.NewTraces()
	type scopeKey struct {
		res           *resource
		name, version string
	}
	rsByRes := map[*resource]ptrace.ResourceSpans{}
	ssByScope := map[scopeKey]ptrace.ScopeSpans{}
	for _, sp := range spans {
		rs, ok := rsByRes[sp.res]
		if !ok {
			rs = td.ResourceSpans().AppendEmpty()
			ra := rs.Resource().Attributes()
			ra.PutStr("service.name", sp.res.service)
			putAttrs(ra, sp.res.attrs)
			rs.Resource().SetDroppedAttributesCount(sp.res.droppedAttrs)
			rsByRes[sp.res] = rs
		}
		k := scopeKey{sp.res, sp.scope.name, sp.scope.version}
		ss, ok := ssByScope[k]
		if !ok {
			ss = rs.ScopeSpans().AppendEmpty()
			ss.Scope().SetName(sp.scope.name)
			ss.Scope().SetVersion(sp.scope.version)
			ssByScope[k] = ss
		}
		ps := ss.Spans().AppendEmpty()
		ps.SetTraceID(sp.traceID)
		ps.SetSpanID(sp.spanID)
		ps.SetParentSpanID(sp.parentID)
		ps.SetName(sp.name)
		ps.SetKind(sp.kind)
		ps.SetStartTimestamp(pcommon.Timestamp(sp.start))
		ps.SetEndTimestamp(pcommon.Timestamp(sp.end))
		ps.SetFlags(sp.flags)
		ps.TraceState().FromRaw(sp.traceState)
		ps.Status().SetCode(sp.status)
		ps.Status().SetMessage(sp.statusMsg)
		putAttrs(ps.Attributes(), sp.attrs)
		ps.SetDroppedAttributesCount(sp.droppedAttrs)
		ps.SetDroppedEventsCount(sp.droppedEvents)
		ps.SetDroppedLinksCount(sp.droppedLinks)
		for _, ev := range sp.events {
			pe := ps.Events().AppendEmpty()
			pe.SetName(ev.name)
			pe.SetTimestamp(pcommon.Timestamp(ev.time))
			putAttrs(pe.Attributes(), ev.attrs)
			pe.SetDroppedAttributesCount(ev.droppedAttrs)
		}
		for _, l := range sp.links {
			pl := ps.Links().AppendEmpty()
			pl.SetTraceID(l.traceID)
			pl.SetSpanID(l.spanID)
		}
	}
	return td
}

func putAttrs(m pcommon.Map, a attrs) {
	for _, kv := range a {
		switch kv.val.t {
		case valBool:
			m.PutBool(kv.key, kv.val.b)
		case valInt:
			m.PutInt(kv.key, kv.val.i)
		case valDouble:
			m.PutDouble(kv.key, kv.val.f)
		case valBytes:
			m.PutEmptyBytes(kv.key).FromRaw([]byte(kv.val.s))
		default: // strings, and arrays/maps as their JSON text
			m.PutStr(kv.key, kv.val.s)
		}
	}
}
