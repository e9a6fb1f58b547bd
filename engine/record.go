package engine

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/scheduler"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/telemetry"
)

// TokenEventEvery is the interval, in output tokens, of the "token" events
// on engine.decode.
const TokenEventEvery = 32

// genRecord is what the serve loop learns about one generation request.
type genRecord struct {
	op, model, id string
	t0            time.Time
	stream        bool
	status        int
	apiErr        *api.Error
	cause         error // the underlying error, for the span
	h             *scheduler.Handle
	promptTokens  int
	maxTokens     int
	ts            *textStream // the completion text, for content capture
	// seed is the sampling seed (the client's, or generated when
	// seedGenerated); set (seeded) once the request was decoded.
	seed                  int64
	seeded, seedGenerated bool
}

// fail records apiErr and sends it, unless the client is gone (499). A 503
// without a Retry-After gets WorkerRetryAfter: the engine serves again
// within a second of its worker's return.
func (rec *genRecord) fail(w http.ResponseWriter, apiErr *api.Error, cause error) {
	if apiErr.Status == http.StatusServiceUnavailable && apiErr.RetryAfter == 0 {
		apiErr = apiErr.WithRetryAfter(WorkerRetryAfter)
	}
	rec.apiErr, rec.status, rec.cause = apiErr, apiErr.Status, cause
	if apiErr.Status != api.StatusClientClosedRequest {
		apiErr.Write(w)
	}
}

// endGenerate records the request: engine spans, SERVER span attributes and
// status, the request metrics, and the JSON log line (inside the SERVER
// span), then ends the SERVER span.
func (e *Engine) endGenerate(ctx context.Context, span *telemetry.Span, rec *genRecord, w *statusWriter) {
	var res scheduler.Result
	if rec.h != nil {
		// A request the handler gave up on (its context is cancelled by
		// now) is still being finished by the scheduler, which ends its
		// cb.request: the SERVER span ends after it.
		e.awaitFinish(rec)
		res = rec.h.Snapshot()
	}
	end := time.Now()
	status := rec.status
	if status == 0 {
		status = w.Status
	}
	errType := ""
	if rec.apiErr != nil {
		errType = rec.apiErr.ErrorType
	}
	nOut := len(res.Tokens)
	if res.Done && !res.Admitted.IsZero() {
		e.drain.finished(res.Finished)
	}

	if rec.h != nil {
		e.engineSpans(ctx, rec, res, end)
	}
	attrs := []attribute.KeyValue{
		attribute.Int("http.response.status_code", status),
		attribute.Int("gen_ai.usage.input_tokens", rec.promptTokens),
		attribute.Int("gen_ai.usage.output_tokens", nOut),
		attribute.String("gen_ai.response.id", rec.id),
		attribute.Bool("stream", rec.stream),
	}
	if rec.maxTokens > 0 {
		attrs = append(attrs, attribute.Int("gen_ai.request.max_tokens", rec.maxTokens))
	}
	if rec.seeded {
		attrs = append(attrs, attribute.Int64("gen_ai.request.seed", rec.seed), attribute.Bool("seed_generated", rec.seedGenerated))
	}
	if res.FinishReason != "" && errType == "" {
		attrs = append(attrs, attribute.StringSlice("gen_ai.response.finish_reasons", []string{res.FinishReason}))
	}
	span.SetAttributes(attrs...)
	if e.cfg.CaptureContent && rec.ts != nil {
		span.AddEvent("gen_ai.choice", trace.WithAttributes(
			attribute.String("gen_ai.response.finish_reason", res.FinishReason),
			attribute.String("gen_ai.completion", rec.ts.all())))
	}
	switch {
	case status >= 500:
		cause := rec.cause
		if cause == nil && rec.apiErr != nil {
			cause = errors.New(rec.apiErr.Message)
		}
		span.SetError(errType, cause)
	case errType != "":
		span.SetAttributes(telemetry.ErrorTypeKey.String(errType))
	}

	mrec := metrics.RequestRecord{
		Operation: rec.op, Model: rec.model, E2E: end.Sub(rec.t0),
		PromptTokens: rec.promptTokens, OutputTokens: nOut, ErrorType: errType,
	}
	// TTFT as measured: the first token's time and t0 are both read from the
	// monotonic clock, so it lies in [0, E2E] without any repair (a value
	// that did not would be refused and counted by the metrics, not hidden).
	if len(res.TokenTimes) > 0 {
		mrec.TTFT, mrec.HasTTFT = res.TokenTimes[0].Sub(rec.t0), true
	}
	e.metrics.RecordRequest(ctx, mrec)
	e.logGenerate(ctx, rec, res, status, mrec)
	span.End(trace.WithTimestamp(end))
}

// awaitFinish waits, at most finishWait, for the scheduler to finish rec's
// request; a finished one (every request that was not given up) costs no
// timer.
func (e *Engine) awaitFinish(rec *genRecord) {
	select {
	case <-rec.h.Done():
		return
	default:
	}
	t := time.NewTimer(finishWait)
	defer t.Stop()
	select {
	case <-rec.h.Done():
	case <-t.C:
		e.log.Warn("the scheduler did not finish an abandoned request in time", "request_id", rec.id, "waited", finishWait)
	}
}

