package blend

import (
	"slices"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

func spansNamed(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func one(t *testing.T, spans tracetest.SpanStubs, name string, trace trace.TraceID) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spansNamed(spans, name) {
		if s.SpanContext.TraceID() == trace {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %s spans in trace %s, want 1", len(found), name, trace)
	}
	return found[0]
}

func children(spans tracetest.SpanStubs, parent tracetest.SpanStub) []string {
	var names []string
	for _, s := range spans {
		if s.Parent.SpanID() == parent.SpanContext.SpanID() && s.Parent.TraceID() == parent.SpanContext.TraceID() {
			names = append(names, s.Name)
		}
	}
	slices.Sort(names)
	return names
}

func attr(s tracetest.SpanStub, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func intAttr(t *testing.T, s tracetest.SpanStub, k attribute.Key) int64 {
	t.Helper()
	v, ok := attr(s, k)
	if !ok {
		t.Fatalf("%s has no %s", s.Name, k)
	}
	return v.AsInt64()
}

func remote(tid trace.TraceID, sid byte) (string, trace.SpanContext) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{sid, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled, Remote: true})
	return telemetry.FormatTraceparent(sc), sc
}

func TestSpanTree(t *testing.T) {
	// L1 smaller than a chunk: the chunks live in L2 only, so the sparse
	// prefetch has L2 misses and a coalesced cb.l2_load.
	e, _, doc := docEnv(t, Config{L1Bytes: 1024, L2Dir: t.TempDir()})
	prompt := promptWith(promptN, 700, doc, 11)
	bt := targetTable(promptN / bs)

	tid := trace.TraceID{0xa, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	lookupTC, lookupParent := remote(tid, 1)
	loadTC, loadParent := remote(tid, 2)
	const vendor = "congo=t61rcWkgMzE" // the caller's tracestate, carried by every span
	res := e.lookup(&cbv1.LookupRequest{RequestId: "traced", TraceContext: lookupTC, TraceState: vendor, Tokens: prompt, WorldSize: 1, Model: testModel})
	if res.GetL2Misses() != 2 || res.GetNonPrefixHitTokens() != docLen || res.GetPrefixCoverageTokens() != 0 {
		t.Fatalf("lookup %+v", res)
	}
	if _, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "traced", TraceContext: loadTC, TraceState: vendor, WorkerId: "w0", BlockTable: bt, Matches: res.GetMatches()}); err != nil {
		t.Fatal(err)
	}
	// Option B: no trace context anywhere.
	resB := e.lookup(&cbv1.LookupRequest{RequestId: "untraced", Tokens: prompt, WorldSize: 1, Model: testModel})
	if _, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "untraced", WorkerId: "w0", BlockTable: bt, Matches: resB.GetMatches()}); err != nil {
		t.Fatal(err)
	}
	e.shutdown() // drains the bus
	spans := e.exp.GetSpans()

	for _, s := range spans {
		if s.SpanContext.TraceID() == tid && s.SpanContext.TraceState().String() != vendor {
			t.Errorf("%s carries tracestate %q, want %q", s.Name, s.SpanContext.TraceState(), vendor)
		}
	}
	lk := one(t, spans, spanname.CBLookup, tid)
	// The lookup statistics: the non-prefix leg searched the whole prompt (no prefix
	// coverage) and found the document.
	for k, want := range map[attribute.Key]int64{
		events.AttrRequestedTokens: promptN, events.AttrPrefixHitTokens: 0, events.AttrNonPrefixHitTokens: docLen,
		events.AttrHitTokens: docLen, events.AttrPrefixCoverageTokens: 0, events.AttrNNonPrefixTokens: promptN,
	} {
		if got := intAttr(t, lk, k); got != want {
			t.Errorf("cb.lookup %s = %d, want %d", k, got, want)
		}
	}
	if lk.Parent.SpanID() != lookupParent.SpanID() || !lk.Parent.IsRemote() || lk.SpanKind != trace.SpanKindServer {
		t.Errorf("cb.lookup parent %v remote %v kind %v", lk.Parent.SpanID(), lk.Parent.IsRemote(), lk.SpanKind)
	}
	want := []string{spanname.CBClassify, spanname.CBFingerprintMatch, spanname.CBSparsePrefetch, spanname.MPLookupPrefetch}
	if got := children(spans, lk); !slices.Equal(got, want) {
		t.Errorf("cb.lookup children %v, want %v", got, want)
	}
	if v, _ := attr(lk, events.AttrHitRate); v.AsFloat64() != 0.15 {
		t.Errorf("cb.lookup hit_rate %v", v)
	}
	if intAttr(t, lk, events.AttrPrefixChunks) != 0 || intAttr(t, lk, events.AttrNonPrefixHitTokens) != docLen {
		t.Errorf("cb.lookup attributes %v", lk.Attributes)
	}
	if v, _ := attr(lk, events.AttrRequestID); v.AsString() != "traced" {
		t.Errorf("cb.lookup request_id %v", v)
	}
	fm := one(t, spans, spanname.CBFingerprintMatch, tid)
	if intAttr(t, fm, events.AttrMatches) != 1 || intAttr(t, fm, events.AttrNProbes) == 0 || intAttr(t, fm, events.AttrTableHits) == 0 {
		t.Errorf("cb.fingerprint_match %v", fm.Attributes)
	}
	sp := one(t, spans, spanname.CBSparsePrefetch, tid)
	if intAttr(t, sp, events.AttrNKeys) != 2 || intAttr(t, sp, events.AttrL2Misses) != 2 || intAttr(t, sp, events.AttrL1Hits) != 0 {
		t.Errorf("cb.sparse_prefetch %v", sp.Attributes)
	}
	if got := children(spans, sp); !slices.Equal(got, []string{spanname.CBL2Load}) {
		t.Errorf("cb.sparse_prefetch children %v", got)
	}
	l2 := one(t, spans, spanname.CBL2Load, tid)
	if intAttr(t, l2, events.AttrChunks) != 2 || intAttr(t, l2, events.AttrBytes) <= 0 {
		t.Errorf("cb.l2_load %v", l2.Attributes)
	}
	if _, ok := attr(l2, events.AttrMs); !ok {
		t.Errorf("cb.l2_load has no ms")
	}
	cl := one(t, spans, spanname.CBClassify, tid)
	if intAttr(t, cl, events.AttrFound) != 2 || intAttr(t, cl, events.AttrStale) != 0 || intAttr(t, cl, events.AttrPerRankOK) != 2 {
		t.Errorf("cb.classify %v", cl.Attributes)
	}
	pl := one(t, spans, spanname.MPLookupPrefetch, tid)
	if intAttr(t, pl, events.AttrPrefixChunks) != 0 {
		t.Errorf("mp.lookup_prefetch %v", pl.Attributes)
	}

	rt := one(t, spans, spanname.CBRetrieve, tid)
	if rt.Parent.SpanID() != loadParent.SpanID() || rt.SpanKind != trace.SpanKindServer {
		t.Errorf("cb.retrieve parent %v", rt.Parent.SpanID())
	}
	if got := children(spans, rt); !slices.Equal(got, []string{spanname.CBScatter}) {
		t.Errorf("cb.retrieve children %v", got)
	}
	sc := one(t, spans, spanname.CBScatter, tid)
	for k, want := range map[attribute.Key]int64{
		events.AttrScatteredTokens: docLen, events.AttrSlotWrites: docLen * 4, events.AttrPartialBlocks: 2,
		events.AttrNPrefixTokens: 0, events.AttrNShiftedTokens: docLen, events.AttrDropped: 0,
	} {
		if got := intAttr(t, sc, k); got != want {
			t.Errorf("cb.scatter %s = %d, want %d", k, got, want)
		}
	}
	if sc.EndTime.Before(sc.StartTime) || sc.EndTime.After(rt.EndTime) || sc.StartTime.Before(rt.StartTime) {
		t.Errorf("cb.scatter [%v, %v] not inside cb.retrieve [%v, %v]", sc.StartTime, sc.EndTime, rt.StartTime, rt.EndTime)
	}
	// cb.retrieve carries the totals of its copies under the same names.
	for _, k := range []attribute.Key{events.AttrScatteredTokens, events.AttrSlotWrites, events.AttrPartialBlocks,
		events.AttrNPrefixTokens, events.AttrNShiftedTokens, events.AttrDropped} {
		if got, want := intAttr(t, rt, k), intAttr(t, sc, k); got != want {
			t.Errorf("cb.retrieve %s = %d, its one copy's %d", k, got, want)
		}
	}
	for _, s := range []tracetest.SpanStub{sc, rt} {
		v, ok := attr(s, events.AttrScatterMs)
		if ms := float64(sc.EndTime.Sub(sc.StartTime).Nanoseconds()) / 1e6; !ok || v.AsFloat64() <= 0 || v.AsFloat64() > ms+1e-9 {
			t.Errorf("%s scatter_ms %v (copy %.3f ms)", s.Name, v.AsFloat64(), ms)
		}
	}

	// Option B: a cb.request root with the trace id derived from the request id.
	bid := telemetry.TraceIDFromRequestID("untraced")
	root := one(t, spans, events.RootSpanName, bid)
	if root.Parent.IsValid() {
		t.Errorf("cb.request has a parent")
	}
	if got := children(spans, root); !slices.Equal(got, []string{spanname.CBLookup, spanname.CBRetrieve}) {
		t.Errorf("cb.request children %v", got)
	}
	if v, _ := attr(root, events.AttrHitRate); v.AsFloat64() != 0.15 {
		t.Errorf("cb.request hit_rate %v", v)
	}
	if v, _ := attr(root, events.AttrLookup); v.AsString() != "done" {
		t.Errorf("cb.request lookup %v", v)
	}
	if got := intAttr(t, root, events.AttrNNonPrefixTokens); got != promptN {
		t.Errorf("cb.request n_non_prefix_tokens %d", got)
	}
	lkB := one(t, spans, spanname.CBLookup, bid)
	if got := children(spans, lkB); !slices.Equal(got, want) {
		t.Errorf("option-B cb.lookup children %v", got)
	}
	one(t, spans, spanname.CBScatter, bid)
	// The store has a span of its own.
	if len(spansNamed(spans, spanname.CBStore)) != 1 {
		t.Errorf("cb.store spans: %d", len(spansNamed(spans, spanname.CBStore)))
	}
}
