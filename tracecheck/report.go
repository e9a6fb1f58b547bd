package tracecheck

import (
	"fmt"
	"io"
	"strings"
)

// Rule names a check.
type Rule string

// The rules of [CheckWith].
const (
	RuleOneTraceID  Rule = "one-trace-id"
	RuleRoot        Rule = "root"
	RuleMissing     Rule = "required-span"
	RuleRepeated    Rule = "repeated-span"
	RuleWrongTrace  Rule = "wrong-trace"
	RuleService     Rule = "service"
	RuleKind        Rule = "kind"
	RuleParent      Rule = "parent"
	RuleAttrMissing Rule = "attribute-missing"
	RuleAttrType    Rule = "attribute-type"
	RuleInterval    Rule = "interval"
	RuleHitRate     Rule = "hit-rate"
)

// Violation is one broken rule.
type Violation struct {
	Rule Rule
	// Span and Service name the span concerned ("" for a trace-wide problem); SpanID is
	// set when one recorded span is meant.
	Span, SpanID, Service string
	Message               string
}

// String renders "rule: span [service] (span id): message".
func (v Violation) String() string {
	var b strings.Builder
	b.WriteString(string(v.Rule))
	b.WriteString(": ")
	if v.Span != "" {
		b.WriteString(v.Span)
		if v.Service != "" {
			fmt.Fprintf(&b, " [%s]", v.Service)
		}
		if v.SpanID != "" {
			fmt.Fprintf(&b, " (span %s)", v.SpanID)
		}
		b.WriteString(": ")
	}
	b.WriteString(v.Message)
	return b.String()
}

// TraceResult is the verdict on one trace.
type TraceResult struct {
	TraceID   string
	RequestID string
	// Kind is the contract trace the trace was checked as (request or ingest); "" when
	// skipped.
	Kind string
	// Root is the root span's name.
	Root  string
	Spans int
	// Skipped is true for a trace without any span of the contract.
	Skipped    bool
	Violations []Violation
	// Notes are remarks that are not violations.
	Notes []string
}

func (r *TraceResult) add(v Violation) { r.Violations = append(r.Violations, v) }

// OK reports whether the trace has no violation.
func (r *TraceResult) OK() bool { return len(r.Violations) == 0 }

// Report is the result of a check.
type Report struct {
	Traces []TraceResult
}

// OK reports whether at least one trace was checked and no trace has a violation: the
// exit status of `cb check`.
func (r Report) OK() bool {
	checked := 0
	for i := range r.Traces {
		if !r.Traces[i].OK() {
			return false
		}
		if !r.Traces[i].Skipped {
			checked++
		}
	}
	return checked > 0
}

// Counts returns the number of traces that passed, failed and were skipped.
func (r Report) Counts() (passed, failed, skipped int) {
	for i := range r.Traces {
		switch t := &r.Traces[i]; {
		case !t.OK():
			failed++
		case t.Skipped:
			skipped++
		default:
			passed++
		}
	}
	return passed, failed, skipped
}

// String renders the report as text (see [Report.WriteTo]).
func (r Report) String() string {
	var b strings.Builder
	_, _ = r.WriteTo(&b)
	return b.String()
}

// WriteTo writes a readable report: a summary line, then one line per trace (PASS, FAIL
// or SKIP with its trace id, request id, root and span count), each violation and note
// indented under its trace.
func (r Report) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	passed, failed, skipped := r.Counts()
	fmt.Fprintf(cw, "%d trace(s): %d passed, %d failed", len(r.Traces), passed, failed)
	if skipped > 0 {
		fmt.Fprintf(cw, ", %d skipped", skipped)
	}
	verdict := "OK"
	if !r.OK() {
		verdict = "NOT OK"
		if passed+failed == 0 {
			verdict += " (no trace of the contract to check)"
		}
	}
	fmt.Fprintf(cw, " — %s\n", verdict)
	for i := range r.Traces {
		t := &r.Traces[i]
		status := "PASS"
		switch {
		case !t.OK():
			status = "FAIL"
		case t.Skipped:
			status = "SKIP"
		}
		rid := t.RequestID
		if rid == "" {
			rid = "-"
		}
		kind := t.Kind
		if kind == "" {
			kind = "-"
		}
		fmt.Fprintf(cw, "\n%s  trace %s  request %s  %s trace  root %q  %d spans\n", status, t.TraceID, rid, kind, t.Root, t.Spans)
		for _, v := range t.Violations {
			fmt.Fprintf(cw, "      ✗ %s\n", v)
		}
		for _, n := range t.Notes {
			fmt.Fprintf(cw, "      · %s\n", n)
		}
	}
	return cw.n, cw.err
}

type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return len(p), nil
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return len(p), nil
}
