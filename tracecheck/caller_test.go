package tracecheck

import (
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

// gatewayAbove puts the gateway's SERVER span and one CLIENT attempt above the engine's
// SERVER span "chat m1" (the contract's caller spans).
func gatewayAbove(attemptAttrs map[string]any) []mutation {
	return []mutation{
		edit("chat m1", func(d *tracetest.SpanDef) { d.Parent = spanname.GatewayAttempt }),
		add(tracetest.SpanDef{Name: spanname.GatewayRequest, Service: "cb-gateway", Kind: ptrace.SpanKindServer, StartMs: -2, EndMs: 183,
			Attrs: map[string]any{"http.request.method": "POST", "http.route": "/v1/chat/completions", "route.policy": "kv-aware",
				"route.engine": "127.0.0.1:8001", "route.score": 0.5, "route.expected_hit_tokens": int64(512)}}),
		add(tracetest.SpanDef{Name: spanname.GatewayAttempt, Service: "cb-gateway", Kind: ptrace.SpanKindClient, Parent: spanname.GatewayRequest,
			StartMs: -1, EndMs: 182, Attrs: attemptAttrs}),
	}
}

func TestCheckGatewayAboveTheRoot(t *testing.T) {
	td := request(tracetest.Request{RequestID: "r1"}, gatewayAbove(map[string]any{"route.engine": "127.0.0.1:8001", "route.attempt": int64(1)})...)
	rep := Check(FromPtrace(td), spec(t))
	if !rep.OK() || rep.Traces[0].Kind != "request" || rep.Traces[0].Root != spanname.GatewayRequest ||
		len(rep.Traces[0].Notes) != 1 || !strings.Contains(rep.Traces[0].Notes[0], "the contract's caller above it") {
		t.Fatalf("the gateway above the SERVER span:\n%s", rep)
	}
}

func TestCheckGatewaySpansAreChecked(t *testing.T) {
	// The attempt lacks route.engine: a caller span's attributes are checked too.
	td := request(tracetest.Request{RequestID: "r1"}, gatewayAbove(map[string]any{"route.attempt": int64(1)})...)
	rep := Check(FromPtrace(td), spec(t))
	if rep.OK() || !strings.Contains(strings.Join(rules(rep.Traces[0]), ","), string(RuleAttrMissing)+" "+spanname.GatewayAttempt) {
		t.Fatalf("a gateway attempt without route.engine passed:\n%s", rep)
	}
	// The gateway's SERVER span without its attempt: the attempt is required under it.
	ms := append(gatewayAbove(map[string]any{"route.engine": "e", "route.attempt": int64(1)}),
		drop(spanname.GatewayAttempt), edit("chat m1", func(d *tracetest.SpanDef) { d.Parent = spanname.GatewayRequest }))
	rep = Check(FromPtrace(request(tracetest.Request{RequestID: "r1"}, ms...)), spec(t))
	got := strings.Join(rules(rep.Traces[0]), ",")
	if rep.OK() || !strings.Contains(got, string(RuleMissing)+" "+spanname.GatewayAttempt) || !strings.Contains(got, string(RuleParent)+" chat m1") {
		t.Fatalf("the engine's SERVER span right under the gateway's SERVER span passed:\n%s", rep)
	}
}

func TestCheckGatewayOnlyTraceSkipped(t *testing.T) {
	// No engine could be reached: the trace holds the gateway's spans only.
	defs := []tracetest.SpanDef{
		{Name: spanname.GatewayRequest, Service: "cb-gateway", Kind: ptrace.SpanKindServer, StartMs: 0, EndMs: 5,
			Attrs: map[string]any{"http.request.method": "POST", "http.route": "/v1/chat/completions", "route.policy": "kv-aware",
				"route.engine": "", "route.score": 0.0, "route.expected_hit_tokens": int64(0), "error.type": "worker_unavailable"}},
	}
	rep := Check(FromPtrace(tracetest.Build(tracetest.Request{RequestID: "r1"}, defs)), spec(t))
	if len(rep.Traces) != 1 || !rep.Traces[0].Skipped || len(rep.Traces[0].Violations) != 0 {
		t.Fatalf("a gateway-only trace:\n%s", rep)
	}
}
