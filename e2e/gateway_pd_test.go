package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/demo"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/stack"
	"github.com/cacheblend/cacheblend/tracecheck"
	"github.com/cacheblend/cacheblend/tracestore"
)

// TestGatewayPrefillDecode: `cb up --prefill-nodes 1 --decode-nodes 1` (stack.Up with the same
// config): a request through the gateway is prefilled on the prefill engine and handed over to
// the decode engine the gateway names; one trace gateway → prefill SERVER (CacheBlend subtree)
// → kv.transfer → decode SERVER checked against the contract; greedy tokens equal to the prefill
// engine's own answer; a second request sharing the prefix has blocks_deduped > 0.
func TestGatewayPrefillDecode(t *testing.T) {
	e := &env{t: t, logs: &syncWriter{}}
	col, err := tracestore.New(tracestore.Config{OTLPAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0"}, component.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := col.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.col, e.queryURL = col, "http://"+col.QueryAddr()
	t0 := time.Now()
	st, err := stack.Up(context.Background(), stack.UpConfig{
		Exe: cbBin, APIAddr: "127.0.0.1:0", PrefillNodes: 1, DecodeNodes: 1,
		WorkerArgs: smallModel, BlendArgs: []string{"--coordinator-timeout=2s"},
		Env:          []string{"OTEL_BSP_SCHEDULE_DELAY=100"},
		OTLPEndpoint: "http://" + col.OTLPAddr() + "/v1/traces", OTLPProtocol: "http/protobuf",
		Supervisor: stack.Config{Logs: e.logs, ReadyTimeout: 120 * time.Second},
	})
	if err != nil {
		col.Shutdown(context.Background())
		t.Fatalf("stack up: %v\nlogs:\n%s", err, tail(e.logs.String(), 60))
	}
	e.stack = st
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Errorf("stack shutdown: %v", err)
		}
		col.Shutdown(ctx)
		if t.Failed() {
			t.Logf("process logs:\n%s", tail(e.logs.String(), 80))
		}
	})
	eps := st.Endpoints()
	if eps.Gateway == nil || len(eps.Nodes) != 2 || eps.Nodes[0].Role != "prefill" || eps.Nodes[1].Role != "decode" || !eps.MutualTLS {
		t.Fatalf("endpoints %+v", eps)
	}
	gw, p, d := eps.Gateway.API, eps.Nodes[0].Engine.API, eps.Nodes[1].Engine.API
	t.Logf("fleet up in %v: gateway %s, prefill %s, decode %s", time.Since(t0).Round(time.Millisecond), gw, p, d)

	// Documents through the gateway land on the prefill engine (CacheBlend reuse there).
	var docs []map[string]string
	for _, doc := range demo.Documents() {
		docs = append(docs, map[string]string{"id": doc.ID, "text": doc.Text})
	}
	ib, _ := json.Marshal(map[string]any{"documents": docs})
	if resp, err := http.Post(gw+"/v1/documents", "application/json", bytes.NewReader(ib)); err != nil || resp.StatusCode != 200 {
		t.Fatalf("ingest: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// 1. Greedy tokens equal to one engine's (the prefill engine without the header).
	full := map[string]any{"cacheblend": map[string]any{"reuse": false}}
	question := demo.Prompt(demo.Documents()[7:8], "Question: summarize this document in one sentence.")
	one := send(p, nil, chatBody(question, 24, false, full))
	dis := send(gw, nil, chatBody(question, 24, false, full))
	if one.status != 200 || dis.status != 200 || one.text == "" || dis.text != one.text {
		t.Fatalf("one engine %d %q\nthrough the gateway %d %q %s", one.status, one.text, dis.status, dis.text, dis.body)
	}
	if r, ok := api.ParseKVReport(dis.header); !ok || r.BlocksSent == 0 {
		t.Fatalf("no hand-over through the gateway: %v", dis.header)
	}
	t.Logf("greedy: prefill engine alone %v, gateway → prefill → decode %v, same %d-byte answer",
		one.took.Round(time.Millisecond), dis.took.Round(time.Millisecond), len(dis.text))

	// 2. One trace: caller → gateway.request → gateway.attempt → prefill SERVER (CacheBlend
	// subtree) → kv.transfer → decode SERVER → kv.receive → kv.send.
	spec, err := contract.Spans()
	if err != nil {
		t.Fatal(err)
	}
	docs14 := []demo.Document{demo.Documents()[1], demo.Documents()[4]}
	a := send(gw, map[string]string{"traceparent": caller}, chatBody(demo.Prompt(docs14, "Question: what do these documents have in common?"), 16, true, nil))
	if a.status != 200 || strings.Contains(a.text, "<error") {
		t.Fatalf("RAG through the gateway: %d %s", a.status, a.body)
	}
	// Another prompt, another answer: the comparison in 1. can fail.
	requireDistinctText(t, one.text, a.text)
	want := []string{spanname.GatewayRequest, spanname.GatewayAttempt, spanname.KVTransfer, spanname.KVReceive, spanname.KVSend,
		spanname.CBLookup, spanname.CBExecute, spanname.EngineDecode}
	tr := e.pdTrace("4bf92f3577b34da6a3ce929d0e0e4736", spec, want...)
	spans := byName(tr)
	gr, ga, kvt, servers := spans[spanname.GatewayRequest], spans[spanname.GatewayAttempt], spans[spanname.KVTransfer], spans["chat cb-llama"]
	if len(gr) != 1 || len(ga) != 1 || len(kvt) != 1 || len(servers) != 2 {
		t.Fatalf("%d gateway.request, %d gateway.attempt, %d kv.transfer, %d SERVER spans", len(gr), len(ga), len(kvt), len(servers))
	}
	var pserver, dserver *tracecheck.Span
	for _, s := range servers {
		switch s.ParentSpanID {
		case kvt[0].SpanID:
			dserver = s
		case ga[0].SpanID:
			pserver = s
		}
	}
	if pserver == nil || dserver == nil || kvt[0].ParentSpanID != pserver.SpanID || gr[0].ParentSpanID != "00f067aa0ba902b7" {
		t.Fatal("want caller → gateway.request → gateway.attempt → prefill SERVER → kv.transfer → decode SERVER")
	}
	if spanByID(tr, spans[spanname.CBRequest][0].ParentSpanID) != pserver {
		t.Fatal("the CacheBlend subtree is not under the prefill SERVER")
	}
	dname := strings.TrimPrefix(d, "http://")
	if gr[0].Attributes["route.decode_engine"].Str != dname || ga[0].Attributes["route.decode_engine"].Str != dname ||
		gr[0].Attributes["route.engine"].Str != strings.TrimPrefix(p, "http://") {
		t.Fatalf("gateway spans: request %v, attempt %v", gr[0].Attributes, ga[0].Attributes)
	}
	t.Logf("trace %s: %d spans, services %v; kv.transfer %d bytes, %d blocks sent, %d deduped",
		tr.TraceID, len(tr.Spans), services(tr), kvt[0].Attributes["bytes"].Int, kvt[0].Attributes["blocks_sent"].Int, kvt[0].Attributes["blocks_deduped"].Int)

	// 3. A second request sharing the prefix: the decode engine holds its blocks.
	const caller2 = "00-5bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-01"
	b := send(gw, map[string]string{"traceparent": caller2}, chatBody(demo.Prompt(docs14, "Question: which one is longer?"), 16, false, nil))
	if b.status != 200 {
		t.Fatalf("second request: %d %s", b.status, b.body)
	}
	tr2 := e.pdTrace("5bf92f3577b34da6a3ce929d0e0e4737", spec, spanname.GatewayRequest, spanname.KVTransfer)
	k2 := byName(tr2)[spanname.KVTransfer]
	if len(k2) != 1 || k2[0].Attributes["blocks_deduped"].Int <= 0 {
		t.Fatalf("second request's kv.transfer %v", k2)
	}
	t.Logf("shared prefix: kv.transfer %d blocks deduped, %d sent (%d bytes), %v",
		k2[0].Attributes["blocks_deduped"].Int, k2[0].Attributes["blocks_sent"].Int, k2[0].Attributes["bytes"].Int, b.took.Round(time.Millisecond))
}

// pdTrace waits until the trace has want and both engines' SERVER spans and passes the span
// contract, or fails the test after 60 s.
func (e *env) pdTrace(traceID string, spec *contract.SpanSet, want ...string) *tracecheck.Trace {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		tr := e.trace(traceID, want...)
		rep := tracecheck.Check([]tracecheck.Trace{*tr}, spec)
		if rep.OK() && len(byName(tr)["chat cb-llama"]) == 2 {
			return tr
		}
		if time.Now().After(deadline) {
			for _, s := range tr.Spans {
				e.t.Logf("%-22s %s %s parent %s", s.Name, s.Service, s.SpanID, s.ParentSpanID)
			}
			e.t.Fatalf("trace %s fails the contract:\n%s", traceID, rep)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
