package metrics

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/prometheus/client_golang/prometheus"
)

// RequestRecord describes one finished generation request for EngineMetrics.RecordRequest.
type RequestRecord struct {
	// Operation is the GenAI operation: "chat" or "text_completion" (another value refuses
	// the record).
	Operation string
	// Model is the requested model name (a capped label).
	Model string
	// TTFT is the time from receipt to the first output token; meaningful when HasTTFT.
	TTFT time.Duration
	// HasTTFT is true when a first token was produced.
	HasTTFT bool
	// E2E is the time from receipt to the end of the request (success or failure).
	E2E time.Duration
	// PromptTokens is the number of prompt tokens.
	PromptTokens int
	// OutputTokens is the number of generated tokens n.
	OutputTokens int
	// ErrorType is "" on success, else one of the contract's error_type values
	// (invalid_request, unauthorized, not_found, payload_too_large, queue_full,
	// worker_unavailable, timeout, canceled, internal); another value refuses the record.
	ErrorType string
}

// EngineStats is the scheduler's snapshot feeding EngineMetrics.SetEngine.
type EngineStats struct {
	// Waiting is the queue depth; Running the sequences in the running batch.
	Waiting, Running int
	// KVFree, KVUsed and KVCached are KV blocks by state; they must sum to KVTotal, the pool.
	KVFree, KVUsed, KVCached, KVTotal int
	// Evictions and Preemptions are running totals since the engine started.
	Evictions, Preemptions uint64
	// BatchTokens is the number of tokens in the last step batch.
	BatchTokens int
	// PrefixHitRatio is the lifetime fraction of prompt tokens served from cache, in [0, 1].
	PrefixHitRatio float64
}

// EngineMetrics records every instrument the contract assigns to cb-engine: GenAI request
// latencies (TTFT, TPOT, request duration, with trace exemplars), token counters, the HTTP
// server histogram, scheduler gauges, lookup fallbacks and KV hand-overs. Its record methods
// return nothing; a record they cannot take is refused whole (nothing recorded, counted in
// Registry().RecordStats(), reported to Config.OnRefused) as described on Registry. Safe for
// concurrent use.
type EngineMetrics struct {
	facade
	requests  engineRequests
	http      *Histogram
	scheduler schedulerSeries
	fallbacks enumSeries // one series per fallbackReasons
	handoff   kvHandoff
}

// engineRequests measures finished generation requests: the GenAI latency histograms and the
// token counters, with a cache of the series of each (operation, model) pair.
type engineRequests struct {
	genAIRequests
	promptTokens, genTokens *Counter

	// cache maps (operation, model) to the series a successful request records into, so
	// RecordRequest does one lock-free lookup instead of five.
	cache  trie[*requestSeries]
	mu     sync.Mutex // serialises cache inserts and cached
	cached int
}

// requestSeries are the series of one (operation, model) pair.
type requestSeries struct {
	ttft, tpot, durationOK, prompt, gen *series
}

// schedulerSeries measure the scheduler: queue, batch, KV blocks by state, prefix cache hits,
// evictions and preemptions.
type schedulerSeries struct {
	mu                                               sync.Mutex // serialises SetEngine so its check-then-set is atomic
	waiting, running, kvPool, batchTokens, prefixHit *series
	kvFree, kvUsed, kvCached                         *series
	evictions, preemptions                           *series
}

// fallbackReasons are the reason values of cb_engine_lookup_fallbacks_total.
var fallbackReasons = [...]string{"error", "timeout", "unavailable", "queue_full"}

