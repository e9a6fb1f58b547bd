package events

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/telemetry/provider"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func at(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }

const (
	lookupTID  = "4bf92f3577b34da6a3ce929d0e0e4736"
	lookupSID  = "00f067aa0ba902b7"
	retrieveID = "b7ad6b7169203331"
)

func traceparent(tid, sid string, sampled bool) string {
	flags := "00"
	if sampled {
		flags = "01"
	}
	return "00-" + tid + "-" + sid + "-" + flags
}

// lookupSeq is a realistic unified lookup: prefix leg, fingerprint match,
// sparse prefetch with one coalesced L2 load, classify.
func lookupSeq(req, tc string, base int) []Event {
	return []Event{
		{Type: LookupStart, RequestID: req, Time: at(base), TraceContext: tc},
		{Type: PrefixLookupStart, RequestID: req, Time: at(base + 10)},
		{Type: PrefixLookupEnd, RequestID: req, Time: at(base + 60), Attrs: []attribute.KeyValue{AttrPrefixChunks.Int(2)}},
		{Type: FingerprintMatchStart, RequestID: req, Time: at(base + 70)},
		{Type: FingerprintMatchEnd, RequestID: req, Time: at(base + 470), Attrs: []attribute.KeyValue{
			AttrNProbes.Int(1024), AttrTableHits.Int(3), AttrMatches.Int(2)}},
		{Type: SparsePrefetchStart, RequestID: req, Time: at(base + 480)},
		{Type: L2LoadTaskStart, RequestID: req, Time: at(base + 490)},
		{Type: L2LoadTaskEnd, RequestID: req, Time: at(base + 2490), Attrs: []attribute.KeyValue{
			AttrChunks.Int(2), AttrBytes.Int(4 << 20)}},
		{Type: SparsePrefetchEnd, RequestID: req, Time: at(base + 2500), Attrs: []attribute.KeyValue{
			AttrNKeys.Int(4), AttrL1Hits.Int(2), AttrL2Misses.Int(2)}},
		{Type: ClassifyStart, RequestID: req, Time: at(base + 2510)},
		{Type: ClassifyEnd, RequestID: req, Time: at(base + 2520), Attrs: []attribute.KeyValue{
			AttrFound.Int(4), AttrStale.Int(0), AttrPerRankOK.Int(1)}},
		{Type: LookupEnd, RequestID: req, Time: at(base + 2530), Attrs: []attribute.KeyValue{
			AttrRequestedTokens.Int(1500), AttrPrefixHitTokens.Int(512), AttrNonPrefixHitTokens.Int(700),
			AttrHitTokens.Int(1212), AttrHitRate.Float64(1212.0 / 1500), AttrFingerprintHits.Int(3),
			AttrStorageHits.Int(4), AttrStaleChunks.Int(0)}},
	}
}

// retrieveStart/End and scatter events.
func retrieveStart(req, tc string, us int) Event {
	return Event{Type: RetrieveStart, RequestID: req, Time: at(us), TraceContext: tc}
}
func retrieveEnd(req string, us int) Event {
	return Event{Type: RetrieveEnd, RequestID: req, Time: at(us)}
}
func scatterStart(req string, copyID uint64, us int) Event {
	return Event{Type: ScatterStart, RequestID: req, CopyID: copyID, Time: at(us)}
}
func scatterEnd(req string, copyID uint64, us, tokens int) Event {
	return Event{Type: ScatterEnd, RequestID: req, CopyID: copyID, Time: at(us), Attrs: []attribute.KeyValue{
		AttrScatteredTokens.Int(tokens), AttrSlotWrites.Int(tokens), AttrPartialBlocks.Int(1),
		AttrNPrefixTokens.Int(tokens / 2), AttrNShiftedTokens.Int(tokens / 2), AttrDropped.Int(0)}}
}

type tracingFixture struct {
	exp *tracetest.InMemoryExporter
	tp  *sdktrace.TracerProvider
	sub *TracingSubscriber
}

func newFixture(t testing.TB, opts ...TracingOption) *tracingFixture {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithIDGenerator(provider.NewIDGenerator(nil)))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	sub, err := NewTracingSubscriber(tp, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &tracingFixture{exp: exp, tp: tp, sub: sub}
}

func (f *tracingFixture) feed(evs ...Event) {
	for _, ev := range evs {
		f.sub.HandleEvent(ev)
	}
}