// finishWait bounds endGenerate's wait for the scheduler to finish a
// request whose context was cancelled (it does at its next step).
const finishWait = 2 * time.Second

// logGenerate writes the request's JSON log line (inside the SERVER span of
// ctx) from its record, result, status and metrics record.
func (e *Engine) logGenerate(ctx context.Context, rec *genRecord, res scheduler.Result, status int, mrec metrics.RequestRecord) {
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelError
	}
	logAttrs := []slog.Attr{
		slog.String("request_id", rec.id),
		slog.String("operation", rec.op),
		slog.String("model", rec.model),
		slog.Int("status", status),
		slog.String("error_type", mrec.ErrorType),
		slog.Bool("stream", rec.stream),
		slog.Float64("duration_s", mrec.E2E.Seconds()),
		slog.Int("prompt_tokens", rec.promptTokens),
		slog.Int("completion_tokens", mrec.OutputTokens),
	}
	if rec.seeded {
		logAttrs = append(logAttrs, slog.Int64("seed", rec.seed), slog.Bool("seed_generated", rec.seedGenerated))
	}
	if mrec.HasTTFT {
		logAttrs = append(logAttrs, slog.Float64("ttft_s", mrec.TTFT.Seconds()))
	} else {
		logAttrs = append(logAttrs, slog.Any("ttft_s", nil))
	}
	if res.FinishReason != "" {
		logAttrs = append(logAttrs, slog.String("finish_reason", res.FinishReason))
	}
	if rec.h != nil {
		logAttrs = append(logAttrs,
			// cached_tokens as in the response's usage (prefix cache +
			// CacheBlend reuse); prefix_cache_tokens the engine's own
			// prefix-cache share, reused_tokens the blend server's.
			slog.Int("cached_tokens", usage(res.PromptTokens, res).PromptTokensDetails.CachedTokens),
			slog.Int("prefix_cache_tokens", res.CachedTokens),
			slog.Int("reused_tokens", res.ReusedTokens),
			slog.Int("preemptions", res.Preemptions))
		if res.Fallback != "" {
			logAttrs = append(logAttrs, slog.String("lookup_fallback", res.Fallback))
		}
	}
	if rec.apiErr != nil {
		logAttrs = append(logAttrs, slog.String("error", rec.apiErr.Message))
	}
	e.log.LogAttrs(ctx, level, "request", logAttrs...)
}

// engineSpans records engine.queue, engine.prefill and engine.decode from
// the times the scheduler stamped.
func (e *Engine) engineSpans(ctx context.Context, rec *genRecord, res scheduler.Result, end time.Time) {
	stopAt := end
	if !res.Finished.IsZero() {
		stopAt = res.Finished
	}
	queueEnd := res.Admitted
	if queueEnd.IsZero() {
		queueEnd = stopAt
	}
	_, q := e.spans.Start(ctx, spanname.EngineQueue, trace.WithTimestamp(rec.t0))
	q.End(trace.WithTimestamp(queueEnd))
	if res.Admitted.IsZero() {
		return
	}
	prefillEnd := stopAt
	if len(res.TokenTimes) > 0 {
		prefillEnd = res.TokenTimes[0]
	}
	if res.Transfer == nil { // a request taken over was prefilled by another engine
		_, p := e.spans.Start(ctx, spanname.EnginePrefill, trace.WithTimestamp(res.Admitted), trace.WithAttributes(
			attribute.Int("n_prompt_tokens", res.PromptTokens),
			attribute.Int("prefix_cache_tokens", res.CachedTokens),
			attribute.Int("reused_tokens", res.ReusedTokens),
		))
		p.End(trace.WithTimestamp(prefillEnd))
	}
	if len(res.TokenTimes) < 2 {
		return
	}
	_, d := e.spans.Start(ctx, spanname.EngineDecode, trace.WithTimestamp(res.TokenTimes[0]))
	for i := TokenEventEvery - 1; i < len(res.TokenTimes); i += TokenEventEvery {
		d.AddEvent("token", trace.WithTimestamp(res.TokenTimes[i]), trace.WithAttributes(attribute.Int("n", i+1)))
	}
	d.SetAttributes(attribute.Int("n_tokens", len(res.TokenTimes)), attribute.Int("preemptions", res.Preemptions))
	d.End(trace.WithTimestamp(stopAt))
}

// captureInput records the request's messages (or prompt) as span events,
// per the GenAI semantic conventions' content capture. Only called when the
// operator opted in (Config.CaptureContent): by default no prompt or
// completion text reaches spans, logs or metrics.
func captureInput(span *telemetry.Span, g *api.Generation, promptText string) {
	if len(g.Messages) == 0 {
		span.AddEvent("gen_ai.prompt", trace.WithAttributes(attribute.String("gen_ai.prompt", promptText)))
		return
	}
	for _, m := range g.Messages {
		span.AddEvent("gen_ai."+m.Role+".message", trace.WithAttributes(
			attribute.String("gen_ai.message.role", m.Role), attribute.String("gen_ai.message.content", m.Content)))
	}
}
