package tracecheck

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/tracestore"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
)

// ErrFormat is wrapped by the errors of the parsers for input that is not traces.
var ErrFormat = errors.New("tracecheck: unrecognized trace data")

// FromPtrace converts OTLP data to traces, grouped by trace id. Traces are ordered by
// their earliest span, spans by start time (then span id).
func FromPtrace(tds ...ptrace.Traces) []Trace {
	var all []Span
	for _, td := range tds {
		rss := td.ResourceSpans()
		for i := 0; i < rss.Len(); i++ {
			rs := rss.At(i)
			service := tracestore.UnknownService
			if v, ok := rs.Resource().Attributes().Get("service.name"); ok && v.Type() == pcommon.ValueTypeStr && v.Str() != "" {
				service = v.Str()
			}
			sss := rs.ScopeSpans()
			for j := 0; j < sss.Len(); j++ {
				spans := sss.At(j).Spans()
				for k := 0; k < spans.Len(); k++ {
					all = append(all, fromPSpan(spans.At(k), service))
				}
			}
		}
	}
	return groupByTrace(all)
}

// groupByTrace groups spans into traces (in the order their trace ids first
// appear) and sorts each trace's spans.
func groupByTrace(spans []Span) []Trace {
	byID := map[string]int{}
	var out []Trace
	for _, sp := range spans {
		i, ok := byID[sp.TraceID]
		if !ok {
			i = len(out)
			byID[sp.TraceID] = i
			out = append(out, Trace{TraceID: sp.TraceID})
		}
		out[i].Spans = append(out[i].Spans, sp)
	}
	sortTraces(out)
	return out
}

func sortTraces(ts []Trace) {
	for i := range ts {
		slices.SortStableFunc(ts[i].Spans, func(a, b Span) int {
			return cmp.Or(a.Start.Compare(b.Start), strings.Compare(a.SpanID, b.SpanID))
		})
	}
	slices.SortStableFunc(ts, func(a, b Trace) int {
		var sa, sb time.Time
		if len(a.Spans) > 0 {
			sa = a.Spans[0].Start
		}
		if len(b.Spans) > 0 {
			sb = b.Spans[0].Start
		}
		return cmp.Or(sa.Compare(sb), strings.Compare(a.TraceID, b.TraceID))
	})
}

func fromPSpan(ps ptrace.Span, service string) Span {
	tid, sid, pid := ps.TraceID(), ps.SpanID(), ps.ParentSpanID()
	sp := Span{
		TraceID:       hex.EncodeToString(tid[:]),
		SpanID:        hex.EncodeToString(sid[:]),
		Name:          ps.Name(),
		Service:       service,
		Kind:          kindOf(ps.Kind()),
		Start:         ps.StartTimestamp().AsTime(),
		End:           ps.EndTimestamp().AsTime(),
		Attributes:    fromPMap(ps.Attributes()),
		Error:         ps.Status().Code() == ptrace.StatusCodeError,
		StatusMessage: ps.Status().Message(),
		TraceState:    ps.TraceState().AsRaw(),
	}
	if !pid.IsEmpty() {
		sp.ParentSpanID = hex.EncodeToString(pid[:])
	}
	evs := ps.Events()
	for i := 0; i < evs.Len(); i++ {
		e := evs.At(i)
		sp.Events = append(sp.Events, Event{Name: e.Name(), Time: e.Timestamp().AsTime(), Attributes: fromPMap(e.Attributes())})
	}
	return sp
}

// spanKinds pairs the span kinds of the contract with OTLP's.
var spanKinds = []struct {
	c contract.SpanKind
	p ptrace.SpanKind
}{
	{contract.KindServer, ptrace.SpanKindServer}, {contract.KindClient, ptrace.SpanKindClient},
	{contract.KindInternal, ptrace.SpanKindInternal}, {"producer", ptrace.SpanKindProducer},
	{"consumer", ptrace.SpanKindConsumer},
}

func kindOf(k ptrace.SpanKind) contract.SpanKind {
	for _, x := range spanKinds {
		if x.p == k {
			return x.c
		}
	}
	return ""
}