func (f *tracingFixture) spans() tracetest.SpanStubs { return f.exp.GetSpans() }

func byName(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func one(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	got := byName(spans, name)
	if len(got) != 1 {
		t.Fatalf("%d spans named %s, want 1 (have %v)", len(got), name, names(spans))
	}
	return got[0]
}

func names(spans tracetest.SpanStubs) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}

func attrOf(s tracetest.SpanStub, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func wantInt(t *testing.T, s tracetest.SpanStub, key attribute.Key, want int64) {
	t.Helper()
	v, ok := attrOf(s, key)
	if !ok || v.Type() != attribute.INT64 || v.AsInt64() != want {
		t.Errorf("%s.%s = %v (present %v), want %d", s.Name, key, v.Emit(), ok, want)
	}
}

func wantParent(t *testing.T, child, parent tracetest.SpanStub) {
	t.Helper()
	if child.Parent.SpanID() != parent.SpanContext.SpanID() || child.SpanContext.TraceID() != parent.SpanContext.TraceID() {
		t.Errorf("%s parent = %s/%s, want %s (%s/%s)", child.Name, child.Parent.TraceID(), child.Parent.SpanID(),
			parent.Name, parent.SpanContext.TraceID(), parent.SpanContext.SpanID())
	}
}

func wantTimes(t *testing.T, s tracetest.SpanStub, start, end time.Time) {
	t.Helper()
	if !s.StartTime.Equal(start) || !s.EndTime.Equal(end) {
		t.Errorf("%s times = %v..%v, want %v..%v", s.Name, s.StartTime, s.EndTime, start, end)
	}
}

func TestSpanTreeRemoteParents(t *testing.T) {
	f := newFixture(t)
	const req = "req-1"
	lookupTC := traceparent(lookupTID, lookupSID, true)
	retrieveTC := traceparent(lookupTID, retrieveID, true)
	f.feed(lookupSeq(req, lookupTC, 0)...)
	f.feed(
		retrieveStart(req, retrieveTC, 10000),
		scatterStart(req, 1, 10010),
		scatterStart(req, 2, 10020),
		scatterEnd(req, 1, 10500, 700),
		retrieveEnd(req, 10600),
		scatterEnd(req, 2, 10900, 512),
	)
	spans := f.spans()
	if len(spans) != 9 {
		t.Fatalf("exported %d spans %v, want 9", len(spans), names(spans))
	}
	if len(byName(spans, RootSpanName)) != 0 {
		t.Error("an option-B root was opened although the peers sent trace context")
	}

	lookup := one(t, spans, spanname.CBLookup)
	tid, _ := trace.TraceIDFromHex(lookupTID)
	sid, _ := trace.SpanIDFromHex(lookupSID)
	rid, _ := trace.SpanIDFromHex(retrieveID)
	if lookup.SpanContext.TraceID() != tid || lookup.Parent.SpanID() != sid || !lookup.Parent.IsRemote() {
		t.Errorf("cb.lookup trace %s parent %s remote %v; want trace %s parent %s remote",
			lookup.SpanContext.TraceID(), lookup.Parent.SpanID(), lookup.Parent.IsRemote(), tid, sid)
	}
	if lookup.SpanKind != trace.SpanKindServer {
		t.Errorf("cb.lookup kind = %v, want server", lookup.SpanKind)
	}
	wantTimes(t, lookup, at(0), at(2530))
	wantInt(t, lookup, AttrPrefixChunks, 2)
	wantInt(t, lookup, AttrRequestedTokens, 1500)
	wantInt(t, lookup, AttrPrefixHitTokens, 512)
	wantInt(t, lookup, AttrNonPrefixHitTokens, 700)
	wantInt(t, lookup, AttrFingerprintHits, 3)
	wantInt(t, lookup, AttrStorageHits, 4)
	wantInt(t, lookup, AttrStaleChunks, 0)
	if v, _ := attrOf(lookup, AttrHitRate); v.AsFloat64() != 1212.0/1500 {
		t.Errorf("cb.lookup hit_rate = %v", v.Emit())
	}

	children := []struct {
		name, parent string
		start, end   int
		ints         map[attribute.Key]int64
	}{
		{spanname.MPLookupPrefetch, spanname.CBLookup, 10, 60, map[attribute.Key]int64{AttrPrefixChunks: 2}},
		{spanname.CBFingerprintMatch, spanname.CBLookup, 70, 470, map[attribute.Key]int64{AttrNProbes: 1024, AttrTableHits: 3, AttrMatches: 2}},
		{spanname.CBSparsePrefetch, spanname.CBLookup, 480, 2500, map[attribute.Key]int64{AttrNKeys: 4, AttrL1Hits: 2, AttrL2Misses: 2}},
		{spanname.CBL2Load, spanname.CBSparsePrefetch, 490, 2490, map[attribute.Key]int64{AttrChunks: 2, AttrBytes: 4 << 20}},
		{spanname.CBClassify, spanname.CBLookup, 2510, 2520, map[attribute.Key]int64{AttrFound: 4, AttrStale: 0, AttrPerRankOK: 1}},
	}
	for _, c := range children {
		t.Run(c.name, func(t *testing.T) {
			s := one(t, spans, c.name)
			wantParent(t, s, one(t, spans, c.parent))
			wantTimes(t, s, at(c.start), at(c.end))
			for k, v := range c.ints {
				wantInt(t, s, k, v)
			}
		})
	}
	if v, _ := attrOf(one(t, spans, spanname.CBL2Load), AttrMs); v.AsFloat64() != 2.0 {
		t.Errorf("cb.l2_load ms = %v, want 2 (from the event times)", v.Emit())
	}

	retrieve := one(t, spans, spanname.CBRetrieve)
	if retrieve.SpanContext.TraceID() != tid || retrieve.Parent.SpanID() != rid || !retrieve.Parent.IsRemote() {
		t.Errorf("cb.retrieve trace %s parent %s; want trace %s remote parent %s",
			retrieve.SpanContext.TraceID(), retrieve.Parent.SpanID(), tid, rid)
	}
	wantTimes(t, retrieve, at(10000), at(10600))
	scatters := byName(spans, spanname.CBScatter)
	if len(scatters) != 2 {
		t.Fatalf("%d cb.scatter spans, want 2", len(scatters))
	}
	for _, s := range scatters {
		wantParent(t, s, retrieve)
		tokens, _ := attrOf(s, AttrScatteredTokens)
		switch tokens.AsInt64() {
		case 700:
			wantTimes(t, s, at(10010), at(10500))
		case 512:
			wantTimes(t, s, at(10020), at(10900)) // ends after its retrieve: the copy's own time
		default:
			t.Errorf("cb.scatter scattered_tokens = %v", tokens.Emit())
		}
		for _, k := range []attribute.Key{AttrSlotWrites, AttrPartialBlocks, AttrNPrefixTokens, AttrNShiftedTokens, AttrDropped, AttrScatterMs} {
			if _, ok := attrOf(s, k); !ok {
				t.Errorf("cb.scatter lacks %s", k)
			}
		}
	}
	for _, s := range spans {
		if v, ok := attrOf(s, AttrRequestID); !ok || v.AsString() != req {
			t.Errorf("%s request_id = %q, want %q", s.Name, v.AsString(), req)
		}
	}
	if st := f.sub.Stats(); st != (TracingStats{}) {
		t.Errorf("Stats = %+v, want all zero", st)
	}
}

func TestOptionBRootClosesAfterLastCopy(t *testing.T) {
	f := newFixture(t)
	const req = "req-option-b"
	f.feed(lookupSeq(req, "", 0)...)
	f.feed(
		retrieveStart(req, "not-a-traceparent", 10000),
		scatterStart(req, 1, 10010),
		scatterStart(req, 2, 10020),
		scatterEnd(req, 1, 10500, 700),
		retrieveEnd(req, 10600),
	)
	if roots := byName(f.spans(), RootSpanName); len(roots) != 0 {
		t.Fatal("cb.request exported while a copy is still pending")
	}
	if st := f.sub.Stats(); st.Open != 1 || st.Roots != 1 {
		t.Errorf("Stats = %+v, want 1 open span and 1 root", st)
	}
	f.feed(scatterEnd(req, 2, 10900, 512))

	spans := f.spans()
	root := one(t, spans, RootSpanName)
	if want := telemetry.TraceIDFromRequestID(req); root.SpanContext.TraceID() != want {
		t.Errorf("root trace id = %s, want %s (derived from the request id)", root.SpanContext.TraceID(), want)
	}
	if root.Parent.IsValid() {
		t.Errorf("root has parent %v", root.Parent)
	}
	wantTimes(t, root, at(0), at(10900))
	wantInt(t, root, AttrRequestedTokens, 1500)
	wantInt(t, root, AttrPrefixHitTokens, 512)
	wantInt(t, root, AttrNonPrefixHitTokens, 700)
	wantInt(t, root, AttrFingerprintHits, 3)
	wantInt(t, root, AttrStorageHits, 4)
	wantInt(t, root, AttrStaleChunks, 0)
	if v, _ := attrOf(root, AttrHitRate); v.AsFloat64() != 1212.0/1500 {
		t.Errorf("root hit_rate = %v", v.Emit())
	}
	if v, _ := attrOf(root, AttrRequestID); v.AsString() != req {
		t.Errorf("root request_id = %q", v.AsString())
	}
	if root.Status.Code != codes.Unset {
		t.Errorf("root status = %v", root.Status)
	}
	wantParent(t, one(t, spans, spanname.CBLookup), root)
	wantParent(t, one(t, spans, spanname.CBRetrieve), root)
	wantParent(t, one(t, spans, spanname.CBFingerprintMatch), one(t, spans, spanname.CBLookup))
	for _, s := range spans {
		if s.SpanContext.TraceID() != root.SpanContext.TraceID() {
			t.Errorf("%s in trace %s, not the root's", s.Name, s.SpanContext.TraceID())
		}
	}
	if len(spans) != 10 {
		t.Errorf("%d spans, want 10", len(spans))
	}
	if st := f.sub.Stats(); st.Open != 0 || st.Lost != 0 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestOptionBSecondRetrieveJoinsClosedRoot(t *testing.T) {
	f := newFixture(t)
	const req = "req-twice"
	f.feed(
		retrieveStart(req, "", 100), scatterStart(req, 1, 110), scatterEnd(req, 1, 200, 256), retrieveEnd(req, 210),
		retrieveStart(req, "", 500), scatterStart(req, 1, 510), scatterEnd(req, 1, 600, 300), retrieveEnd(req, 610),
	)
	spans := f.spans()
	root := one(t, spans, RootSpanName)
	wantTimes(t, root, at(100), at(210))
	retrieves := byName(spans, spanname.CBRetrieve)
	if len(retrieves) != 2 {
		t.Fatalf("%d cb.retrieve spans, want 2", len(retrieves))
	}
	for _, r := range retrieves {
		wantParent(t, r, root)
	}
	if f.sub.Stats().Roots != 1 {
		t.Errorf("Roots = %d, want 1", f.sub.Stats().Roots)
	}
}

func TestTwoRetrievesTwoSpans(t *testing.T) {
	f := newFixture(t)
	const req = "req-2x"
	tc1 := traceparent(lookupTID, "1111111111111111", true)
	tc2 := traceparent(lookupTID, "2222222222222222", true)
	f.feed(
		retrieveStart(req, tc1, 0), scatterStart(req, 1, 5), scatterEnd(req, 1, 50, 256), retrieveEnd(req, 60),
		retrieveStart(req, tc2, 100), scatterStart(req, 1, 105), scatterEnd(req, 1, 150, 744), retrieveEnd(req, 160),
	)
	spans := f.spans()
	retrieves := byName(spans, spanname.CBRetrieve)
	if len(retrieves) != 2 {
		t.Fatalf("%d cb.retrieve spans, want 2", len(retrieves))
	}
	parents := map[string]bool{}
	for _, r := range retrieves {
		parents[r.Parent.SpanID().String()] = true
	}
	if !parents["1111111111111111"] || !parents["2222222222222222"] {
		t.Errorf("cb.retrieve parents %v, want both start_load_kv spans", parents)
	}
	first, second := byStart(retrieves, at(0)), byStart(retrieves, at(100))
	for _, s := range byName(spans, spanname.CBScatter) {
		if s.StartTime.Before(at(100)) {
			wantParent(t, s, first)
		} else {
			wantParent(t, s, second)
		}
	}
	wantTimes(t, first, at(0), at(60))
	wantTimes(t, second, at(100), at(160))
}

func byStart(spans []tracetest.SpanStub, start time.Time) tracetest.SpanStub {
	for _, s := range spans {
		if s.StartTime.Equal(start) {
			return s
		}
	}
	return tracetest.SpanStub{}
}

func TestSampledOutRecordsNothing(t *testing.T) {
	tests := []struct {
		name       string
		lookupTC   string
		retrieveTC string
	}{
		{"both sampled out", traceparent(lookupTID, lookupSID, false), traceparent(lookupTID, retrieveID, false)},
		// A request whose context was present but sampled out never gets an
		// option-B root, even when a later call comes without context.
		{"retrieve without context", traceparent(lookupTID, lookupSID, false), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			const req = "req-unsampled"
			f.feed(lookupSeq(req, tc.lookupTC, 0)...)
			f.feed(retrieveStart(req, tc.retrieveTC, 5000), scatterStart(req, 1, 5010),
				retrieveEnd(req, 5100), scatterEnd(req, 1, 5200, 100))
			if spans := f.spans(); len(spans) != 0 {
				t.Errorf("exported %v for a sampled-out request", names(spans))
			}
			if st := f.sub.Stats(); st.Open != 0 || st.Roots != 0 || st.Unpaired != 0 || st.Orphaned != 0 {
				t.Errorf("Stats = %+v", st)
			}
		})
	}
}

func TestUnpairedEndIgnored(t *testing.T) {
	f := newFixture(t)
	f.feed(
		Event{Type: FingerprintMatchEnd, RequestID: "r", Time: at(1)},
		scatterEnd("r", 3, 2, 10),
		retrieveEnd("other", 3),
		Event{Type: LookupStart, Time: at(4)}, // no request id
	)
	if spans := f.spans(); len(spans) != 0 {
		t.Errorf("exported %v", names(spans))
	}
	if st := f.sub.Stats(); st.Unpaired != 3 || st.Invalid != 1 || st.Open != 0 {
		t.Errorf("Stats = %+v, want 3 unpaired, 1 invalid", st)
	}
}

func TestOrphanStartNotTraced(t *testing.T) {
	f := newFixture(t)
	f.feed(
		Event{Type: SparsePrefetchStart, RequestID: "r", Time: at(1)}, // its cb.lookup START was dropped
		Event{Type: L2LoadTaskStart, RequestID: "r", Time: at(2)},
		Event{Type: L2LoadTaskEnd, RequestID: "r", Time: at(3)},
		Event{Type: SparsePrefetchEnd, RequestID: "r", Time: at(4)},
	)
	if spans := f.spans(); len(spans) != 0 {
		t.Errorf("exported %v", names(spans))
	}
	if st := f.sub.Stats(); st.Orphaned != 1 || st.Unpaired != 0 || st.Open != 0 {
		t.Errorf("Stats = %+v, want 1 orphaned", st)
	}
}

func TestSweepEndsOrphans(t *testing.T) {
	f := newFixture(t, WithSpanTTL(30*time.Second))
	tc := traceparent(lookupTID, lookupSID, true)
	f.feed(
		Event{Type: LookupStart, RequestID: "a", Time: at(0), TraceContext: tc},
		Event{Type: FingerprintMatchStart, RequestID: "a", Time: at(10)},
		Event{Type: LookupStart, RequestID: "young", Time: t0.Add(20 * time.Second), TraceContext: tc},
	)
	f.feed(Event{Type: Tick, Time: t0.Add(10 * time.Second)})
	if len(f.spans()) != 0 || f.sub.Stats().Lost != 0 {
		t.Fatal("sweep ended spans younger than the TTL")
	}
	sweepAt := t0.Add(31 * time.Second)
	f.feed(Event{Type: Tick, Time: sweepAt})
	spans := f.spans()
	if len(spans) != 2 {
		t.Fatalf("exported %v, want cb.lookup and cb.fingerprint_match", names(spans))
	}
	for _, s := range spans {
		if s.Status.Code != codes.Error || s.Status.Description != LostEndDescription {
			t.Errorf("%s status = %+v, want Error %q", s.Name, s.Status, LostEndDescription)
		}
		if !s.EndTime.Equal(sweepAt) {
			t.Errorf("%s ended at %v, want %v", s.Name, s.EndTime, sweepAt)
		}
	}
	if st := f.sub.Stats(); st.Lost != 2 || st.Open != 1 {
		t.Errorf("Stats = %+v, want 2 lost, 1 open", st)
	}
	// The END arriving after the sweep is unpaired.
	f.feed(Event{Type: LookupEnd, RequestID: "a", Time: sweepAt.Add(time.Second)})
	if st := f.sub.Stats(); st.Unpaired != 1 {
		t.Errorf("Unpaired = %d, want 1", st.Unpaired)
	}
}

func TestSweepOptionBRoot(t *testing.T) {
	t.Run("lost copy", func(t *testing.T) {
		f := newFixture(t)
		f.feed(retrieveStart("r", "", 0), scatterStart("r", 1, 10), retrieveEnd("r", 20))
		f.feed(Event{Type: Tick, Time: at(10).Add(DefaultSpanTTL)})
		spans := f.spans()
		root := one(t, spans, RootSpanName)
		if root.Status.Code != codes.Error {
			t.Errorf("root status = %+v, want Error", root.Status)
		}
		if s := one(t, spans, spanname.CBScatter); s.Status.Description != LostEndDescription {
			t.Errorf("scatter status = %+v", s.Status)
		}
	})
	t.Run("lookup without retrieve", func(t *testing.T) {
		f := newFixture(t)
		f.feed(lookupSeq("r", "", 0)...)
		if len(byName(f.spans(), RootSpanName)) != 0 {
			t.Fatal("root closed before any retrieve")
		}
		f.feed(Event{Type: Tick, Time: at(2530).Add(DefaultSpanTTL)})
		root := one(t, f.spans(), RootSpanName)
		wantTimes(t, root, at(0), at(2530))
		if root.Status.Code != codes.Unset {
			t.Errorf("root status = %+v, want Unset", root.Status)
		}
		if st := f.sub.Stats(); st.Lost != 0 || st.Open != 0 {
			t.Errorf("Stats = %+v", st)
		}
		if n := len(f.sub.reqs); n != 0 {
			t.Errorf("%d request states kept after the sweep", n)
		}
	})
}

func TestDuplicateStartSupersedes(t *testing.T) {
	f := newFixture(t)
	tc := traceparent(lookupTID, lookupSID, true)
	f.feed(
		retrieveStart("r", tc, 0),
		retrieveStart("r", tc, 100), // END of the first was dropped
		retrieveEnd("r", 200),
	)
	spans := byName(f.spans(), spanname.CBRetrieve)
	if len(spans) != 2 {
		t.Fatalf("%d cb.retrieve spans, want 2", len(spans))
	}
	lost := byStart(spans, at(0))
	if lost.Status.Description != LostEndDescription || !lost.EndTime.Equal(at(100)) {
		t.Errorf("superseded span: status %+v end %v", lost.Status, lost.EndTime)
	}
	wantTimes(t, byStart(spans, at(100)), at(100), at(200))
	if st := f.sub.Stats(); st.Lost != 1 || st.Open != 0 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestEndErrorSetsStatus(t *testing.T) {
	f := newFixture(t)
	end := retrieveEnd("r", 50)
	end.Err = errors.New("slot out of range")
	f.feed(retrieveStart("r", "", 0), end)
	spans := f.spans()
	if s := one(t, spans, spanname.CBRetrieve); s.Status.Code != codes.Error || s.Status.Description != "slot out of range" {
		t.Errorf("cb.retrieve status = %+v", s.Status)
	}
	if root := one(t, spans, RootSpanName); root.Status.Code != codes.Error {
		t.Errorf("root status = %+v, want Error", root.Status)
	}
}

func TestStoreOwnTrace(t *testing.T) {
	f := newFixture(t)
	tc := traceparent(lookupTID, "3333333333333333", true)
	f.feed(
		Event{Type: StoreStart, RequestID: "r", Time: at(0), TraceContext: tc},
		Event{Type: StoreEnd, RequestID: "r", Time: at(9), Attrs: []attribute.KeyValue{AttrStoredChunks.Int(3)}},
		Event{Type: StoreStart, RequestID: "doc", Time: at(20)},
		Event{Type: StoreEnd, RequestID: "doc", Time: at(29)},
	)
	stores := byName(f.spans(), spanname.CBStore)
	if len(stores) != 2 {
		t.Fatalf("%d cb.store spans, want 2", len(stores))
	}
	withCtx, without := byStart(stores, at(0)), byStart(stores, at(20))
	if withCtx.Parent.SpanID().String() != "3333333333333333" || withCtx.SpanContext.TraceID().String() != lookupTID {
		t.Errorf("cb.store with context: parent %s trace %s", withCtx.Parent.SpanID(), withCtx.SpanContext.TraceID())
	}
	wantInt(t, withCtx, AttrStoredChunks, 3)
	if without.Parent.IsValid() || without.SpanContext.TraceID() == telemetry.TraceIDFromRequestID("doc") {
		t.Errorf("cb.store without context: parent %v trace %s; want a new random trace", without.Parent, without.SpanContext.TraceID())
	}
	if len(byName(f.spans(), RootSpanName)) != 0 {
		t.Error("a store opened an option-B root")
	}
}

func TestTracingThroughBus(t *testing.T) {
	f := newFixture(t)
	b := NewBus(Config{})
	if err := b.Subscribe(f.sub, f.sub.EventTypes()...); err != nil {
		t.Fatal(err)
	}
	b.Start()
	for i := range 20 {
		req := fmt.Sprintf("req-%d", i)
		for _, ev := range lookupSeq(req, "", i*100000) {
			b.Publish(ev)
		}
		b.Publish(retrieveStart(req, "", i*100000+5000))
		b.Publish(scatterStart(req, 1, i*100000+5001))
		b.Publish(retrieveEnd(req, i*100000+5002))
		b.Publish(scatterEnd(req, 1, i*100000+5003, 64))
	}
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := len(byName(f.spans(), RootSpanName)); got != 20 {
		t.Errorf("%d roots, want 20", got)
	}
	if len(f.spans()) != 20*9 {
		t.Errorf("%d spans, want %d", len(f.spans()), 20*9)
	}
	if st := f.sub.Stats(); st.Open != 0 || st.Lost != 0 || st.Unpaired != 0 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestSpanDefValidation(t *testing.T) {
	good := SpanDef{Name: "a", Start: LookupStart, End: LookupEnd}
	tests := []struct {
		name string
		defs []SpanDef
	}{
		{"empty", []SpanDef{}},
		{"no name", []SpanDef{{Start: LookupStart, End: LookupEnd}}},
		{"reserved name", []SpanDef{{Name: RootSpanName, Start: LookupStart, End: LookupEnd}}},
		{"end as start", []SpanDef{{Name: "a", Start: LookupEnd, End: LookupEnd}}},
		{"start as end", []SpanDef{{Name: "a", Start: LookupStart, End: RetrieveStart}}},
		{"tick", []SpanDef{{Name: "a", Start: Tick, End: LookupEnd}}},
		{"start reused", []SpanDef{good, {Name: "b", Start: LookupStart, End: RetrieveEnd}}},
		{"end reused", []SpanDef{good, {Name: "b", Start: RetrieveStart, End: LookupEnd}}},
		{"name reused", []SpanDef{good, {Name: "a", Start: RetrieveStart, End: RetrieveEnd}}},
		{"unknown parent", []SpanDef{{Name: "a", Start: LookupStart, End: LookupEnd, Parent: "zz"}}},
		{"parent after child", []SpanDef{{Name: "b", Start: RetrieveStart, End: RetrieveEnd, Parent: "a"}, good}},
		{"context with parent", []SpanDef{good, {Name: "b", Start: RetrieveStart, End: RetrieveEnd, Parent: "a", TraceContext: true}}},
		{"fallback without context", []SpanDef{{Name: "a", Start: LookupStart, End: LookupEnd, RootFallback: true}}},
	}
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewTracingSubscriber(tp, WithSpanDefs(tc.defs))
			if !errors.Is(err, ErrInvalidSpanDefs) {
				t.Errorf("error = %v, want ErrInvalidSpanDefs", err)
			}
		})
	}
	if _, err := NewTracingSubscriber(nil); err == nil {
		t.Error("nil TracerProvider accepted")
	}
	sub, err := NewTracingSubscriber(tp, WithSpanDefs([]SpanDef{good}))
	if err != nil {
		t.Fatal(err)
	}
	if got := sub.EventTypes(); !equalTypes(got, []EventType{LookupStart, LookupEnd, Tick}) {
		t.Errorf("EventTypes = %v", got)
	}
}

