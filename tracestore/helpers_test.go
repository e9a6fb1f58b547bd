package tracestore

import (
	"fmt"
	"math"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

// sp is a compact span description for hand-built traces: times in ms from t0.
type sp struct {
	name, parent, service string
	start, end            float64
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// build makes a one-trace ptrace.Traces from sp rows; span ids derive from names.
func build(traceKey string, rows ...sp) ptrace.Traces {
	defs := make([]tracetest.SpanDef, 0, len(rows))
	for _, r := range rows {
		svc := r.service
		if svc == "" {
			svc = tracetest.Engine
		}
		defs = append(defs, tracetest.SpanDef{Name: r.name, Service: svc, Kind: ptrace.SpanKindInternal,
			Parent: r.parent, StartMs: r.start, EndMs: r.end})
	}
	return tracetest.Build(tracetest.Request{RequestID: traceKey, Start: t0}, defs)
}

func traceIDOf(key string) string { return tracetest.TraceID(key).String() }

func spanIDOf(key, name string) string { return tracetest.SpanID(key, name).String() }

// spansOf converts ptrace data to the store's span model.
func spansOf(t *testing.T, td ptrace.Traces) []*span {
	t.Helper()
	spans, res := convertTraces(td)
	if res.Rejected != 0 {
		t.Fatalf("convertTraces rejected %d spans: %s", res.Rejected, res.Reason)
	}
	return spans
}

// convertTraces converts with the default limits.
func convertTraces(td ptrace.Traces) ([]*span, AddResult) {
	spans, res, _ := convertLimited(td, NewStore(StoreConfig{}).lim)
	return spans, res
}

func approx(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func ms(f float64) int64 { return int64(math.Round(f * 1e6)) }

// manySpans returns n single-span traces.
func manySpans(n int) ptrace.Traces {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "svc")
	ss := rs.ScopeSpans().AppendEmpty().Spans()
	for i := range n {
		s := ss.AppendEmpty()
		s.SetTraceID(tracetest.TraceID(fmt.Sprint("t", i)))
		s.SetSpanID(tracetest.SpanID(fmt.Sprint("t", i), "root"))
		s.SetName(fmt.Sprint("op", i%3))
		s.SetStartTimestamp(pcommon.NewTimestampFromTime(t0.Add(time.Duration(i) * time.Millisecond)))
		s.SetEndTimestamp(pcommon.NewTimestampFromTime(t0.Add(time.Duration(i)*time.Millisecond + time.Microsecond)))
	}
	return td
}
