package tracetest

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/contract/spanname"
)

// Services of the stack.
const (
	Engine = "cb-engine"
	Worker = "cb-worker"
	Blend  = "cb-blend"
)

// Request describes one synthetic request. The zero value is usable: request "req-1",
// model "m1", started at 2025-01-01 00:00:00 UTC, 1024 prompt tokens of which 256 hit the
// prefix and 512 hit off the prefix, 16 output tokens, some L2 misses.
type Request struct {
	RequestID    string
	Model        string
	Start        time.Time
	PromptTokens int64
	PrefixHit    int64
	NonPrefixHit int64
	OutputTokens int64
	L2Misses     int64
	// Lookup is how the request's lookup ended (cb.request's lookup attribute): "done" by
	// default. Any other outcome ("skipped", "unavailable", "timeout", …) serves the request
	// by a full prefill: cb.request carries zero hit statistics, the blend server's spans and
	// the KV load and blended forward are absent, and so is cb.lookup.rpc when skipped (it
	// carries error.type otherwise).
	Lookup string
	// Scale multiplies every offset and duration (default 1: a 180 ms request).
	Scale float64
	// Instances maps a span name to the service.instance.id of the process
	// recording it; default the span's service + "-0". Two spans of one
	// service with different instances come from two processes (the prefill
	// and the decode engine of a disaggregated request, two nodes).
	Instances map[string]string
	// Trace is the trace id; default TraceID(RequestID) (e.g. a client's
	// traceparent in a test of a client).
	Trace pcommon.TraceID
}

