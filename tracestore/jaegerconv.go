package tracestore

import (
	"cmp"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// toJaeger renders one trace's spans in the Jaeger v1 JSON model, the way Jaeger's own OTLP
// ingestion does: the span kind, status and instrumentation scope become tags (span.kind,
// otel.status_code, otel.status_description, error, otel.scope.name, otel.scope.version),
// events become logs with an "event" field, links become FOLLOWS_FROM references, and the
// resource becomes the process (service.name as serviceName, the other attributes as tags).
func toJaeger(spans []*span) jaeger.Trace {
	spans = slices.Clone(spans)
	slices.SortStableFunc(spans, func(a, b *span) int {
		return cmp.Or(cmp.Compare(a.start, b.start), strings.Compare(a.spanID.String(), b.spanID.String()))
	})
	t := jaeger.Trace{Processes: map[string]jaeger.Process{}, Spans: make([]jaeger.Span, 0, len(spans))}
	procKey := map[*resource]string{}
	procByContent := map[string]string{}
	for _, sp := range spans {
		if t.TraceID == "" {
			t.TraceID = sp.traceID.String()
		}
		pid, ok := procKey[sp.res]
		if !ok {
			content := resourceKey(sp.res)
			if pid, ok = procByContent[content]; !ok {
				pid = "p" + strconv.Itoa(len(procByContent)+1)
				procByContent[content] = pid
				t.Processes[pid] = jaeger.Process{ServiceName: sp.res.service, Tags: toTags(sp.res.attrs, nil)}
			}
			procKey[sp.res] = pid
		}
		t.Spans = append(t.Spans, toJaegerSpan(sp, pid))
	}
	return t
}

func toJaegerSpan(sp *span, pid string) jaeger.Span {
	js := jaeger.Span{
		TraceID:       sp.traceID.String(),
		SpanID:        sp.spanID.String(),
		Flags:         sp.flags & 0xff,
		OperationName: sp.name,
		References:    []jaeger.Reference{},
		StartTime:     uint64(sp.start) / 1000, // OTLP's unsigned nanoseconds, as received
		Duration:      sp.duration() / 1000,    // negative when the span ends before it starts
		ProcessID:     pid,
		Logs:          []jaeger.Log{},
	}
	if !sp.parentID.IsEmpty() {
		js.References = append(js.References, jaeger.Reference{RefType: jaeger.ChildOf, TraceID: js.TraceID, SpanID: sp.parentID.String()})
	}
	for _, l := range sp.links {
		js.References = append(js.References, jaeger.Reference{RefType: jaeger.FollowsFrom, TraceID: l.traceID.String(), SpanID: l.spanID.String()})
	}
	var extra []jaeger.KeyValue
	tag := func(key, v string) {
		if v != "" {
			extra = append(extra, jaeger.KeyValue{Key: key, Type: jaeger.TypeString, Value: v})
		}
	}
	tag("span.kind", kindTag(sp.kind))
	tag("otel.scope.name", sp.scope.name)
	tag("otel.scope.version", sp.scope.version)
	tag("otel.status_code", statusTag(sp.status))
	if sp.status == ptrace.StatusCodeError {
		extra = append(extra, jaeger.KeyValue{Key: "error", Type: jaeger.TypeBool, Value: true})
	}
	tag("otel.status_description", sp.statusMsg)
	tag("w3c.tracestate", sp.traceState)
	js.Tags = toTags(sp.attrs, extra)
	for _, ev := range sp.events {
		fields := toTags(ev.attrs, nil)
		fields = append([]jaeger.KeyValue{{Key: "event", Type: jaeger.TypeString, Value: ev.name}}, fields...)
		js.Logs = append(js.Logs, jaeger.Log{Timestamp: uint64(ev.time) / 1000, Fields: fields})
	}
	js.Warnings = spanWarnings(sp)
	return js
}

// spanWarnings flags what the span's data does not tell in full or looks wrong, as Jaeger
// does in a span's warnings: a negative duration (shown as recorded, not repaired) and what
// the sender or the store's limits left out.
func spanWarnings(sp *span) []string {
	var w []string
	if d := sp.duration(); d < 0 {
		w = append(w, fmt.Sprintf("negative duration: the span ends %s before it starts (clock trouble at the sender?)", time.Duration(-d)))
	}
	var evDropped uint64
	for _, ev := range sp.events {
		evDropped += uint64(ev.droppedAttrs)
	}
	for _, c := range []struct {
		n    uint64
		what string
	}{
		{uint64(sp.droppedAttrs), "attributes dropped (attribute limit or repeated keys)"},
		{evDropped, "event attributes dropped"},
		{uint64(sp.droppedEvents), "events dropped"},
		{uint64(sp.droppedLinks), "links dropped"},
		{uint64(sp.truncated), "values truncated to the length limit"},
	} {
		if c.n > 0 {
			w = append(w, fmt.Sprintf("%d %s", c.n, c.what))
		}
	}
	return w
}

// statusTag renders a status code as Jaeger's otel.status_code tag ("" for unset).
func statusTag(c ptrace.StatusCode) string {
	switch c {
	case ptrace.StatusCodeOk:
		return "OK"
	case ptrace.StatusCodeError:
		return "ERROR"
	}
	return ""
}

// kindTag renders a span kind as Jaeger's span.kind tag ("" for unspecified).
func kindTag(k ptrace.SpanKind) string {
	if k == ptrace.SpanKindUnspecified {
		return ""
	}
	return strings.ToLower(k.String()) // "" for an unknown kind
}

func toTags(a attrs, extra []jaeger.KeyValue) []jaeger.KeyValue {
	out := make([]jaeger.KeyValue, 0, len(a)+len(extra))
	for _, kv := range a {
		out = append(out, toTag(kv))
	}
	return append(out, extra...)
}

func toTag(kv attr) jaeger.KeyValue {
	switch kv.val.t {
	case valBool:
		return jaeger.KeyValue{Key: kv.key, Type: jaeger.TypeBool, Value: kv.val.b}
	case valInt:
		return jaeger.KeyValue{Key: kv.key, Type: jaeger.TypeInt64, Value: kv.val.i}
	case valDouble:
		return jaeger.KeyValue{Key: kv.key, Type: jaeger.TypeFloat64, Value: kv.val.f}
	case valBytes:
		return jaeger.KeyValue{Key: kv.key, Type: jaeger.TypeBinary, Value: base64.StdEncoding.EncodeToString([]byte(kv.val.s))}
	}
	return jaeger.KeyValue{Key: kv.key, Type: jaeger.TypeString, Value: kv.val.s}
}

func resourceKey(r *resource) string {
	var b strings.Builder
	b.WriteString(r.service)
	for _, kv := range r.attrs {
		b.WriteByte(0)
		b.WriteString(kv.key)
		b.WriteByte(1)
		b.WriteString(kv.val.String())
	}
	return b.String()
}
