package tracestore

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

// shape describes a synthetic trace: spans spans, each with attrs attributes whose values
// are valueLen bytes long; with resourcePerSpan every span has its own resource and service.
type shape struct {
	spans, attrs, valueLen int
	resourcePerSpan        bool
}

// bigTrace builds one trace of the given shape with trace id tid.
func bigTrace(tid pcommon.TraceID, sh shape) ptrace.Traces {
	td := ptrace.NewTraces()
	value := strings.Repeat("v", sh.valueLen)
	var ss ptrace.SpanSlice
	newResource := func(i int) {
		rs := td.ResourceSpans().AppendEmpty()
		rs.Resource().Attributes().PutStr("service.name", fmt.Sprint("svc-", i))
		ss = rs.ScopeSpans().AppendEmpty().Spans()
	}
	newResource(0)
	t0ns := pcommon.NewTimestampFromTime(t0)
	for i := range sh.spans {
		if sh.resourcePerSpan && i > 0 {
			newResource(i)
		}
		s := ss.AppendEmpty()
		s.SetTraceID(tid)
		var sid pcommon.SpanID
		sid[0], sid[1], sid[2], sid[3] = 1, byte(i>>16), byte(i>>8), byte(i)
		s.SetSpanID(sid)
		if i > 0 {
			s.SetParentSpanID(pcommon.SpanID{1})
		}
		s.SetName(fmt.Sprint("op-", i%7))
		s.SetStartTimestamp(t0ns + pcommon.Timestamp(i)*1000)
		s.SetEndTimestamp(t0ns + pcommon.Timestamp(i)*1000 + 500)
		m := s.Attributes()
		m.EnsureCapacity(sh.attrs)
		for a := range sh.attrs {
			m.PutStr(fmt.Sprint("attr.", a), value)
		}
	}
	return td
}