// TestOptionBWithTelemetryProvider checks that a provider.Provider, whose
// own id generator honours telemetry.ContextWithTraceID, gives option-B roots the
// derived trace id with no extra wiring.
func TestOptionBWithTelemetryProvider(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	p, err := provider.New(context.Background(), provider.Config{Enabled: true, ServiceName: "cb-blend"},
		provider.WithSpanProcessor(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Shutdown(context.Background()) }()
	sub, err := NewTracingSubscriber(p.TracerProvider())
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []Event{retrieveStart("req-t", "", 0), retrieveEnd("req-t", 10)} {
		sub.HandleEvent(ev)
	}
	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans ended, want 2", len(ended))
	}
	for _, s := range ended {
		if s.SpanContext().TraceID() != telemetry.TraceIDFromRequestID("req-t") {
			t.Errorf("%s trace id = %s, want the derived one", s.Name(), s.SpanContext().TraceID())
		}
	}
}

// TestConcurrentRetrievesOfRanks: the ranks of a tensor-parallel worker
// retrieve one request at once; each retrieve is an instance (CopyID) and
// each scatter names its retrieve (ParentCopyID), so the spans do not mix.
func TestConcurrentRetrievesOfRanks(t *testing.T) {
	f := newFixture(t)
	const req = "req-tp"
	tc0 := traceparent(lookupTID, "1111111111111111", true)
	tc1 := traceparent(lookupTID, "2222222222222222", true)
	start := func(tc string, id uint64, us int) Event {
		e := retrieveStart(req, tc, us)
		e.CopyID = id
		return e
	}
	end := func(id uint64, us int) Event {
		e := retrieveEnd(req, us)
		e.CopyID = id
		return e
	}
	scatter := func(id, parent uint64, us int) Event {
		e := scatterStart(req, id, us)
		e.ParentCopyID = parent
		return e
	}
	f.feed(
		start(tc0, 10, 0), start(tc1, 20, 1),
		scatter(11, 10, 2), scatter(21, 20, 3),
		scatterEnd(req, 21, 40, 100), scatterEnd(req, 11, 50, 100),
		end(20, 45), end(10, 60),
	)
	spans := f.spans()
	retrieves := byName(spans, spanname.CBRetrieve)
	if len(retrieves) != 2 {
		t.Fatalf("%d cb.retrieve spans, want 2", len(retrieves))
	}
	r0, r1 := byStart(retrieves, at(0)), byStart(retrieves, at(1))
	wantTimes(t, r0, at(0), at(60))
	wantTimes(t, r1, at(1), at(45))
	for _, s := range byName(spans, spanname.CBScatter) {
		if s.StartTime.Equal(at(2)) {
			wantParent(t, s, r0)
		} else {
			wantParent(t, s, r1)
		}
	}
}