func (r Request) withDefaults() Request {
	if r.RequestID == "" {
		r.RequestID = "req-1"
	}
	if r.Model == "" {
		r.Model = "m1"
	}
	if r.Start.IsZero() {
		r.Start = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	if r.PromptTokens == 0 {
		r.PromptTokens, r.PrefixHit, r.NonPrefixHit = 1024, 256, 512
	}
	if r.OutputTokens == 0 {
		r.OutputTokens = 16
	}
	if r.L2Misses == 0 {
		r.L2Misses = 2
	}
	if r.Scale == 0 {
		r.Scale = 1
	}
	if r.Lookup == "" {
		r.Lookup = "done"
	}
	if r.Lookup != "done" {
		r.PrefixHit, r.NonPrefixHit = 0, 0
	}
	return r
}

// SpanDef is one span of a synthetic trace, in milliseconds from the request's start.
type SpanDef struct {
	Name    string
	Service string
	Kind    ptrace.SpanKind
	Parent  string // name of the parent span; "" for the root
	StartMs float64
	EndMs   float64
	Attrs   map[string]any // string, int, int64, float64 or bool
}

// Defs returns the span definitions of one request, in contract order: the root
// "chat {model}" (180 ms), engine.queue, engine.prefill (overlapping cb.request, as the
// engine runs the prefill while the CacheBlend work happens), engine.decode, and the
// cb.* subtree across the three services.
func (r Request) Defs() []SpanDef {
	r = r.withDefaults()
	rid := r.RequestID
	hits := r.PrefixHit + r.NonPrefixHit
	hit := float64(hits) / float64(r.PromptTokens)
	coverage := r.PrefixHit // every stored prefix chunk usable
	done := r.Lookup == "done"
	fpHits, storageHits := int64(2), int64(3)
	if !done {
		fpHits, storageHits = 0, 0
	}
	// The lookup statistics of cb.request and cb.lookup (contract/spans.yaml).
	stats := func(m map[string]any) map[string]any {
		m["hit_rate"], m["hit_tokens"], m["requested_tokens"] = hit, hits, r.PromptTokens
		m["prefix_hit_tokens"], m["non_prefix_hit_tokens"] = r.PrefixHit, r.NonPrefixHit
		m["prefix_coverage_tokens"], m["n_non_prefix_tokens"] = coverage, r.PromptTokens-coverage
		m["fingerprint_hits"], m["storage_hits"], m["stale_chunks"] = fpHits, storageHits, int64(0)
		return m
	}
	scatter := func(m map[string]any) map[string]any {
		m["scattered_tokens"], m["slot_writes"], m["partial_blocks"] = hits, hits, int64(1)
		m["n_prefix_tokens"], m["n_shifted_tokens"], m["dropped"], m["scatter_ms"] = r.PrefixHit, r.NonPrefixHit, int64(0), 14.0
		return m
	}
	with := func(m map[string]any) map[string]any {
		m["request_id"] = rid
		return m
	}
	root := spanname.Server("chat", r.Model)
	defs := []SpanDef{
		{root, Engine, ptrace.SpanKindServer, "", 0, 180, map[string]any{
			"gen_ai.operation.name": "chat", "gen_ai.request.model": r.Model, "request_id": rid,
			"gen_ai.usage.input_tokens": r.PromptTokens, "gen_ai.usage.output_tokens": r.OutputTokens}},
		{spanname.EngineQueue, Engine, ptrace.SpanKindInternal, root, 0.2, 3, nil},
		{spanname.CBRequest, Engine, ptrace.SpanKindInternal, root, 2, 122, with(stats(map[string]any{
			"model": r.Model, "world_size": int64(1), "n_prompt_tokens": r.PromptTokens, "lookup": r.Lookup}))},
		{spanname.CBSchedule, Engine, ptrace.SpanKindInternal, spanname.CBRequest, 3, 41, with(map[string]any{})},
		{spanname.CBLookupRPC, Engine, ptrace.SpanKindClient, spanname.CBSchedule, 4, 37, with(map[string]any{"n_polls": int64(3)})},
		{spanname.CBLookup, Blend, ptrace.SpanKindServer, spanname.CBLookupRPC, 5.5, 33, with(stats(map[string]any{"prefix_chunks": int64(1), "pending_wait_ms": 0.0, "unarrived_stores": int64(0)}))},
		{spanname.MPLookupPrefetch, Blend, ptrace.SpanKindInternal, spanname.CBLookup, 6, 8.5, with(map[string]any{"prefix_chunks": int64(1)})},
		{spanname.CBFingerprintMatch, Blend, ptrace.SpanKindInternal, spanname.CBLookup, 8.5, 15, with(map[string]any{
			"n_probes": r.PromptTokens - 256, "table_hits": int64(3), "matches": int64(2)})},
		{spanname.CBSparsePrefetch, Blend, ptrace.SpanKindInternal, spanname.CBLookup, 15, 30, with(map[string]any{
			"n_keys": int64(3), "l1_hits": int64(1), "l2_misses": r.L2Misses})},
		{spanname.CBL2Load, Blend, ptrace.SpanKindInternal, spanname.CBSparsePrefetch, 15.5, 29.5, with(map[string]any{
			"chunks": r.L2Misses, "bytes": r.L2Misses * 4 << 20, "ms": 14.0})},
		{spanname.CBClassify, Blend, ptrace.SpanKindInternal, spanname.CBLookup, 30, 32, with(map[string]any{
			"found": int64(3), "stale": int64(0), "per_rank_ok": int64(1), "pending": int64(0)})},
		{spanname.CBBuildMeta, Engine, ptrace.SpanKindInternal, spanname.CBSchedule, 38, 40, with(map[string]any{})},
		{spanname.CBExecute, Worker, ptrace.SpanKindServer, spanname.CBRequest, 42, 120, with(map[string]any{})},
		{spanname.CBStartLoadKV, Worker, ptrace.SpanKindClient, spanname.CBExecute, 43, 61, with(map[string]any{
			"scattered_tokens": hits, "dropped": int64(0)})},
		{spanname.CBRetrieve, Blend, ptrace.SpanKindServer, spanname.CBStartLoadKV, 44, 60, with(scatter(map[string]any{}))},
		{spanname.CBScatter, Blend, ptrace.SpanKindInternal, spanname.CBRetrieve, 45, 59, with(scatter(map[string]any{}))},
		{spanname.CBModelForward, Worker, ptrace.SpanKindInternal, spanname.CBExecute, 62, 119, with(map[string]any{
			"reused_tokens": r.NonPrefixHit, "prefix_tokens": r.PrefixHit, "new_tokens": r.PromptTokens - hits, "imp_count": int64(77)})},
		{spanname.CBFullRecomp, Worker, ptrace.SpanKindInternal, spanname.CBModelForward, 62.5, 80, with(map[string]any{})},
		{spanname.CBCheck, Worker, ptrace.SpanKindInternal, spanname.CBModelForward, 80, 84, with(map[string]any{
			"imp_count": int64(77), "recomp_ratio": 0.15})},
		{spanname.CBPartial, Worker, ptrace.SpanKindInternal, spanname.CBModelForward, 84, 118, with(map[string]any{
			"dispatch": "flex", "imp_empty": false})},
		{spanname.EnginePrefill, Engine, ptrace.SpanKindInternal, root, 41, 124, nil},
		{spanname.EngineDecode, Engine, ptrace.SpanKindInternal, root, 124, 179.5, nil},
	}
	if done {
		return defs
	}
	// Served without a lookup result: a full prefill.
	out := defs[:0]
	for _, d := range defs {
		switch d.Name {
		case spanname.CBModelForward:
			d.Attrs = with(map[string]any{})
		case spanname.CBLookupRPC:
			if r.Lookup == "skipped" {
				continue
			}
			d.Attrs["error.type"] = r.Lookup
		case spanname.CBLookup, spanname.MPLookupPrefetch, spanname.CBFingerprintMatch, spanname.CBSparsePrefetch,
			spanname.CBL2Load, spanname.CBClassify, spanname.CBStartLoadKV, spanname.CBRetrieve, spanname.CBScatter,
			spanname.CBFullRecomp, spanname.CBCheck, spanname.CBPartial:
			continue
		}
		out = append(out, d)
	}
	return out
}

// TraceID returns the deterministic trace id of a request id.
func TraceID(requestID string) pcommon.TraceID {
	sum := sha256.Sum256([]byte("trace/" + requestID))
	var id pcommon.TraceID
	copy(id[:], sum[:16])
	return id
}

// SpanID returns the deterministic span id of a span name within a request.
func SpanID(requestID, name string) pcommon.SpanID {
	sum := sha256.Sum256([]byte("span/" + requestID + "/" + name))
	var id pcommon.SpanID
	copy(id[:], sum[:8])
	if binary.BigEndian.Uint64(id[:]) == 0 {
		id[7] = 1
	}
	return id
}

// Traces builds the OTLP data of a request: one ResourceSpans per service, as three
// processes would export them.
func (r Request) Traces() ptrace.Traces { return Build(r, r.Defs()) }

// Build turns span definitions into OTLP data with the ids of [TraceID] and [SpanID] (the
// n-th span of a repeated name gets SpanID(requestID, name+"#n"); parents name a span's
// first occurrence); the decode span gets a "token" event every 32 tokens (at least one).
func Build(r Request, defs []SpanDef) ptrace.Traces {
	r = r.withDefaults()
	td := ptrace.NewTraces()
	bySvc := map[[2]string]ptrace.SpanSlice{}
	tid := TraceID(r.RequestID)
	if !r.Trace.IsEmpty() {
		tid = r.Trace
	}
	seen := map[string]int{}
	at := func(ms float64) pcommon.Timestamp {
		return pcommon.NewTimestampFromTime(r.Start.Add(time.Duration(ms * r.Scale * float64(time.Millisecond))))
	}
	for _, d := range defs {
		inst := r.Instances[d.Name]
		if inst == "" {
			inst = d.Service + "-0"
		}
		ss, ok := bySvc[[2]string{d.Service, inst}]
		if !ok {
			rs := td.ResourceSpans().AppendEmpty()
			rs.Resource().Attributes().PutStr("service.name", d.Service)
			rs.Resource().Attributes().PutStr("service.instance.id", inst)
			sc := rs.ScopeSpans().AppendEmpty()
			sc.Scope().SetName("github.com/cacheblend/cacheblend/" + d.Service)
			ss = sc.Spans()
			bySvc[[2]string{d.Service, inst}] = ss
		}
		sp := ss.AppendEmpty()
		sp.SetTraceID(tid)
		// A repeated name gets a distinct id; parents refer to a name's first span.
		if seen[d.Name]++; seen[d.Name] == 1 {
			sp.SetSpanID(SpanID(r.RequestID, d.Name))
		} else {
			sp.SetSpanID(SpanID(r.RequestID, fmt.Sprintf("%s#%d", d.Name, seen[d.Name])))
		}
		if d.Parent != "" {
			sp.SetParentSpanID(SpanID(r.RequestID, d.Parent))
		}
		sp.SetName(d.Name)
		sp.SetKind(d.Kind)
		sp.SetStartTimestamp(at(d.StartMs))
		sp.SetEndTimestamp(at(d.EndMs))
		sp.Status().SetCode(ptrace.StatusCodeUnset)
		for _, k := range slices.Sorted(maps.Keys(d.Attrs)) {
			_ = sp.Attributes().PutEmpty(k).FromRaw(d.Attrs[k]) // the types SpanDef.Attrs names never fail
		}
		if d.Name == spanname.EngineDecode {
			n := max(1, r.OutputTokens/32)
			for i := range n {
				ev := sp.Events().AppendEmpty()
				ev.SetName("token")
				ev.SetTimestamp(at(d.StartMs + (d.EndMs-d.StartMs)*float64(i+1)/float64(n+1)))
				ev.Attributes().PutInt("n", (i+1)*32)
			}
		}
	}
	return td
}

// Quality describes the worker's online quality check of one request (cb.quality, the root
// of its own trace, linked to the request's cb.model_forward). The zero value checks
// "req-1" with the figures of a close blend: first-token KL 0.0031, mean KL 0.0024, top-1
// 1, greedy match 4 of 4 positions, ratio 0.15, 77 tokens selected, a 85 ms full prefill.
type Quality struct {
	// RequestID is the request checked; RequestTrace its trace, default
	// TraceID(RequestID).
	RequestID    string
	RequestTrace pcommon.TraceID
	// Failed records a check that failed: error status, no figures.
	Failed bool
	// Start is when the check began; default 200 ms after 2025-01-01 00:00:00 UTC (after
	// the default request).
	Start time.Time
	// The figures of contract/spans.yaml's cb.quality.
	FirstKL, MeanKL, Top1, RecompRatio, FullMs float64
	GreedyMatch, Positions, Selected           int64
}

func (q Quality) withDefaults() Quality {
	if q.RequestID == "" {
		q.RequestID = "req-1"
	}
	if q.Start.IsZero() {
		q.Start = time.Date(2025, 1, 1, 0, 0, 0, 200e6, time.UTC)
	}
	if q.Positions == 0 {
		q.FirstKL, q.MeanKL, q.Top1, q.GreedyMatch, q.Positions = 0.0031, 0.0024, 1, 4, 4
	}
	if q.RecompRatio == 0 {
		q.RecompRatio, q.Selected = 0.15, 77
	}
	if q.FullMs == 0 {
		q.FullMs = 85
	}
	return q
}

// QualityTraceID returns the trace id of the quality check of a request.
func QualityTraceID(requestID string) pcommon.TraceID { return TraceID("quality/" + requestID) }

// Traces builds the OTLP data of the check: one cb.quality span (cb-worker), the root of
// trace QualityTraceID(RequestID), with a link to the request's cb.model_forward (span
// SpanID(RequestID, cb.model_forward) of trace RequestTrace).
func (q Quality) Traces() ptrace.Traces {
	q = q.withDefaults()
	key := "quality/" + q.RequestID
	attrs := map[string]any{"request_id": q.RequestID, "first_kl": q.FirstKL, "mean_kl": q.MeanKL, "top1": q.Top1,
		"greedy_match": q.GreedyMatch, "positions": q.Positions, "recomp_ratio": q.RecompRatio,
		"selected": q.Selected, "full_ms": q.FullMs}
	if q.Failed {
		attrs = map[string]any{"request_id": q.RequestID, "error.type": "quality_failed"}
	}
	td := Build(Request{RequestID: key, Start: q.Start}, []SpanDef{{
		Name: spanname.CBQuality, Service: Worker, Kind: ptrace.SpanKindInternal, StartMs: 0, EndMs: q.FullMs + 1, Attrs: attrs,
	}})
	sp := td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0)
	if q.Failed {
		sp.Status().SetCode(ptrace.StatusCodeError)
		sp.Status().SetMessage("quality check: snapshot gone")
	}
	tid := q.RequestTrace
	if tid.IsEmpty() {
		tid = TraceID(q.RequestID)
	}
	l := sp.Links().AppendEmpty()
	l.SetTraceID(tid)
	l.SetSpanID(SpanID(q.RequestID, spanname.CBModelForward))
	return td
}