// randomTraceID returns a trace id unlikely to occur by chance inside an encoded body.
func randomTraceID(t testing.TB) pcommon.TraceID {
	var id pcommon.TraceID
	if _, err := rand.Read(id[:]); err != nil {
		t.Fatal(err)
	}
	return id
}

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestFloodStaysWithinByteBudget posts 15 MB traces (each post a new trace) to a running
// collector over HTTP: the store keeps within its byte budget after every post, evicts
// and counts, and the process heap grows by about the budget, not by what was posted.
func TestFloodStaysWithinByteBudget(t *testing.T) {
	const budget = 64 << 20
	const postBytes = 15 << 20
	tests := []struct {
		name     string
		sh       shape
		encoding string // "protobuf", "gzip", "json"
		posts    int
	}{
		{"protobuf, 1 KB spans", shape{attrs: 8, valueLen: 100}, "protobuf", 60},
		{"gzip protobuf, 100 KB values cut to 64 KiB", shape{attrs: 150, valueLen: 100 << 10}, "gzip", 12},
		{"json, a resource per span", shape{attrs: 4, valueLen: 100, resourcePerSpan: true}, "json", 12},
	}
	if testing.Short() || raceEnabled {
		for i := range tests {
			tests[i].posts = min(tests[i].posts, 10)
		}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Size the shape to ~15 MB in its encoding.
			marshal := (&ptrace.ProtoMarshaler{}).MarshalTraces
			if tc.encoding == "json" {
				marshal = (&ptrace.JSONMarshaler{}).MarshalTraces
			}
			probe := tc.sh
			probe.spans = 100
			hundred, err := marshal(bigTrace(pcommon.TraceID{1}, probe))
			if err != nil {
				t.Fatal(err)
			}
			tc.sh.spans = max(1, postBytes*100/len(hundred))
			template := randomTraceID(t)
			td := bigTrace(template, tc.sh)
			ct := ContentTypeProtobuf
			if tc.encoding == "json" {
				ct = ContentTypeJSON
			}
			body, err := marshal(td)
			if err != nil {
				t.Fatal(err)
			}
			td = ptrace.Traces{}
			old := template[:]
			if tc.encoding == "json" {
				old = []byte(template.String())
			}

			c := startCollector(t, Config{MaxBytes: budget})
			url := "http://" + c.OTLPAddr() + "/v1/traces"
			before := heapInUse()
			for i := range tc.posts {
				id := randomTraceID(t)
				repl := id[:]
				if tc.encoding == "json" {
					repl = []byte(id.String())
				}
				b := bytes.ReplaceAll(body, old, repl)
				if tc.encoding == "gzip" {
					var buf bytes.Buffer
					zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
					zw.Write(b)
					zw.Close()
					b = buf.Bytes()
				}
				req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", ct)
				if tc.encoding == "gzip" {
					req.Header.Set("Content-Encoding", "gzip")
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("post %d: status %d", i, resp.StatusCode)
				}
				if st := c.Store().Stats(); st.Bytes > budget || st.MaxBytes != budget {
					t.Fatalf("post %d: store holds %d bytes, budget %d", i, st.Bytes, st.MaxBytes)
				}
			}
			bodyLen := len(body)
			body = nil
			after := heapInUse()
			st := c.Store().Stats()
			growth := int64(after) - int64(before)
			t.Logf("%d posts of %.1f MB (%d spans each): store %d traces, %d spans, %.1f MiB estimated of %d MiB; evicted %d traces, %d spans, %.1f MiB; rejected %d spans; dropped %d attributes; truncated %d values; heap growth %.1f MiB",
				tc.posts, float64(bodyLen)/1e6, tc.sh.spans, st.Traces, st.Spans, float64(st.Bytes)/(1<<20), budget>>20,
				st.EvictedTraces, st.EvictedSpans, float64(st.EvictedBytes)/(1<<20), st.RejectedSpans, st.DroppedAttributes,
				st.TruncatedValues, float64(growth)/(1<<20))
			if st.EvictedTraces == 0 || st.EvictedBytes == 0 || st.EvictedSpans == 0 {
				t.Fatalf("no eviction counted after %d posts: %+v", tc.posts, st)
			}
			if st.Traces+int(st.EvictedTraces)+int(st.TruncatedTraces) < tc.posts {
				t.Fatalf("traces unaccounted for: %+v", st)
			}
			// The live heap holds the store (at most the budget, the estimate being on the
			// high side) plus the collector's own buffers: allow 32 MiB on top.
			if limit := int64(budget + 32<<20); growth > limit {
				t.Fatalf("heap grew by %d MiB, more than the budget (%d MiB) + 32 MiB", growth>>20, budget>>20)
			}
		})
	}
}

// TestByteEstimateCoversHeap checks the estimate against the heap a store really keeps:
// never below it (the budget must hold), and not wildly above (it would waste the budget).
func TestByteEstimateCoversHeap(t *testing.T) {
	tests := []struct {
		name   string
		sh     shape
		traces int
	}{
		{"small spans", shape{spans: 2000, attrs: 8, valueLen: 20}, 10},
		{"bare spans", shape{spans: 5000}, 10},
		{"large values", shape{spans: 50, attrs: 20, valueLen: 4000}, 10},
		{"a resource per span", shape{spans: 2000, attrs: 2, valueLen: 10, resourcePerSpan: true}, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(StoreConfig{})
			// One throwaway trace first, so that the maps and lists exist.
			s.Add(bigTrace(randomTraceID(t), shape{spans: 1}))
			base := s.Stats().Bytes
			// Encoded bodies, decoded after the first measure: the store keeps the strings
			// pdata decodes (it does not copy them), each its own allocation as on the wire.
			bodies := make([][]byte, tc.traces)
			for i := range bodies {
				b, err := (&ptrace.ProtoMarshaler{}).MarshalTraces(bigTrace(randomTraceID(t), tc.sh))
				if err != nil {
					t.Fatal(err)
				}
				bodies[i] = b
			}
			before := heapInUse()
			for _, b := range bodies {
				td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(b)
				if err != nil {
					t.Fatal(err)
				}
				s.Add(td)
			}
			after := heapInUse()
			runtime.KeepAlive(bodies)
			st := s.Stats()
			est, real := st.Bytes-base, int64(after)-int64(before)
			t.Logf("%d spans: estimate %d bytes, heap %d bytes (ratio %.2f)", st.Spans, est, real, float64(est)/float64(real))
			if est < real {
				t.Fatalf("estimate %d < heap %d: the budget would not hold", est, real)
			}
			if est > 3*real {
				t.Fatalf("estimate %d > 3 × heap %d", est, real)
			}
			runtime.KeepAlive(s)
		})
	}
}