func pKind(k contract.SpanKind) ptrace.SpanKind {
	for _, x := range spanKinds {
		if x.c == k {
			return x.p
		}
	}
	return ptrace.SpanKindUnspecified
}

func fromPMap(m pcommon.Map) map[string]Value {
	if m.Len() == 0 {
		return nil
	}
	out := make(map[string]Value, m.Len())
	for k, v := range m.All() {
		if _, dup := out[k]; dup {
			continue // the first wins, as in pcommon.Map.Get
		}
		switch v.Type() {
		case pcommon.ValueTypeStr:
			out[k] = Str(v.Str())
		case pcommon.ValueTypeInt:
			out[k] = Int(v.Int())
		case pcommon.ValueTypeDouble:
			out[k] = Double(v.Double())
		case pcommon.ValueTypeBool:
			out[k] = Bool(v.Bool())
		case pcommon.ValueTypeBytes:
			out[k] = bytesValue(v.Bytes().AsRaw())
		default:
			out[k] = Value{Type: ValueOther, Str: v.AsString()}
		}
	}
	return out
}

// ToPtrace converts traces back to OTLP data: one ResourceSpans per service. Span ids that
// are not valid hex become zero ids; ValueOther attributes (arrays, maps) become their JSON
// text.
func ToPtrace(traces ...Trace) ptrace.Traces {
	td := ptrace.NewTraces()
	bySvc := map[string]ptrace.SpanSlice{}
	for _, t := range traces {
		for _, sp := range t.Spans {
			ss, ok := bySvc[sp.Service]
			if !ok {
				rs := td.ResourceSpans().AppendEmpty()
				rs.Resource().Attributes().PutStr("service.name", sp.Service)
				ss = rs.ScopeSpans().AppendEmpty().Spans()
				bySvc[sp.Service] = ss
			}
			ps := ss.AppendEmpty()
			var tid pcommon.TraceID
			var sid, pid pcommon.SpanID
			decodeHex(tid[:], sp.TraceID)
			decodeHex(sid[:], sp.SpanID)
			decodeHex(pid[:], sp.ParentSpanID)
			ps.SetTraceID(tid)
			ps.SetSpanID(sid)
			ps.SetParentSpanID(pid)
			ps.SetName(sp.Name)
			ps.SetKind(pKind(sp.Kind))
			ps.SetStartTimestamp(pcommon.NewTimestampFromTime(sp.Start))
			ps.SetEndTimestamp(pcommon.NewTimestampFromTime(sp.End))
			if sp.Error {
				ps.Status().SetCode(ptrace.StatusCodeError)
			}
			ps.Status().SetMessage(sp.StatusMessage)
			ps.TraceState().FromRaw(sp.TraceState)
			toPMap(ps.Attributes(), sp.Attributes)
			for _, ev := range sp.Events {
				pe := ps.Events().AppendEmpty()
				pe.SetName(ev.Name)
				pe.SetTimestamp(pcommon.NewTimestampFromTime(ev.Time))
				toPMap(pe.Attributes(), ev.Attributes)
			}
		}
	}
	return td
}

// decodeHex decodes s into dst when it is exactly len(dst) bytes of hex, else leaves dst zero.
func decodeHex(dst []byte, s string) {
	if b, err := hex.DecodeString(s); err == nil && len(b) == len(dst) {
		copy(dst, b)
	}
}

func toPMap(m pcommon.Map, attrs map[string]Value) {
	for _, k := range slices.Sorted(maps.Keys(attrs)) {
		v := attrs[k]
		switch v.Type {
		case ValueInt:
			m.PutInt(k, v.Int)
		case ValueDouble:
			m.PutDouble(k, v.Double)
		case ValueBool:
			m.PutBool(k, v.Bool)
		case ValueBytes:
			m.PutEmptyBytes(k).FromRaw([]byte(v.Str))
		default:
			m.PutStr(k, v.Str)
		}
	}
}

