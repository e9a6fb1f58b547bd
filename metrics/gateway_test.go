package metrics

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// exerciseGateway drives every method of the gateway facade once, so that every instrument
// appears in the exposition, and checks that none of it was refused.
func exerciseGateway(t testing.TB, g *GatewayMetrics) {
	t.Helper()
	ctx := context.Background()
	g.RecordRequest(ctx, GatewayRequestRecord{Operation: "chat", Model: "m1", Policy: "kv-aware", Engine: "127.0.0.1:8001",
		Status: 200, E2E: time.Second, TTFT: 200 * time.Millisecond, HasTTFT: true, OutputTokens: 5})
	g.RecordRequest(ctx, GatewayRequestRecord{Policy: "round-robin", Engine: "127.0.0.1:8002", Status: 200, E2E: time.Second})
	g.RecordHTTP("POST", "/v1/chat/completions", 200, 1.0)
	g.RouteDecision("kv-aware", "127.0.0.1:8001", "reuse", 1000, 900)
	g.Attempt("127.0.0.1:8001", "ok")
	g.Failover("127.0.0.1:8002", "unreachable")
	g.Rejection("queue_full")
	g.QueueWait(3 * time.Millisecond)
	g.SetQueueWaiting(2)
	g.HealthCheck("127.0.0.1:8001", true)
	g.SetEngine("127.0.0.1:8001", GatewayEngineStats{Up: true, InFlight: 3, Load: 3.25, IndexSequences: 4, IndexBytes: 16000})
	if st := g.Registry().RecordStats(); st != (RecordStats{}) {
		t.Fatalf("gateway: %+v after exercising every method with valid records", st)
	}
}

func TestGatewayMetricsRecords(t *testing.T) {
	reg := prometheus.NewRegistry()
	var refused []error
	g, err := NewGatewayMetrics(reg, WithOnRefused(func(err error) { refused = append(refused, err) }))
	if err != nil {
		t.Fatal(err)
	}
	exerciseGateway(t, g)
	body, _ := scrape(t, reg, acceptText)
	for _, want := range []string{
		`gen_ai_server_time_to_first_token_seconds_count{gen_ai_operation_name="chat",gen_ai_request_model="m1"} 1`,
		`gen_ai_server_time_per_output_token_seconds_sum{gen_ai_operation_name="chat",gen_ai_request_model="m1"} 0.2`,
		`cb_gateway_request_duration_seconds_count{engine="127.0.0.1:8001",policy="kv-aware",status="200"} 1`,
		`cb_gateway_routing_decisions_total{engine="127.0.0.1:8001",policy="kv-aware",reason="reuse"} 1`,
		`cb_gateway_expected_hit_tokens_total{engine="127.0.0.1:8001"} 900`,
		`cb_gateway_rejections_total{reason="queue_timeout"} 0`,
		`cb_gateway_engine_up{engine="127.0.0.1:8001"} 1`,
		`cb_gateway_engine_load{engine="127.0.0.1:8001"} 3.25`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("exposition lacks %s", want)
		}
	}
	// Only generations feed the GenAI histograms (one chat request above).
	if strings.Contains(body, `gen_ai_server_request_duration_seconds_count{error_type="",gen_ai_operation_name="",`) {
		t.Error("a non-generation request was recorded as a GenAI request")
	}
	// Refusals: a reason outside the contract, a negative count, a TTFT after the end.
	g.RouteDecision("kv-aware", "e", "luck", 1, 1)
	g.RouteDecision("kv-aware", "e", "reuse", -1, 0)
	g.RecordRequest(context.Background(), GatewayRequestRecord{Operation: "chat", Policy: "kv-aware", Status: 200, E2E: time.Millisecond, TTFT: time.Second, HasTTFT: true})
	g.SetEngine("e", GatewayEngineStats{InFlight: -1})
	if len(refused) != 4 {
		t.Fatalf("refused %d records, want 4: %v", len(refused), refused)
	}
	var le *LabelError
	if !errors.As(refused[0], &le) || !errors.Is(refused[1], ErrNegative) || !errors.Is(refused[2], ErrInvalidRecord) {
		t.Fatalf("refusals %v", refused)
	}
}