// TestSingleTraceOverBudget: one trace larger than the budget keeps what fits, the rest of
// its spans are rejected and counted, the trace is marked truncated, and the store never
// exceeds its budget; older traces are evicted first.
func TestSingleTraceOverBudget(t *testing.T) {
	const budget = 4 << 20
	s := NewStore(StoreConfig{MaxBytes: budget})
	s.Add(tracetest.Request{RequestID: "small"}.Traces())
	tid := randomTraceID(t)
	td := bigTrace(tid, shape{spans: 20000, attrs: 4, valueLen: 50})
	res := s.Add(td)
	st := s.Stats()
	if st.Bytes > budget {
		t.Fatalf("store holds %d bytes > budget %d", st.Bytes, budget)
	}
	if res.Accepted == 0 || res.Rejected == 0 || res.Accepted+res.Rejected != 20000 || !strings.Contains(res.Reason, "memory budget") {
		t.Fatalf("Add = %+v", res)
	}
	if st.TruncatedTraces != 1 || st.RejectedSpans != uint64(res.Rejected) || st.RejectedBytes == 0 {
		t.Fatalf("stats = %+v", st)
	}
	if st.EvictedTraces != 1 || st.Traces != 1 {
		t.Fatalf("the older trace should have been evicted to make room: %+v", st)
	}
	row, ok := s.Request(tid.String())
	if !ok || !row.Truncated || row.NSpans != res.Accepted {
		t.Fatalf("summary = %+v", row)
	}
	// More of the same trace: still rejected, counted once as truncated.
	s.Add(td)
	if st2 := s.Stats(); st2.TruncatedTraces != 1 || st2.Bytes > budget {
		t.Fatalf("after re-adding: %+v", st2)
	}
}

