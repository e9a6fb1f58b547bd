package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/prometheus/client_golang/prometheus"
)

// GatewayRequestRecord describes one request the gateway finished, for
// GatewayMetrics.RecordRequest.
type GatewayRequestRecord struct {
	// Operation is the GenAI operation, "chat" or "text_completion"; "" for a request that is
	// no generation (documents, models): only cb_gateway_request_duration_seconds is recorded.
	Operation string
	// Model is the requested model name (a capped label).
	Model string
	// Policy is the routing policy: "kv-aware", "least-loaded" or "round-robin".
	Policy string
	// Engine is the engine that answered last (host:port, a capped label); "" when none did.
	Engine string
	// Status is the HTTP status sent to the client (499 when it went away).
	Status int
	// ErrorType is "" on success, else one of the contract's error_type values of
	// gen_ai_server_request_duration_seconds.
	ErrorType string
	// E2E is the time from receipt to the end of the response.
	E2E time.Duration
	// TTFT is the time from receipt to the first content forwarded; meaningful when HasTTFT.
	TTFT    time.Duration
	HasTTFT bool
	// OutputTokens is the number of generated tokens (from the response's usage, else the
	// content events forwarded); TPOT is recorded when it is at least 2.
	OutputTokens int
}

// GatewayEngineStats is the gateway's view of one engine, for GatewayMetrics.SetEngine.
type GatewayEngineStats struct {
	// Up is the result of the last health check.
	Up bool
	// InFlight is the requests the gateway has in flight on the engine.
	InFlight int
	// Load is the load the routing policies see.
	Load float64
	// IndexSequences and IndexBytes are the size of the engine's reuse index.
	IndexSequences, IndexBytes int
}

// GatewayMetrics records the instruments the contract assigns to cb-gateway: the GenAI request
// histograms and the HTTP server histogram as seen at the gateway (so `cb load` cross-checks
// against it as against an engine), the gateway's request duration by policy, engine and
// status, routing decisions, expected reuse, attempts and failovers, rejections, the queue,
// and per-engine health, in-flight requests, load and index size. The engine label is capped
// (WithLabelCap; default 64 values). Record methods return nothing; a record they cannot take
// (a reason or policy outside the contract, a negative value) is refused whole as described on
// Registry. Safe for concurrent use.
type GatewayMetrics struct {
	facade
	genAI genAIRequests

	http, duration                                 *Histogram
	queueWait                                      *HistogramSeries
	decisions, expectedHit, promptTokens, attempts *Counter
	failovers, rejections, healthChecks            *Counter
	up, inFlight, load, indexSeqs, indexBytes      *Gauge
	queueWaiting                                   *series
}

// NewGatewayMetrics registers the gateway's contract instruments on reg. Options: WithContract
// (default: the embedded contract), WithLabelCap (default 64), WithOnRefused (default: refusals
// are only counted).
func NewGatewayMetrics(reg prometheus.Registerer, opts ...Option) (*GatewayMetrics, error) {
	return newFacade("gateway", reg, opts, func(b *builder) *GatewayMetrics {
		m := &GatewayMetrics{
			facade:       facade{b.r},
			genAI:        newGenAIRequests(b),
			http:         b.histogram(NameHTTPDuration),
			duration:     b.histogram("cb_gateway_request_duration_seconds"),
			queueWait:    b.histogramSeries("cb_gateway_queue_wait_seconds"),
			decisions:    b.counter("cb_gateway_routing_decisions_total"),
			expectedHit:  b.counter("cb_gateway_expected_hit_tokens_total"),
			promptTokens: b.counter("cb_gateway_prompt_tokens_total"),
			attempts:     b.counter("cb_gateway_attempts_total"),
			failovers:    b.counter("cb_gateway_failovers_total"),
			rejections:   b.counter("cb_gateway_rejections_total"),
			healthChecks: b.counter("cb_gateway_health_checks_total"),
			up:           b.gauge("cb_gateway_engine_up"),
			inFlight:     b.gauge("cb_gateway_engine_in_flight"),
			load:         b.gauge("cb_gateway_engine_load"),
			indexSeqs:    b.gauge("cb_gateway_index_sequences"),
			indexBytes:   b.gauge("cb_gateway_index_bytes"),
			queueWaiting: b.gaugeSeries("cb_gateway_queue_waiting"),
		}
		// The rejection reasons are fixed: resolve them so a contract lacking one fails here.
		b.enum(contract.Counter, "cb_gateway_rejections_total", []string{"queue_full", "queue_timeout", "no_engine"})
		return m
	})
}

