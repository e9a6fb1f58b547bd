package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/scheduler"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
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
}

// fail records apiErr and sends it, unless the client is gone (499).
func (rec *genRecord) fail(w http.ResponseWriter, apiErr *api.Error, cause error) {
	rec.apiErr, rec.status, rec.cause = apiErr, apiErr.Status, cause
	if apiErr.Status != api.StatusClientClosedRequest {
		apiErr.Write(w)
	}
}

// serveGenerate serves POST /v1/chat/completions and /v1/completions.
func (e *Engine) serveGenerate(w *statusWriter, r *http.Request, op, route string, t0 time.Time) {
	prefix := "cmpl-"
	if op == api.OperationChat {
		prefix = "chatcmpl-"
	}
	rec := &genRecord{op: op, id: newID(prefix), t0: t0}
	w.Header().Set("X-Request-Id", rec.id)

	// Auth and body come first: the span is named after the model in the body.
	apiErr := e.authorize(r)
	var body []byte
	if apiErr == nil {
		body, apiErr = e.readBody(w, r)
	}
	if apiErr == nil {
		rec.model = api.ModelOf(body)
	}
	name := op
	if rec.model != "" {
		name = op + " " + rec.model
	}
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", op),
		attribute.String("http.request.method", r.Method),
		attribute.String("http.route", route),
		attribute.String("request_id", rec.id),
	}
	if rec.model != "" {
		attrs = append(attrs, attribute.String("gen_ai.request.model", rec.model))
	}
	parent := telemetry.ExtractHTTP(r.Context(), r.Header)
	ctx, span := e.spans.Start(parent, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(t0), trace.WithAttributes(attrs...))
	defer func() { e.endGenerate(ctx, span, rec, w) }()

	if apiErr != nil {
		rec.fail(w, apiErr, nil)
		return
	}
	if rec.model != "" && rec.model != e.cfg.Model {
		rec.fail(w, api.ModelNotFound(rec.model), nil)
		return
	}
	var g *api.Generation
	if op == api.OperationChat {
		g, apiErr = api.DecodeChat(body)
	} else {
		g, apiErr = api.DecodeCompletion(body)
	}
	if apiErr != nil {
		rec.fail(w, apiErr, nil)
		return
	}
	rec.stream = g.Stream
	info, ready := e.sched.WorkerInfo()
	if !ready {
		rec.fail(w, api.WorkerUnavailable("it has not answered yet"), scheduler.ErrWorkerUnavailable)
		return
	}
	prompt, promptText, apiErr := e.buildPrompt(g, info)
	if apiErr != nil {
		rec.fail(w, apiErr, nil)
		return
	}
	rec.promptTokens = len(prompt)
	if e.cfg.CaptureContent {
		captureInput(span, g, promptText)
	}
	if rec.maxTokens, apiErr = e.maxTokens(g, len(prompt), info); apiErr != nil {
		rec.fail(w, apiErr, nil)
		return
	}

	reqCtx, cancel := context.WithTimeout(ctx, e.cfg.RequestTimeout)
	defer cancel()
	ts := newTextStream(e.tok, g.Stop)
	rec.ts = ts
	sampling := &cbv1.SamplingParams{Temperature: g.Temperature, TopP: g.TopP}
	if g.Seed != nil {
		sampling.Seed = uint64(*g.Seed)
	}
	h, err := e.sched.Submit(&scheduler.Request{
		ID: rec.id, Prompt: prompt, MaxTokens: rec.maxTokens, Sampling: sampling,
		IgnoreEOS: g.IgnoreEOS, NoReuse: g.NoReuse, OnToken: ts.push, Ctx: reqCtx,
	})
	if err != nil {
		rec.fail(w, e.submitError(err, promptParam(op)), err)
		return
	}
	rec.h = h
	echo := ""
	if g.Echo {
		echo = promptText
	}
	if g.Stream {
		e.stream(w, r, reqCtx, rec, g, ts, echo)
	} else {
		e.respond(w, r, reqCtx, rec, ts, echo)
	}
}

func promptParam(op string) string {
	if op == api.OperationChat {
		return "messages"
	}
	return "prompt"
}