// TestSpanLimits checks the per-span caps and what they count.
func TestSpanLimits(t *testing.T) {
	mk := func(f func(ps ptrace.Span, res pcommon.Resource)) ptrace.Traces {
		td := ptrace.NewTraces()
		rs := td.ResourceSpans().AppendEmpty()
		rs.Resource().Attributes().PutStr("service.name", "svc")
		ps := rs.ScopeSpans().AppendEmpty().Spans().AppendEmpty()
		ps.SetTraceID(tracetest.TraceID("lim"))
		ps.SetSpanID(tracetest.SpanID("lim", "a"))
		ps.SetName("a")
		f(ps, rs.Resource())
		return td
	}
	cfg := StoreConfig{MaxAttributes: 3, MaxEvents: 2, MaxLinks: 1, MaxAttributeValueBytes: 8}
	tests := []struct {
		name  string
		td    ptrace.Traces
		check func(t *testing.T, sp *span, st StoreStats)
	}{
		{"attributes over the count, repeated keys, sender's drops", withAttrs(t, "lim", 5, "a", "a", "b", "c", "d", "e"), func(t *testing.T, sp *span, st StoreStats) {
			if len(sp.attrs) != 3 || sp.attrs[0].key != "a" || sp.attrs[1].key != "b" || sp.attrs[2].key != "c" {
				t.Fatalf("attrs = %+v", sp.attrs)
			}
			if sp.droppedAttrs != 5+3 || st.DroppedAttributes != 3 {
				t.Fatalf("dropped = %d, stats %d", sp.droppedAttrs, st.DroppedAttributes)
			}
		}},
		{"first of a repeated key wins", withAttrs(t, "lim", 0, "k", "k"), func(t *testing.T, sp *span, _ StoreStats) {
			if v, _ := sp.attrs.get("k"); len(sp.attrs) != 1 || v.i != 0 {
				t.Fatalf("attrs = %+v", sp.attrs)
			}
		}},
		{"values, keys and names cut at a UTF-8 boundary", mk(func(ps ptrace.Span, _ pcommon.Resource) {
			ps.SetName("a-very-long-name")
			ps.Attributes().PutStr("key-that-is-long", "aéééé") // 9 bytes: byte 8 is inside the last é
			ps.Attributes().PutEmptyBytes("b").FromRaw([]byte("0123456789"))
		}), func(t *testing.T, sp *span, st StoreStats) {
			if sp.name != "a-very-l" || sp.attrs[0].key != "key-that" || sp.attrs[0].val.s != "aééé" {
				t.Fatalf("name %q, attr %q=%q", sp.name, sp.attrs[0].key, sp.attrs[0].val.s)
			}
			if sp.attrs[1].val.s != "01234567" || sp.truncated != 4 || st.TruncatedValues != 4 {
				t.Fatalf("bytes %q, truncated %d / %d", sp.attrs[1].val.s, sp.truncated, st.TruncatedValues)
			}
		}},
		{"events and their attributes", mk(func(ps ptrace.Span, _ pcommon.Resource) {
			for i := range 5 {
				ev := ps.Events().AppendEmpty()
				ev.SetName(fmt.Sprint("e", i))
				for k := range 4 {
					ev.Attributes().PutInt(fmt.Sprint("k", k), int64(k))
				}
			}
			ps.SetDroppedEventsCount(1)
		}), func(t *testing.T, sp *span, st StoreStats) {
			if len(sp.events) != 2 || sp.events[1].name != "e1" || len(sp.events[0].attrs) != 3 || sp.events[0].droppedAttrs != 1 {
				t.Fatalf("events = %+v", sp.events)
			}
			if sp.droppedEvents != 3+1 || st.DroppedEvents != 3 {
				t.Fatalf("dropped events = %d, stats %d", sp.droppedEvents, st.DroppedEvents)
			}
		}},
		{"links", mk(func(ps ptrace.Span, _ pcommon.Resource) {
			for i := range 3 {
				l := ps.Links().AppendEmpty()
				l.SetTraceID(tracetest.TraceID(fmt.Sprint("other", i)))
				l.SetSpanID(tracetest.SpanID(fmt.Sprint("other", i), "x"))
			}
		}), func(t *testing.T, sp *span, st StoreStats) {
			if len(sp.links) != 1 || sp.droppedLinks != 2 || st.DroppedLinks != 2 {
				t.Fatalf("links = %+v, dropped %d / %d", sp.links, sp.droppedLinks, st.DroppedLinks)
			}
		}},
		{"resource attributes", mk(func(_ ptrace.Span, res pcommon.Resource) {
			for i := range 5 {
				res.Attributes().PutInt(fmt.Sprint("r", i), 1)
			}
		}), func(t *testing.T, sp *span, _ StoreStats) {
			if sp.res.service != "svc" || len(sp.res.attrs) != 3 || sp.res.droppedAttrs != 2 {
				t.Fatalf("resource = %+v", sp.res)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(cfg)
			if res := s.Add(tc.td); res.Accepted != 1 {
				t.Fatalf("Add = %+v", res)
			}
			st := s.Stats()
			sp := s.traces[tracetest.TraceID("lim")].spans[0]
			tc.check(t, sp, st)
			// What was left out travels with the span: OTLP dropped counts, Jaeger warnings.
			out, _ := s.PTraces(traceIDOf("lim"))
			ps := out.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0)
			if ps.DroppedAttributesCount() != sp.droppedAttrs || ps.DroppedEventsCount() != sp.droppedEvents || ps.DroppedLinksCount() != sp.droppedLinks {
				t.Fatalf("PTraces dropped counts = %d/%d/%d", ps.DroppedAttributesCount(), ps.DroppedEventsCount(), ps.DroppedLinksCount())
			}
			jt, _ := s.Trace(traceIDOf("lim"))
			if lost := sp.droppedAttrs + sp.droppedEvents + sp.droppedLinks + sp.truncated; (lost > 0) != (len(jt.Spans[0].Warnings) > 0) {
				t.Fatalf("warnings %q for %d left out", jt.Spans[0].Warnings, lost)
			}
		})
	}
}