// ParseOTLPJSON parses OTLP/JSON trace data: one ExportTraceServiceRequest document
// ({"resourceSpans": […]}), or one per line as the OpenTelemetry Collector's file exporter
// writes them. Errors wrap [ErrFormat].
func ParseOTLPJSON(data []byte) ([]Trace, error) {
	u := &ptrace.JSONUnmarshaler{}
	if td, err := u.UnmarshalTraces(data); err == nil && isOTLPJSON(data) {
		return FromPtrace(td), nil
	}
	var tds []ptrace.Traces
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 256<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if !isOTLPJSON(b) {
			return nil, fmt.Errorf("%w: line %d is not OTLP/JSON (no resourceSpans)", ErrFormat, line)
		}
		td, err := u.UnmarshalTraces(b)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrFormat, line, err)
		}
		tds = append(tds, td)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	if len(tds) == 0 {
		return nil, fmt.Errorf("%w: no OTLP/JSON documents", ErrFormat)
	}
	return FromPtrace(tds...), nil
}

// isOTLPJSON reports whether a JSON document is an object with a resourceSpans key (the
// pdata decoder accepts any object, ignoring unknown keys).
func isOTLPJSON(b []byte) bool {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return false
	}
	_, ok := probe["resourceSpans"]
	if !ok {
		_, ok = probe["resource_spans"]
	}
	return ok
}