// buildPrompt tokenizes the request's prompt and checks it fits the model.
func (e *Engine) buildPrompt(g *api.Generation, info *cbv1.InfoResponse) ([]int32, string, *api.Error) {
	var prompt []int32
	var text string
	switch {
	case g.Operation == api.OperationChat:
		text = api.ChatPrompt(g.Messages)
		prompt = append([]int32{info.GetBos()}, e.tok.Encode(text)...)
	case g.PromptTokens != nil:
		prompt = g.PromptTokens
		for i, t := range prompt {
			if v := info.GetVocab(); v > 0 && t >= v {
				return nil, "", api.BadRequest("prompt", "Token %d of the prompt (%d) is outside the vocabulary of %d tokens.", i, t, v)
			}
		}
		text = e.tok.Decode(prompt)
	default:
		text = g.Prompt
		prompt = append([]int32{info.GetBos()}, e.tok.Encode(text)...)
	}
	if mp := int(info.GetMaxPositions()); mp > 0 && len(prompt) >= mp {
		return nil, "", api.BadRequest(promptParam(g.Operation),
			"This model's maximum context length is %d tokens. However, your prompt has %d tokens, leaving no room for output.", mp, len(prompt))
	}
	return prompt, text, nil
}

// maxTokens resolves the output limit against the model's positions.
func (e *Engine) maxTokens(g *api.Generation, promptLen int, info *cbv1.InfoResponse) (int, *api.Error) {
	room := 1 << 30
	if mp := int(info.GetMaxPositions()); mp > 0 {
		room = mp - promptLen
	}
	if g.MaxTokens == 0 {
		return min(e.cfg.DefaultMaxTokens, room), nil
	}
	if g.MaxTokens > room {
		param := "max_tokens"
		return 0, api.BadRequest(param,
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d for the completion).",
			info.GetMaxPositions(), promptLen+g.MaxTokens, promptLen, g.MaxTokens)
	}
	return g.MaxTokens, nil
}

// shuttingDown is the 503 of a request refused during shutdown.
func shuttingDown() *api.Error {
	return &api.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down",
		Message: "The server is shutting down.", ErrorType: api.ErrorTypeWorkerUnavailable}
}

// submitError maps a Submit failure to its API error.
func (e *Engine) submitError(err error, param string) *api.Error {
	switch {
	case errors.Is(err, scheduler.ErrQueueFull):
		queue := e.cfg.MaxQueue
		if queue <= 0 {
			queue = scheduler.DefaultMaxQueue
		}
		return api.QueueFull(queue)
	case errors.Is(err, scheduler.ErrWorkerUnavailable):
		return api.WorkerUnavailable("it has not answered yet")
	case errors.Is(err, scheduler.ErrShutdown):
		return shuttingDown()
	case errors.Is(err, scheduler.ErrTooLong):
		return api.BadRequest(param, "The request does not fit the model: %v.", unwrapMsg(err))
	case errors.Is(err, scheduler.ErrBadRequest):
		return api.BadRequest(param, "%v.", unwrapMsg(err))
	default:
		return api.Internal(err.Error())
	}
}

// unwrapMsg drops the "scheduler: " prefix of scheduler errors.
func unwrapMsg(err error) string {
	const p = "scheduler: "
	s := err.Error()
	if len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

// resultError maps a failed or unfinished request to its API error.
func resultError(r *http.Request, reqCtx context.Context, res scheduler.Result) (*api.Error, error) {
	ctxErr := func() (*api.Error, error) {
		if r.Context().Err() == nil && errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
			return api.Timeout("it ran past the request timeout"), reqCtx.Err()
		}
		return api.Canceled(), context.Canceled
	}
	if !res.Done {
		return ctxErr()
	}
	var we *scheduler.WorkerError
	switch err := res.Err; {
	case errors.Is(err, scheduler.ErrCanceled):
		return ctxErr()
	case errors.Is(err, scheduler.ErrWorkerUnavailable):
		return api.WorkerUnavailable("a step failed"), err
	case errors.Is(err, scheduler.ErrShutdown):
		return shuttingDown(), err
	case errors.Is(err, scheduler.ErrStoreTimeout):
		return api.Timeout("the store was not confirmed"), err
	case errors.As(err, &we):
		return api.Internal(we.Msg), err
	default:
		return api.Internal(err.Error()), err
	}
}