// TestNegativeDurationKept: a span that ends before it starts keeps its negative duration
// everywhere it is shown, flagged, never clamped.
func TestNegativeDurationKept(t *testing.T) {
	td := build("neg", sp{name: "root", start: 0, end: 10}, sp{name: "child", parent: "root", start: 6, end: 2})
	s := NewStore(StoreConfig{})
	s.Add(td)
	wantNs := -ms(4)
	tests := []struct {
		name string
		got  func() int64
	}{
		{"stored span", func() int64 { return s.traces[tracetest.TraceID("neg")].spans[1].duration() }},
		{"jaeger duration (µs)", func() int64 {
			tr, _ := s.Trace(traceIDOf("neg"))
			for _, js := range tr.Spans {
				if js.OperationName == "child" {
					if len(js.Warnings) == 0 || !strings.Contains(js.Warnings[0], "negative duration") {
						t.Errorf("no negative-duration warning: %q", js.Warnings)
					}
					return js.Duration * 1000
				}
			}
			return 0
		}},
		{"breakdown span timing", func() int64 {
			bd, _ := s.Breakdown(traceIDOf("neg"))
			for _, st := range bd.Spans {
				if st.Name == "child" {
					return st.DurationNs
				}
			}
			return 0
		}},
		{"OTLP round trip", func() int64 {
			out, _ := s.PTraces(traceIDOf("neg"))
			var d int64
			forEachSpan(out, func(ps ptrace.Span) {
				if ps.Name() == "child" {
					d = int64(ps.EndTimestamp()) - int64(ps.StartTimestamp())
				}
			})
			return d
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.got(); got != wantNs {
				t.Fatalf("duration = %d ns, want %d", got, wantNs)
			}
		})
	}
	t.Run("negative root in the request index", func(t *testing.T) {
		s := NewStore(StoreConfig{})
		s.Add(build("negroot", sp{name: "root", start: 10, end: 3}))
		row, _ := s.Request(traceIDOf("negroot"))
		if !approx(row.DurationMs, -7, 1e-9) || row.NegativeSpans != 1 {
			t.Fatalf("row = %+v, want duration -7 ms and 1 negative span", row)
		}
	})
}

// TestStoreZeroAndHugeTimestamps: timestamps are kept bit for bit, including unsigned
// values past int64 (the Jaeger start time is not clamped to the epoch).
func TestStoreZeroAndHugeTimestamps(t *testing.T) {
	td := ptrace.NewTraces()
	ps := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty()
	ps.SetTraceID(tracetest.TraceID("ts"))
	ps.SetSpanID(tracetest.SpanID("ts", "a"))
	const huge = pcommon.Timestamp(1<<63 + 5000)
	ps.SetStartTimestamp(huge)
	ps.SetEndTimestamp(huge + 2000)
	s := NewStore(StoreConfig{})
	s.Add(td)
	tr, _ := s.Trace(traceIDOf("ts"))
	if tr.Spans[0].StartTime != uint64(huge)/1000 || tr.Spans[0].Duration != 2 {
		t.Fatalf("jaeger start %d duration %d", tr.Spans[0].StartTime, tr.Spans[0].Duration)
	}
	out, _ := s.PTraces(traceIDOf("ts"))
	if got := out.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).StartTimestamp(); got != huge {
		t.Fatalf("round trip start = %d", got)
	}
}

// withAttrs returns one span of trace key whose attributes are keys in order, repeats
// included (pdata's Put* would replace a repeated key, an OTLP body need not), with integer
// values 0, 1, …, and the sender's dropped_attributes_count.
func withAttrs(t testing.TB, key string, senderDropped uint32, keys ...string) ptrace.Traces {
	tid, sid := tracetest.TraceID(key), tracetest.SpanID(key, "a")
	kvs := make([]*commonpb.KeyValue, len(keys))
	for i, k := range keys {
		kvs[i] = &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(i)}}}
	}
	req := &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
			{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "svc"}}}}},
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{{
			TraceId: tid[:], SpanId: sid[:], Name: "a", Attributes: kvs, DroppedAttributesCount: senderDropped,
		}}}},
	}}}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(b)
	if err != nil {
		t.Fatal(err)
	}
	return td
}