// NewEngineMetrics registers the engine's contract instruments on reg and resolves every series
// whose label values are fixed (scheduler gauges, KV blocks by state, fallback reasons, KV
// hand-over directions); a contract that lacks one of them is an error here, so a running
// facade has nothing left to fail on. Options: WithContract (default: the embedded contract),
// WithLabelCap (default 64), WithOnRefused (default: refusals are only counted).
func NewEngineMetrics(reg prometheus.Registerer, opts ...Option) (*EngineMetrics, error) {
	return newFacade("engine", reg, opts, func(b *builder) *EngineMetrics {
		return &EngineMetrics{
			facade: facade{b.r},
			requests: engineRequests{
				genAIRequests: newGenAIRequests(b),
				promptTokens:  b.counter("cb_engine_prompt_tokens_total"),
				genTokens:     b.counter("cb_engine_generation_tokens_total"),
			},
			http: b.histogram(NameHTTPDuration),
			scheduler: schedulerSeries{
				waiting:     b.gaugeSeries("cb_engine_requests_waiting"),
				running:     b.gaugeSeries("cb_engine_requests_running"),
				kvPool:      b.gaugeSeries("cb_engine_kv_pool_blocks"),
				batchTokens: b.gaugeSeries("cb_engine_batch_tokens"),
				prefixHit:   b.gaugeSeries("cb_engine_prefix_cache_hit_ratio"),
				kvFree:      b.gaugeSeries("cb_engine_kv_blocks", "free"),
				kvUsed:      b.gaugeSeries("cb_engine_kv_blocks", "used"),
				kvCached:    b.gaugeSeries("cb_engine_kv_blocks", "cached"),
				evictions:   b.counterSeries("cb_engine_kv_evictions_total"),
				preemptions: b.counterSeries("cb_engine_preemptions_total"),
			},
			fallbacks: b.enum(contract.Counter, "cb_engine_lookup_fallbacks_total", fallbackReasons[:]),
			handoff:   newKVHandoff(b),
		}
	})
}

// RecordRequest records one finished request: the request duration always (error_type =
// r.ErrorType); for a successful request with a first token, TTFT; and, when it produced
// n ≥ 2 tokens, TPOT = (E2E − TTFT)/(n − 1). Prompt and output tokens are counted. When ctx
// (which may be nil) carries a sampled span context the latency observations carry a
// {trace_id, span_id} exemplar. The model is a capped label: beyond the cap, or when not valid
// UTF-8, it is recorded as OtherValue. The record is validated first and refused whole, with
// nothing recorded (see Registry), for an operation or error type outside the contract
// (*LabelError: a programming error), negative durations or counts (ErrNegative) or a TTFT
// after E2E (ErrInvalidRecord). Into existing series, without a sampled span, it allocates
// nothing.
func (m *EngineMetrics) RecordRequest(ctx context.Context, r RequestRecord) {
	if err := checkRequest("request record", r.E2E, r.TTFT, r.HasTTFT, r.PromptTokens, r.OutputTokens); err != nil {
		m.reg.sink.refuse(err)
		return
	}
	q := &m.requests
	var dur *series
	if r.ErrorType != "" { // validates the error type before anything is created
		var err error
		if dur, err = q.duration.in.lookup([]string{r.Operation, r.Model, r.ErrorType}); err != nil {
			m.reg.sink.refuse(err)
			return
		}
	}
	rs, err := q.series(r.Operation, r.Model)
	if err != nil {
		m.reg.sink.refuse(err)
		return
	}
	if dur == nil {
		dur = rs.durationOK
	}
	sc := spanOf(ctx)
	if r.ErrorType == "" && r.HasTTFT {
		rs.ttft.observeSpan(sc, q.ttft.in.exemplars, r.TTFT.Seconds())
		if r.OutputTokens >= 2 {
			rs.tpot.observeSpan(sc, q.tpot.in.exemplars, timePerToken(r.E2E, r.TTFT, r.OutputTokens).Seconds())
		}
	}
	if r.PromptTokens > 0 {
		rs.prompt.counter.Add(float64(r.PromptTokens))
	}
	if r.OutputTokens > 0 {
		rs.gen.counter.Add(float64(r.OutputTokens))
	}
	// The duration is observed last: its count is the request count, so a
	// scrape that counts the request also sees its TTFT, TPOT and tokens
	// (cb load settles on that count before it reads the histograms).
	dur.observeSpan(sc, q.duration.in.exemplars, r.E2E.Seconds())
}

// series returns the series bundle of (op, model), resolving and caching it on first use.
// Models beyond the label cap resolve to the OtherValue series and are not cached.
func (q *engineRequests) series(op, model string) (*requestSeries, error) {
	if rs, ok := q.cache.get([]string{op, model}); ok {
		return rs, nil
	}
	return q.resolve(op, model)
}

