package tracecheck

import (
	"encoding/base64"
	"strconv"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
)

// ValueType is the type of an attribute value.
type ValueType uint8

// Value types. ValueOther holds arrays and maps, rendered as JSON in Str.
const (
	ValueString ValueType = iota
	ValueInt
	ValueDouble
	ValueBool
	ValueBytes
	ValueOther
)

// String names the type as the contract does (string, int, double, bool) or bytes/other.
func (t ValueType) String() string {
	switch t {
	case ValueString:
		return string(contract.AttrString)
	case ValueInt:
		return string(contract.AttrInt)
	case ValueDouble:
		return string(contract.AttrDouble)
	case ValueBool:
		return string(contract.AttrBool)
	case ValueBytes:
		return "bytes"
	}
	return "other"
}

// Value is a typed attribute value. Only the field of its Type is meaningful; ValueBytes
// keeps the raw bytes in Str.
type Value struct {
	Type   ValueType
	Str    string
	Int    int64
	Double float64
	Bool   bool
}

// Str returns a string value.
func Str(s string) Value { return Value{Type: ValueString, Str: s} }

// Int returns an int value.
func Int(i int64) Value { return Value{Type: ValueInt, Int: i} }

// Double returns a double value.
func Double(f float64) Value { return Value{Type: ValueDouble, Double: f} }

// Bool returns a bool value.
func Bool(b bool) Value { return Value{Type: ValueBool, Bool: b} }

func bytesValue(b []byte) Value { return Value{Type: ValueBytes, Str: string(b)} }

// Number returns an int or double value as float64.
func (v Value) Number() (float64, bool) {
	switch v.Type {
	case ValueInt:
		return float64(v.Int), true
	case ValueDouble:
		return v.Double, true
	}
	return 0, false
}

// String renders the value as text.
func (v Value) String() string {
	switch v.Type {
	case ValueInt:
		return strconv.FormatInt(v.Int, 10)
	case ValueDouble:
		return strconv.FormatFloat(v.Double, 'g', -1, 64)
	case ValueBool:
		return strconv.FormatBool(v.Bool)
	case ValueBytes:
		return base64.StdEncoding.EncodeToString([]byte(v.Str))
	}
	return v.Str
}

// Event is a timestamped span event.
type Event struct {
	Name       string
	Time       time.Time
	Attributes map[string]Value
}

// Span is one span in a backend-neutral form.
type Span struct {
	// TraceID, SpanID and ParentSpanID are lower-case hex (32, 16 and 16 digits);
	// ParentSpanID is "" for a span without a parent.
	TraceID, SpanID, ParentSpanID string
	Name                          string
	// Service is the resource's service.name.
	Service string
	// Kind is server, client, internal, producer or consumer; "" when unknown.
	Kind       contract.SpanKind
	Start, End time.Time
	Attributes map[string]Value
	Events     []Event
	// Error is true when the span's status is ERROR; StatusMessage is its description.
	Error         bool
	StatusMessage string
	// TraceState is the span context's W3C tracestate ("" when empty).
	TraceState string
}

// Duration is End - Start.
func (s *Span) Duration() time.Duration { return s.End.Sub(s.Start) }

// Trace is the spans of one trace id.
type Trace struct {
	TraceID string
	Spans   []Span
	// Precision is the resolution the times were recorded in: 0 for nanoseconds (OTLP), a
	// microsecond for traces read through the Jaeger model, whose start times and durations
	// are each truncated to whole microseconds (so an end may read up to two microseconds
	// early, and [CheckWith] allows that much rounding on end comparisons).
	Precision time.Duration
}

// RequestID returns the request_id of the trace: cb.request's, else the first span's that
// has one; "" if none.
func (t *Trace) RequestID() string {
	first := ""
	for i := range t.Spans {
		v, ok := t.Spans[i].Attributes["request_id"]
		if !ok || v.Type != ValueString || v.Str == "" {
			continue
		}
		if t.Spans[i].Name == spanname.CBRequest {
			return v.Str
		}
		if first == "" {
			first = v.Str
		}
	}
	return first
}