// attrSpan returns one span with n attributes; every other key repeats the one before (the
// case that made a scan of the kept keys quadratic).
func attrSpan(t testing.TB, n int) ptrace.Traces {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("key.", i/2)
	}
	return withAttrs(t, fmt.Sprint("attrs", n), 0, keys...)
}

// growth times small and big alternately, rounds times, and returns the ratio of their
// best times. The machine is shared, so the best of interleaved runs is what is compared,
// and a measurement that a burst of load spoiled is retried (up to attempts times) before
// the ratio is reported as over limit. The garbage collector runs before each run and is
// paused during it: its pacing depends on the test's own live heap (the inputs), which
// would add a growth of its own to what is measured.
func growth(t *testing.T, limit float64, small, big func()) (ratio float64, bestSmall, bestBig time.Duration) {
	t.Helper()
	const rounds, attempts = 5, 3
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for range attempts {
		bestSmall, bestBig = time.Hour, time.Hour
		for range rounds {
			for _, m := range []struct {
				f    func()
				best *time.Duration
			}{{small, &bestSmall}, {big, &bestBig}} {
				runtime.GC()
				start := time.Now()
				m.f()
				*m.best = min(*m.best, time.Since(start))
			}
		}
		ratio = float64(bestBig) / float64(bestSmall)
		if ratio < limit {
			break
		}
	}
	return ratio, bestSmall, bestBig
}

// TestAttributeDedupLinear ingests one span with 50k and 200k attributes (half of them
// repeated keys): de-duplication costs O(n) key probes (counted: deterministic), and the
// time of Add grows about linearly (4×; quadratic would be 16×, the limit is 10×).
func TestAttributeDedupLinear(t *testing.T) {
	tests := []struct {
		name     string
		cfg      StoreConfig
		wantKept func(n int) int
	}{
		{"no attribute cap: every unique key kept", StoreConfig{MaxAttributes: -1}, func(n int) int { return n / 2 }},
		{"default cap of 128", StoreConfig{}, func(int) int { return DefaultMaxAttributes }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tds := map[int]ptrace.Traces{}
			probes := map[int]uint64{}
			for _, n := range []int{50_000, 200_000} {
				tds[n] = attrSpan(t, n)
				_, _, conv := convertLimited(tds[n], NewStore(tc.cfg).lim)
				probes[n] = conv.probes
				if probes[n] > uint64(2*n) {
					t.Fatalf("%d attributes: %d key probes, want O(n) (≤ 2n)", n, probes[n])
				}
				s := NewStore(tc.cfg)
				if res := s.Add(tds[n]); res.Accepted != 1 {
					t.Fatalf("Add = %+v", res)
				}
				if kept := len(s.traces[tracetest.TraceID(fmt.Sprint("attrs", n))].spans[0].attrs); kept != tc.wantKept(n) {
					t.Fatalf("%d attributes: kept %d, want %d", n, kept, tc.wantKept(n))
				}
			}
			add := func(n int) func() { return func() { NewStore(tc.cfg).Add(tds[n]) } }
			ratio, small, big := growth(t, 10, add(50_000), add(200_000))
			t.Logf("50k attributes: %v, %d probes; 200k: %v, %d probes; time ratio %.2f (linear 4, quadratic 16)",
				small, probes[50_000], big, probes[200_000], ratio)
			if ratio >= 10 {
				t.Fatalf("200k attributes took %.1f× as long as 50k (quadratic would be 16×)", ratio)
			}
		})
	}
}