// resolve is the slow path of series (the key escapes).
func (q *engineRequests) resolve(op, model string) (*requestSeries, error) {
	key := []string{op, model}
	var rs requestSeries
	stable := true
	for _, x := range []struct {
		dst *(*series)
		in  *instrument
		lvs []string
	}{
		{&rs.durationOK, q.duration.in, []string{op, model, ""}},
		{&rs.ttft, q.ttft.in, key},
		{&rs.tpot, q.tpot.in, key},
		{&rs.prompt, q.promptTokens.in, []string{model}},
		{&rs.gen, q.genTokens.in, []string{model}},
	} {
		s, ok, err := x.in.lookupStable(x.lvs)
		if err != nil {
			return nil, err
		}
		*x.dst, stable = s, stable && ok
	}
	if stable {
		q.mu.Lock()
		if _, ok := q.cache.get(key); !ok && q.cached < maxCachedSeries {
			q.cache.insert(key, &rs)
			q.cached++
		}
		q.mu.Unlock()
	}
	return &rs, nil
}

// RecordHTTP records one HTTP server request: method (anything but the standard methods is
// recorded as "_OTHER", per HTTP semantic conventions), route (the matched route template, a
// capped label: beyond the cap or not valid UTF-8 it is recorded as OtherValue), status (a
// capped label; a code outside 100–599 is recorded as OtherValue and counted in
// RecordStats.InvalidLabelValues) and its duration in seconds. A negative, NaN or infinite
// duration refuses the record (see Registry). Into an existing series it allocates nothing.
func (m *EngineMetrics) RecordHTTP(method, route string, status int, seconds float64) {
	recordHTTP(m.http, method, route, status, seconds)
}

// SetEngine sets the scheduler gauges from one snapshot and advances the eviction and
// preemption counters to the snapshot's running totals. The snapshot is refused whole, with
// nothing recorded (see Registry), when a count is negative (ErrNegative), free + used +
// cached != total or the ratio is outside [0, 1] (ErrInvalidRecord), or a running total is
// lower than the previous one (ErrCounterDecrease).
func (m *EngineMetrics) SetEngine(s EngineStats) {
	m.reg.sink.refuseErr(m.scheduler.set(s))
}

func (c *schedulerSeries) set(s EngineStats) error {
	if s.Waiting < 0 || s.Running < 0 || s.KVFree < 0 || s.KVUsed < 0 || s.KVCached < 0 || s.KVTotal < 0 || s.BatchTokens < 0 {
		return fmt.Errorf("metrics: engine stats %+v: %w", s, ErrNegative)
	}
	if s.KVFree+s.KVUsed+s.KVCached != s.KVTotal {
		return fmt.Errorf("metrics: engine stats: kv blocks free %d + used %d + cached %d != pool %d: %w",
			s.KVFree, s.KVUsed, s.KVCached, s.KVTotal, ErrInvalidRecord)
	}
	if math.IsNaN(s.PrefixHitRatio) || s.PrefixHitRatio < 0 || s.PrefixHitRatio > 1 {
		return fmt.Errorf("metrics: engine stats: prefix hit ratio %v outside [0, 1]: %w", s.PrefixHitRatio, ErrInvalidRecord)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := setTotals(runningTotal{c.evictions, s.Evictions}, runningTotal{c.preemptions, s.Preemptions}); err != nil {
		return err
	}
	c.waiting.gauge.Set(float64(s.Waiting))
	c.running.gauge.Set(float64(s.Running))
	c.kvFree.gauge.Set(float64(s.KVFree))
	c.kvUsed.gauge.Set(float64(s.KVUsed))
	c.kvCached.gauge.Set(float64(s.KVCached))
	c.kvPool.gauge.Set(float64(s.KVTotal))
	c.batchTokens.gauge.Set(float64(s.BatchTokens))
	c.prefixHit.gauge.Set(s.PrefixHitRatio)
	return nil
}

// LookupFallback counts a request scheduled without a lookup result; reason is "error",
// "timeout", "unavailable" or "queue_full" (the scheduler's reasons, passed on as they come). Another
// reason is a programming error and is refused (a *LabelError; see Registry). Its signature
// fits scheduler.Deps.OnFallback.
func (m *EngineMetrics) LookupFallback(reason string) {
	if i := slices.Index(fallbackReasons[:], reason); i >= 0 {
		m.fallbacks.ss[i].counter.Inc()
		return
	}
	m.fallbacks.refuse(reason)
}
