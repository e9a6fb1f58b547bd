package jaeger

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultLimit is the number of traces a search returns when the query sets no limit.
const DefaultLimit = 100

// ErrBadQuery is wrapped by [ParseQuery] errors.
var ErrBadQuery = errors.New("jaeger: bad query")

// Query is a trace search: the parameters of GET /api/traces. The zero value matches every
// trace (a real Jaeger requires Service).
type Query struct {
	// Service keeps traces with a span of this service ("" = any).
	Service string
	// Operation keeps traces with a span of this name (of Service, when set).
	Operation string
	// Tags keeps traces with one span (of Service/Operation, when set) carrying every
	// key=value; values compare as text. Resource (process) tags count.
	Tags map[string]string
	// Start and End bound the span start times; zero means unbounded.
	Start, End time.Time
	// MinDuration and MaxDuration bound the matching span's duration; zero means unbounded.
	MinDuration, MaxDuration time.Duration
	// Limit caps the number of traces; 0 means [DefaultLimit].
	Limit int
	// TraceIDs, when set, fetches exactly these traces and ignores the other fields.
	TraceIDs []string
}

// Values encodes q as Jaeger query parameters (times in microseconds, tags as JSON).
func (q Query) Values() url.Values {
	v := url.Values{}
	if len(q.TraceIDs) > 0 {
		for _, id := range q.TraceIDs {
			v.Add("traceID", id)
		}
		return v
	}
	set := func(key, val string, ok bool) {
		if ok {
			v.Set(key, val)
		}
	}
	set("service", q.Service, q.Service != "")
	set("operation", q.Operation, q.Operation != "")
	if len(q.Tags) > 0 {
		b, _ := json.Marshal(q.Tags) // a map[string]string always marshals
		v.Set("tags", string(b))
	}
	set("start", strconv.FormatInt(q.Start.UnixMicro(), 10), !q.Start.IsZero())
	set("end", strconv.FormatInt(q.End.UnixMicro(), 10), !q.End.IsZero())
	set("minDuration", q.MinDuration.String(), q.MinDuration > 0)
	set("maxDuration", q.MaxDuration.String(), q.MaxDuration > 0)
	set("limit", strconv.Itoa(q.Limit), q.Limit > 0)
	return v
}

// ParseQuery decodes Jaeger query parameters: service, operation, tags (a JSON object) and
// the legacy repeated tag=key:value, start and end (microseconds), lookback ("1h", "2d",
// "custom"; used when start is absent, relative to end or now), minDuration and maxDuration
// (Go durations), limit, and repeated traceID. Errors wrap [ErrBadQuery].
func ParseQuery(v url.Values, now time.Time) (Query, error) {
	q := Query{
		Service:   v.Get("service"),
		Operation: v.Get("operation"),
		TraceIDs:  slices.Clone(v["traceID"]),
	}
	bad := func(format string, args ...any) (Query, error) {
		return Query{}, fmt.Errorf("%w: %s", ErrBadQuery, fmt.Sprintf(format, args...))
	}
	if s := v.Get("tags"); s != "" {
		var tags map[string]any
		if err := json.Unmarshal([]byte(s), &tags); err != nil {
			return bad("tags must be a JSON object: %v", err)
		}
		q.Tags = make(map[string]string, len(tags))
		for k, val := range tags {
			q.Tags[k] = KeyValue{Value: val}.AsString()
		}
	}
	for _, t := range v["tag"] {
		k, val, ok := strings.Cut(t, ":")
		if !ok {
			return bad("tag %q is not key:value", t)
		}
		if q.Tags == nil {
			q.Tags = map[string]string{}
		}
		q.Tags[k] = val
	}
	micros := func(name string) (time.Time, error) {
		s := v.Get(name)
		if s == "" {
			return time.Time{}, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return time.Time{}, fmt.Errorf("%w: %s must be microseconds since the epoch", ErrBadQuery, name)
		}
		return time.UnixMicro(n), nil
	}
	var err error
	if q.Start, err = micros("start"); err != nil {
		return Query{}, err
	}
	if q.End, err = micros("end"); err != nil {
		return Query{}, err
	}
	if lb := v.Get("lookback"); lb != "" && lb != "custom" && q.Start.IsZero() {
		d, err := ParseLookback(lb)
		if err != nil {
			return bad("lookback: %v", err)
		}
		end := q.End
		if end.IsZero() {
			end = now
		}
		q.Start = end.Add(-d)
	}
	for name, dst := range map[string]*time.Duration{"minDuration": &q.MinDuration, "maxDuration": &q.MaxDuration} {
		if s := v.Get(name); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 {
				return bad("%s %q is not a duration", name, s)
			}
			*dst = d
		}
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return bad("limit %q is not a non-negative integer", s)
		}
		q.Limit = n
	}
	for _, id := range q.TraceIDs {
		if !isHex(id, 32) {
			return bad("traceID %q is not hex", id)
		}
	}
	return q, nil
}

// ParseLookback parses a Go duration or a number of days ("2d").
func ParseLookback(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a number of days", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration", s)
	}
	return d, nil
}

func isHex(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// IsTraceID reports whether s is a hex trace id of 1 to 32 digits.
func IsTraceID(s string) bool { return isHex(s, 32) }