// TestDefaultSpanDefsFollowContract: every blend span's kind and parent are
// the contract's (contract/spans.yaml), and the table is parent-first.
func TestDefaultSpanDefsFollowContract(t *testing.T) {
	defs, err := DefaultSpanDefs()
	if err != nil {
		t.Fatal(err)
	}
	set, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[trace.SpanKind]contract.SpanKind{trace.SpanKindServer: contract.KindServer, trace.SpanKindInternal: contract.KindInternal}
	seen := map[string]bool{}
	for _, d := range defs {
		t.Run(d.Name, func(t *testing.T) {
			sp, ok := set.Lookup(d.Name)
			switch {
			case !ok || sp.Service != Service:
				t.Fatalf("not a %s span of the contract", Service)
			case kinds[d.Kind] != sp.Kind:
				t.Errorf("kind %v, contract %v", d.Kind, sp.Kind)
			case sp.RemoteParent != d.TraceContext:
				t.Errorf("trace context %v, contract remote_parent %v", d.TraceContext, sp.RemoteParent)
			case !sp.RemoteParent && (d.Parent != sp.Parent || !seen[d.Parent]):
				t.Errorf("parent %q, contract %q (defined before: %v)", d.Parent, sp.Parent, seen[d.Parent])
			}
		})
		seen[d.Name] = true
	}
	// Every blend span of the request trace is in the table.
	for _, sp := range set.Spans {
		if sp.Service == Service && sp.Trace == contract.TraceRequest && !seen[sp.Name] {
			t.Errorf("contract span %s has no definition", sp.Name)
		}
	}
}