// ParseJaegerJSON parses traces saved from a Jaeger query API or UI ({"data": […]}, an
// array of traces, or one trace). Errors wrap [ErrFormat].
func ParseJaegerJSON(data []byte) ([]Trace, error) {
	jts, err := jaeger.DecodeTraces(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	return FromJaeger(jts...)
}

// Parse reads a trace file in either format: OTLP/JSON (one document or one per line) or
// Jaeger JSON. Errors wrap [ErrFormat].
func Parse(data []byte) ([]Trace, error) {
	if bytes.Contains(data, []byte(`"resourceSpans"`)) || bytes.Contains(data, []byte(`"resource_spans"`)) {
		return ParseOTLPJSON(data)
	}
	return ParseJaegerJSON(data)
}

// Tags that Jaeger's OTLP ingestion (and the embedded collector) add for fields of the
// span that are not attributes; FromJaeger turns them back into fields.
var jaegerSyntheticTags = map[string]bool{
	"span.kind": true, "otel.status_code": true, "otel.status_description": true,
	"otel.scope.name": true, "otel.scope.version": true, "otel.library.name": true,
	"otel.library.version": true, "w3c.tracestate": true, "internal.span.format": true,
}

// FromJaeger converts traces of the Jaeger model. Times have the microsecond precision of
// that model (each trace's Precision says so). The tags span.kind, otel.status_code,
// otel.status_description, w3c.tracestate (TraceState), otel.scope.*, internal.span.format
// and a boolean error tag become span fields, not attributes; logs become events (the
// "event" field naming them).
func FromJaeger(jts ...jaeger.Trace) ([]Trace, error) {
	var all []Span
	for ti := range jts {
		jt := &jts[ti]
		for si := range jt.Spans {
			js := &jt.Spans[si]
			sp, err := fromJaegerSpan(jt, js)
			if err != nil {
				return nil, fmt.Errorf("tracecheck: trace %s span %s: %w", jt.TraceID, js.SpanID, err)
			}
			all = append(all, sp)
		}
	}
	out := groupByTrace(all)
	for i := range out {
		out[i].Precision = time.Microsecond
	}
	return out, nil
}

func fromJaegerSpan(jt *jaeger.Trace, js *jaeger.Span) (Span, error) {
	tid := js.TraceID
	if tid == "" {
		tid = jt.TraceID
	}
	start := time.UnixMicro(int64(js.StartTime)).UTC()
	sp := Span{
		TraceID:    jaeger.NormalizeTraceID(tid),
		SpanID:     jaeger.NormalizeSpanID(js.SpanID),
		Name:       js.OperationName,
		Service:    tracestore.UnknownService,
		Start:      start,
		End:        start.Add(time.Duration(js.Duration) * time.Microsecond),
		Attributes: map[string]Value{},
	}
	if p := js.ParentSpanID(); p != "" {
		sp.ParentSpanID = jaeger.NormalizeSpanID(p)
	}
	if proc, ok := jt.Processes[js.ProcessID]; ok && proc.ServiceName != "" {
		sp.Service = proc.ServiceName
	}
	for _, kv := range js.Tags {
		switch kv.Key {
		case "span.kind":
			sp.Kind = contract.SpanKind(strings.ToLower(kv.AsString()))
			continue
		case "otel.status_code":
			sp.Error = sp.Error || strings.EqualFold(kv.AsString(), "ERROR")
			continue
		case "otel.status_description":
			sp.StatusMessage = kv.AsString()
			continue
		case "w3c.tracestate":
			sp.TraceState = kv.AsString()
			continue
		case "error":
			if b, ok := kv.Value.(bool); ok || kv.Type == jaeger.TypeBool {
				sp.Error = sp.Error || b || kv.AsString() == "true"
				continue
			}
		}
		if jaegerSyntheticTags[kv.Key] {
			continue
		}
		v, err := jaegerValue(kv)
		if err != nil {
			return Span{}, fmt.Errorf("tag %q: %w", kv.Key, err)
		}
		if _, dup := sp.Attributes[kv.Key]; !dup {
			sp.Attributes[kv.Key] = v
		}
	}
	if len(sp.Attributes) == 0 {
		sp.Attributes = nil
	}
	for _, l := range js.Logs {
		ev := Event{Time: time.UnixMicro(int64(l.Timestamp)).UTC()}
		for _, f := range l.Fields {
			if f.Key == "event" && ev.Name == "" {
				ev.Name = f.AsString()
				continue
			}
			v, err := jaegerValue(f)
			if err != nil {
				return Span{}, fmt.Errorf("log field %q: %w", f.Key, err)
			}
			if ev.Attributes == nil {
				ev.Attributes = map[string]Value{}
			}
			ev.Attributes[f.Key] = v
		}
		sp.Events = append(sp.Events, ev)
	}
	return sp, nil
}

func jaegerValue(kv jaeger.KeyValue) (Value, error) {
	switch kv.Type {
	case jaeger.TypeInt64:
		switch x := kv.Value.(type) {
		case json.Number:
			i, err := x.Int64()
			return Int(i), err
		case int64:
			return Int(x), nil
		case int:
			return Int(int64(x)), nil
		case float64:
			if x != math.Trunc(x) {
				return Value{}, fmt.Errorf("int64 tag with value %v", x)
			}
			return Int(int64(x)), nil
		case string:
			i, err := strconv.ParseInt(x, 10, 64)
			return Int(i), err
		}
		return Value{}, fmt.Errorf("int64 tag with a %T value", kv.Value)
	case jaeger.TypeFloat64:
		switch x := kv.Value.(type) {
		case json.Number:
			f, err := x.Float64()
			return Double(f), err
		case float64:
			return Double(x), nil
		case int64:
			return Double(float64(x)), nil
		case string:
			f, err := strconv.ParseFloat(x, 64)
			return Double(f), err
		}
		return Value{}, fmt.Errorf("float64 tag with a %T value", kv.Value)
	case jaeger.TypeBool:
		switch x := kv.Value.(type) {
		case bool:
			return Bool(x), nil
		case string:
			b, err := strconv.ParseBool(x)
			return Bool(b), err
		}
		return Value{}, fmt.Errorf("bool tag with a %T value", kv.Value)
	case jaeger.TypeBinary:
		s, _ := kv.Value.(string)
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return Value{}, fmt.Errorf("binary tag: %w", err)
		}
		return bytesValue(b), nil
	}
	return Str(kv.AsString()), nil
}

// FromQuery searches a Jaeger-compatible query API (a real Jaeger or the embedded
// collector) and converts the traces found.
func FromQuery(ctx context.Context, c *jaeger.Client, q jaeger.Query) ([]Trace, error) {
	jts, err := c.FindTraces(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("tracecheck: query: %w", err)
	}
	return FromJaeger(jts...)
}

// FromStore searches the embedded collector's store in process, with full precision.
func FromStore(s *tracestore.Store, q jaeger.Query) []Trace {
	return FromPtrace(s.FindPTraces(q)...)
}