// RecordRequest records one finished request: cb_gateway_request_duration_seconds always; for
// a generation (Operation set) gen_ai_server_request_duration_seconds (error_type =
// r.ErrorType) and, when it succeeded with a first token, TTFT and (with at least two output
// tokens) TPOT = (E2E − TTFT)/(n − 1). A sampled span context in ctx (which may be nil) becomes
// the exemplar. Negative durations or counts, or a TTFT after E2E, refuse the record whole.
func (m *GatewayMetrics) RecordRequest(ctx context.Context, r GatewayRequestRecord) {
	if err := checkRequest("gateway request record", r.E2E, r.TTFT, r.HasTTFT, r.OutputTokens); err != nil {
		m.reg.sink.refuse(err)
		return
	}
	code, _ := statusLabel(r.Status)
	m.duration.ObserveContext(ctx, r.E2E.Seconds(), r.Policy, r.Engine, code)
	if r.Operation == "" {
		return
	}
	m.genAI.duration.ObserveContext(ctx, r.E2E.Seconds(), r.Operation, r.Model, r.ErrorType)
	if r.ErrorType == "" && r.HasTTFT {
		m.genAI.ttft.ObserveContext(ctx, r.TTFT.Seconds(), r.Operation, r.Model)
		if r.OutputTokens >= 2 {
			m.genAI.tpot.ObserveContext(ctx, timePerToken(r.E2E, r.TTFT, r.OutputTokens).Seconds(), r.Operation, r.Model)
		}
	}
}

// RecordHTTP records one HTTP request served by the gateway, as EngineMetrics.RecordHTTP.
func (m *GatewayMetrics) RecordHTTP(method, route string, status int, seconds float64) {
	recordHTTP(m.http, method, route, status, seconds)
}

// RouteDecision counts one routing decision: the policy, the chosen engine, the reason
// ("reuse", "spread", "load" or "rotation"), and the prompt tokens routed to the engine with
// those the gateway expected it to reuse.
func (m *GatewayMetrics) RouteDecision(policy, engine, reason string, promptTokens, expectedHitTokens int) {
	if promptTokens < 0 || expectedHitTokens < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: gateway route decision: %w", ErrNegative))
		return
	}
	m.decisions.Inc(policy, engine, reason)
	m.promptTokens.Add(float64(promptTokens), engine)
	m.expectedHit.Add(float64(expectedHitTokens), engine)
}

// Attempt counts one forwarding attempt to engine by result: "ok" (a response was forwarded),
// "unreachable", "unavailable" (503), "queue_full" (429) or "broken" (lost mid-stream).
func (m *GatewayMetrics) Attempt(engine, result string) { m.attempts.Inc(engine, result) }

// Failover counts a request retried on another engine after engine failed with reason
// ("unreachable", "unavailable" or "queue_full").
func (m *GatewayMetrics) Failover(engine, reason string) { m.failovers.Inc(engine, reason) }

// Rejection counts a request the gateway answered itself: "queue_full" (429), "queue_timeout"
// or "no_engine" (503).
func (m *GatewayMetrics) Rejection(reason string) { m.rejections.Inc(reason) }

// QueueWait records the time a request waited for an engine slot (0 when one was free).
func (m *GatewayMetrics) QueueWait(d time.Duration) { m.queueWait.Observe(d.Seconds()) }

// SetQueueWaiting sets the number of requests waiting in the gateway's queue.
func (m *GatewayMetrics) SetQueueWaiting(n int) {
	if n < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: gateway queue waiting %d: %w", n, ErrNegative))
		return
	}
	m.queueWaiting.gauge.Set(float64(n))
}

// HealthCheck counts one health check of engine.
func (m *GatewayMetrics) HealthCheck(engine string, ok bool) {
	result := "fail"
	if ok {
		result = "ok"
	}
	m.healthChecks.Inc(engine, result)
}

// SetEngine sets the per-engine gauges from the gateway's view of engine. Negative counts
// refuse the snapshot whole.
func (m *GatewayMetrics) SetEngine(engine string, s GatewayEngineStats) {
	if s.InFlight < 0 || s.Load < 0 || s.IndexSequences < 0 || s.IndexBytes < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: gateway engine stats %+v: %w", s, ErrNegative))
		return
	}
	up := 0.0
	if s.Up {
		up = 1
	}
	m.up.Set(up, engine)
	m.inFlight.Set(float64(s.InFlight), engine)
	m.load.Set(s.Load, engine)
	m.indexSeqs.Set(float64(s.IndexSequences), engine)
	m.indexBytes.Set(float64(s.IndexBytes), engine)
}