// wait blocks until the request finished or its context ended.
func wait(ctx context.Context, h *scheduler.Handle) scheduler.Result {
	select {
	case <-h.Done():
	case <-ctx.Done():
	}
	return h.Snapshot()
}

func usage(prompt, completion int) api.Usage {
	return api.Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// respond serves a non-streamed generation.
func (e *Engine) respond(w *statusWriter, r *http.Request, reqCtx context.Context, rec *genRecord, ts *textStream, echo string) {
	res := wait(reqCtx, rec.h)
	if !res.Done || res.Err != nil {
		apiErr, cause := resultError(r, reqCtx, res)
		rec.fail(w, apiErr, cause)
		return
	}
	ts.finish()
	text := echo + ts.all()
	u := usage(rec.promptTokens, len(res.Tokens))
	created := time.Now().Unix()
	rec.status = http.StatusOK
	if rec.op == api.OperationChat {
		writeJSON(w, http.StatusOK, api.ChatCompletion{
			ID: rec.id, Object: "chat.completion", Created: created, Model: rec.model,
			Choices: []api.ChatChoice{{Message: api.ChatMessageOut{Role: "assistant", Content: text}, FinishReason: res.FinishReason}},
			Usage:   u,
		})
		return
	}
	reason := res.FinishReason
	writeJSON(w, http.StatusOK, api.Completion{
		ID: rec.id, Object: "text_completion", Created: created, Model: rec.model,
		Choices: []api.CompletionChoice{{Text: text, FinishReason: &reason}},
		Usage:   &u,
	})
}

// stream serves a generation as server-sent events.
func (e *Engine) stream(w *statusWriter, r *http.Request, reqCtx context.Context, rec *genRecord, g *api.Generation, ts *textStream, echo string) {
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rec.status = http.StatusOK
	rc := http.NewResponseController(w)
	created := time.Now().Unix()
	var writeErr error
	send := func(v any) {
		if writeErr != nil {
			return
		}
		b, err := json.Marshal(v)
		if err != nil {
			writeErr = err
			return
		}
		if _, writeErr = fmt.Fprintf(w, "data: %s\n\n", b); writeErr == nil {
			writeErr = rc.Flush()
		}
	}
	chunk := func(text string, reason *string) any {
		if rec.op == api.OperationChat {
			d := api.ChatDelta{}
			if text != "" {
				d.Content = &text
			}
			return api.ChatChunk{ID: rec.id, Object: "chat.completion.chunk", Created: created, Model: rec.model,
				Choices: []api.ChatChunkChoice{{Delta: d, FinishReason: reason}}}
		}
		return api.Completion{ID: rec.id, Object: "text_completion", Created: created, Model: rec.model,
			Choices: []api.CompletionChoice{{Text: text, FinishReason: reason}}}
	}
	if rec.op == api.OperationChat {
		empty := ""
		send(api.ChatChunk{ID: rec.id, Object: "chat.completion.chunk", Created: created, Model: rec.model,
			Choices: []api.ChatChunkChoice{{Delta: api.ChatDelta{Role: "assistant", Content: &empty}}}})
	}
	if echo != "" {
		send(chunk(echo, nil))
	}
	var res scheduler.Result
	for done := false; !done && writeErr == nil; {
		select {
		case <-rec.h.Changed():
		case <-rec.h.Done():
		case <-reqCtx.Done():
		}
		res = rec.h.Snapshot()
		done = res.Done || reqCtx.Err() != nil
		if txt := ts.take(); txt != "" {
			send(chunk(txt, nil))
		}
	}
	if writeErr != nil { // the client went away
		rec.apiErr, rec.status, rec.cause = api.Canceled(), api.StatusClientClosedRequest, writeErr
		return
	}
	if !res.Done || res.Err != nil {
		apiErr, cause := resultError(r, reqCtx, res)
		rec.apiErr, rec.cause = apiErr, cause
		if apiErr.Status == api.StatusClientClosedRequest {
			rec.status = apiErr.Status
			return
		}
		send(apiErr.Body()) // headers are gone: the error travels as an event
		_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
		_ = rc.Flush()
		return
	}
	if rest := ts.finish(); rest != "" {
		send(chunk(rest, nil))
	}
	reason := res.FinishReason
	send(chunk("", &reason))
	if g.IncludeUsage {
		u := usage(rec.promptTokens, len(res.Tokens))
		if rec.op == api.OperationChat {
			send(api.ChatChunk{ID: rec.id, Object: "chat.completion.chunk", Created: created, Model: rec.model,
				Choices: []api.ChatChunkChoice{}, Usage: &u})
		} else {
			send(api.Completion{ID: rec.id, Object: "text_completion", Created: created, Model: rec.model,
				Choices: []api.CompletionChoice{}, Usage: &u})
		}
	}
	if writeErr == nil {
		if _, writeErr = fmt.Fprint(w, "data: [DONE]\n\n"); writeErr == nil {
			writeErr = rc.Flush()
		}
	}
	if writeErr != nil {
		rec.apiErr, rec.status, rec.cause = api.Canceled(), api.StatusClientClosedRequest, writeErr
	}
}

// endGenerate records the request: engine spans, SERVER span attributes and
// status, the request metrics, and the JSON log line (inside the SERVER
// span), then ends the SERVER span.
func (e *Engine) endGenerate(ctx context.Context, span *telemetry.Span, rec *genRecord, w *statusWriter) {
	end := time.Now()
	var res scheduler.Result
	if rec.h != nil {
		res = rec.h.Snapshot()
	}
	status := rec.status
	if status == 0 {
		status = w.status
	}
	errType := ""
	if rec.apiErr != nil {
		errType = rec.apiErr.ErrorType
	}
	nOut := len(res.Tokens)

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
	var ttft time.Duration
	if len(res.TokenTimes) > 0 {
		ttft = max(0, res.TokenTimes[0].Sub(rec.t0))
		mrec.TTFT, mrec.HasTTFT = min(ttft, mrec.E2E), true
	}
	if err := e.metrics.RecordRequest(ctx, mrec); err != nil {
		e.log.WarnContext(ctx, "record request metrics", "error", err.Error())
	}

	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelError
	}
	logAttrs := []slog.Attr{
		slog.String("request_id", rec.id),
		slog.String("operation", rec.op),
		slog.String("model", rec.model),
		slog.Int("status", status),
		slog.String("error_type", errType),
		slog.Bool("stream", rec.stream),
		slog.Float64("duration_s", end.Sub(rec.t0).Seconds()),
		slog.Int("prompt_tokens", rec.promptTokens),
		slog.Int("completion_tokens", nOut),
	}
	if mrec.HasTTFT {
		logAttrs = append(logAttrs, slog.Float64("ttft_s", ttft.Seconds()))
	} else {
		logAttrs = append(logAttrs, slog.Any("ttft_s", nil))
	}
	if res.FinishReason != "" {
		logAttrs = append(logAttrs, slog.String("finish_reason", res.FinishReason))
	}
	if rec.h != nil {
		logAttrs = append(logAttrs,
			slog.Int("cached_tokens", res.CachedTokens),
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
	span.End(trace.WithTimestamp(end))
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
	_, q := e.spans.Start(ctx, "engine.queue", trace.WithTimestamp(rec.t0))
	q.End(trace.WithTimestamp(queueEnd))
	if res.Admitted.IsZero() {
		return
	}
	prefillEnd := stopAt
	if len(res.TokenTimes) > 0 {
		prefillEnd = res.TokenTimes[0]
	}
	_, p := e.spans.Start(ctx, "engine.prefill", trace.WithTimestamp(res.Admitted), trace.WithAttributes(
		attribute.Int("n_prompt_tokens", res.PromptTokens),
		attribute.Int("cached_tokens", res.CachedTokens),
		attribute.Int("reused_tokens", res.ReusedTokens),
	))
	p.End(trace.WithTimestamp(prefillEnd))
	if len(res.TokenTimes) < 2 {
		return
	}
	_, d := e.spans.Start(ctx, "engine.decode", trace.WithTimestamp(res.TokenTimes[0]))
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