// TestRequestListAfterHugeTrace: after one 14 MB trace of 100k spans, each its own service,
// the request list costs in proportion to what it returns: the first call summarizes the
// trace once, in about linear time (25k vs 100k spans), and later calls reuse the row until
// the trace changes.
func TestRequestListAfterHugeTrace(t *testing.T) {
	stores := map[int]*Store{}
	tids := map[int]pcommon.TraceID{}
	for _, n := range []int{25_000, 100_000} {
		s := NewStore(StoreConfig{MaxBytes: 1 << 30})
		tid := randomTraceID(t)
		if res := s.Add(bigTrace(tid, shape{spans: n, attrs: 4, valueLen: 20, resourcePerSpan: true})); res.Accepted != n {
			t.Fatalf("Add = %+v", res)
		}
		s.Add(tracetest.Request{RequestID: "small"}.Traces())
		stores[n], tids[n] = s, tid

		rows, total := s.Requests(DefaultRequestsLimit, 0)
		if total != 2 || len(rows) != 2 {
			t.Fatalf("Requests = %d rows, total %d", len(rows), total)
		}
		var huge RequestSummary
		for _, r := range rows {
			if r.TraceID == tid.String() {
				huge = r
			}
		}
		if huge.NSpans != n || len(huge.Services) != n {
			t.Fatalf("row: %d spans, %d services", huge.NSpans, len(huge.Services))
		}
		memo := s.traces[tid].memo.Load()
		s.Requests(DefaultRequestsLimit, 0)
		if s.traces[tid].memo.Load() != memo {
			t.Fatal("the unchanged trace was summarized again")
		}
	}
	// First call (the row to compute) against the trace's size, and against a later call.
	first := func(n int) func() {
		return func() {
			stores[n].traces[tids[n]].memo.Store(nil) // as if the trace had just changed
			stores[n].Requests(DefaultRequestsLimit, 0)
		}
	}
	ratio, small, big := growth(t, 10, first(25_000), first(100_000))
	later := func() { stores[100_000].Requests(DefaultRequestsLimit, 0) }
	againRatio, again, _ := growth(t, 1.0/5, later, first(100_000))
	t.Logf("first Requests: %v after 25k spans, %v after 100k (ratio %.2f; linear 4, quadratic 16); later calls %v (%.0f× faster)",
		small, big, ratio, again, againRatio)
	if ratio >= 10 {
		t.Fatalf("first Requests after 100k spans took %.1f× as long as after 25k (quadratic would be 16×)", ratio)
	}
	if againRatio < 5 {
		t.Fatalf("a call with the row memoized (%v) is not much faster than computing it (%v)", again, big)
	}

	// A change to the trace recomputes its row, once.
	s, tid := stores[100_000], tids[100_000]
	s.Requests(1, 0)
	memo := s.traces[tid].memo.Load()
	s.Add(bigTrace(tid, shape{spans: 1}))
	s.Requests(1, 0)
	if m := s.traces[tid].memo.Load(); m == memo || m.version != s.traces[tid].version {
		t.Fatal("a changed trace kept its old row")
	}
}

// TestCycleOnlyTraceIsListed: a trace whose spans only form a parent cycle has no natural
// root; it must still be listed and broken down, not crash the index.
func TestCycleOnlyTraceIsListed(t *testing.T) {
	td := ptrace.NewTraces()
	ss := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans()
	for _, p := range [][2]string{{"a", "b"}, {"b", "c"}, {"c", "a"}} {
		s := ss.AppendEmpty()
		s.SetTraceID(tracetest.TraceID("cyc"))
		s.SetSpanID(tracetest.SpanID("cyc", p[0]))
		s.SetParentSpanID(tracetest.SpanID("cyc", p[1]))
		s.SetName(p[0])
	}
	s := NewStore(StoreConfig{})
	s.Add(td)
	rows, _ := s.Requests(0, 0)
	if len(rows) != 1 || rows[0].NSpans != 3 {
		t.Fatalf("rows = %+v", rows)
	}
	if bd, ok := s.Breakdown(traceIDOf("cyc")); !ok || len(bd.Spans) != 3 {
		t.Fatalf("breakdown = %+v", bd)
	}
}

// BenchmarkStoreAddLargeTrace adds one trace of 10,000 spans with 8 attributes each.
func BenchmarkStoreAddLargeTrace(b *testing.B) {
	td := bigTrace(pcommon.TraceID{1}, shape{spans: 10_000, attrs: 8, valueLen: 32})
	b.ReportAllocs()
	for b.Loop() {
		s := NewStore(StoreConfig{})
		if res := s.Add(td); res.Accepted != 10_000 {
			b.Fatal(res)
		}
	}
}
