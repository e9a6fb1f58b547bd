package jaeger

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Reference types of a span reference.
const (
	// ChildOf marks the parent of a span.
	ChildOf = "CHILD_OF"
	// FollowsFrom marks a causal predecessor that is not a parent.
	FollowsFrom = "FOLLOWS_FROM"
)

// Tag value types.
const (
	TypeString  = "string"
	TypeBool    = "bool"
	TypeInt64   = "int64"
	TypeFloat64 = "float64"
	TypeBinary  = "binary"
)

// Response is the envelope of every Jaeger query API response. Data is nil on error.
type Response[T any] struct {
	Data   T       `json:"data"`
	Total  int     `json:"total"`
	Limit  int     `json:"limit"`
	Offset int     `json:"offset"`
	Errors []Error `json:"errors"`
}

// Error is one entry of a response's errors list.
type Error struct {
	Code    int    `json:"code,omitempty"`
	Msg     string `json:"msg"`
	TraceID string `json:"traceID,omitempty"`
}

// Error implements error.
func (e Error) Error() string {
	if e.Code != 0 {
		return fmt.Sprintf("jaeger: %d: %s", e.Code, e.Msg)
	}
	return "jaeger: " + e.Msg
}

// Trace is one trace: its spans and the processes (services) that recorded them.
type Trace struct {
	TraceID   string             `json:"traceID"`
	Spans     []Span             `json:"spans"`
	Processes map[string]Process `json:"processes"`
	Warnings  []string           `json:"warnings"`
}

// Span is one span. StartTime is microseconds since the Unix epoch; Duration microseconds,
// negative when the span ends before it starts (as recorded; Jaeger's own model is
// unsigned, so a negative value only comes from this package's server). Warnings lists
// what looks wrong or incomplete in the span.
type Span struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	Flags         uint32      `json:"flags,omitempty"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	StartTime     uint64      `json:"startTime"`
	Duration      int64       `json:"duration"`
	Tags          []KeyValue  `json:"tags"`
	Logs          []Log       `json:"logs"`
	ProcessID     string      `json:"processID"`
	Warnings      []string    `json:"warnings"`
}

// ParentSpanID returns the span id of the first CHILD_OF reference in the same trace, or "".
func (s *Span) ParentSpanID() string {
	for _, r := range s.References {
		if r.RefType == ChildOf && (r.TraceID == "" || NormalizeTraceID(r.TraceID) == NormalizeTraceID(s.TraceID)) {
			return r.SpanID
		}
	}
	return ""
}

// Tag returns the tag with the given key.
func (s *Span) Tag(key string) (KeyValue, bool) {
	for _, kv := range s.Tags {
		if kv.Key == key {
			return kv, true
		}
	}
	return KeyValue{}, false
}

// Reference links a span to another span.
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// KeyValue is a typed tag. Value holds a string, bool, int64, float64 or (binary) a base64
// string when built by this package; decoded responses may hold json.Number.
type KeyValue struct {
	Key   string `json:"key"`
	Type  string `json:"type,omitempty"`
	Value any    `json:"value"`
}

// AsString renders the value as text, the way tag filters compare it.
func (kv KeyValue) AsString() string {
	switch v := kv.Value.(type) {
	case string:
		return v
	case bool:
		return strconv.FormatBool(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case int:
		return strconv.Itoa(v)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case json.Number:
		return v.String()
	case nil:
		return ""
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
}

// Log is a timestamped event on a span (an OpenTelemetry span event). Timestamp is
// microseconds since the Unix epoch.
type Log struct {
	Timestamp uint64     `json:"timestamp"`
	Fields    []KeyValue `json:"fields"`
}

// Process is the recording service and its resource tags.
type Process struct {
	ServiceName string     `json:"serviceName"`
	Tags        []KeyValue `json:"tags"`
}

// Operation is an entry of /api/operations.
type Operation struct {
	Name     string `json:"name"`
	SpanKind string `json:"spanKind"`
}

// NormalizeTraceID lower-cases a hex trace id and left-pads it with zeros to 32 digits
// (Jaeger prints 64-bit ids as 16 digits).
func NormalizeTraceID(id string) string { return normalizeID(id, 32) }

// NormalizeSpanID lower-cases a hex span id and left-pads it with zeros to 16 digits.
func NormalizeSpanID(id string) string { return normalizeID(id, 16) }

// normalizeID lower-cases the hex digits A-F of id and left-pads it with zeros to digits.
func normalizeID(id string, digits int) string {
	b := []byte(id)
	for i, c := range b {
		if 'A' <= c && c <= 'F' {
			b[i] = c + 'a' - 'A'
		}
	}
	return strings.Repeat("0", max(0, digits-len(b))) + string(b)
}
