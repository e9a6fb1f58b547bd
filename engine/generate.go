package engine

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/scheduler"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

// operation is what differs between the two generation routes on the way
// in; shape is the way out.
type operation struct {
	name        string // api.OperationChat or api.OperationTextCompletion
	idPrefix    string
	promptParam string // the body field an error about the prompt names
	decode      func(body []byte) (*api.Generation, *api.Error)
}

var (
	opChat       = operation{api.OperationChat, "chatcmpl-", "messages", api.DecodeChat}
	opCompletion = operation{api.OperationTextCompletion, "cmpl-", "prompt", api.DecodeCompletion}
)

func operationOf(name string) operation {
	if name == api.OperationChat {
		return opChat
	}
	return opCompletion
}

func promptParam(name string) string { return operationOf(name).promptParam }

// serveGenerate serves POST /v1/chat/completions and /v1/completions: it
// opens the SERVER span, checks and decodes the request, submits it, and
// hands the handle to respond or stream; endGenerate records it all.
func (e *Engine) serveGenerate(w *statusWriter, r *http.Request, opName, route string, t0 time.Time) {
	op := operationOf(opName)
	rec := &genRecord{op: op.name, id: newID(op.idPrefix), t0: t0}
	ho, hoErr := handoffOf(r) // decode side: the request keeps the prefill engine's id
	if ho != nil {
		rec.id = ho.ID
	}
	w.Header().Set("X-Request-Id", rec.id)

	// Auth and body come first: the span is named after the model in the body.
	body, apiErr := e.front.ReadRequest(w, r)
	var g *api.Generation
	if apiErr == nil {
		g, apiErr = e.decodeGeneration(rec, op, body)
	}
	ctx, span := e.startServerSpan(r, rec, route)
	defer func() { e.endGenerate(ctx, span, rec, w) }()

	prompt, promptText, apiErr, cause := e.admitGeneration(rec, g, apiErr)
	var decodeURL string
	if apiErr == nil {
		decodeURL, apiErr = e.checkHandoff(r, ho, hoErr, prompt)
	}
	if apiErr != nil {
		rec.fail(w, apiErr, cause)
		return
	}
	if e.cfg.CaptureContent {
		captureInput(span, g, promptText)
	}
	reqCtx, cancel := context.WithTimeout(ctx, e.cfg.RequestTimeout)
	defer cancel()
	ts := newTextStream(e.tok, g.Stop)
	rec.ts = ts
	rec.seed, rec.seedGenerated = requestSeed(g)
	rec.seeded = true
	sampling := &cbv1.SamplingParams{Temperature: g.Temperature, TopP: g.TopP, Seed: uint64(rec.seed)}
	req := &scheduler.Request{
		ID: rec.id, Prompt: prompt, MaxTokens: rec.maxTokens, Sampling: sampling,
		IgnoreEOS: g.IgnoreEOS, NoReuse: g.NoReuse, Blend: blendOptions(g.Blend), OnToken: ts.push, Ctx: reqCtx,
	}
	if decodeURL != "" { // prefill side: prefill, first token, hand over, relay
		if rec.seedGenerated { // the decode side continues the same draws
			body = withSeed(body, rec.seed)
		}
		e.handOver(w, r, ctx, reqCtx, rec, g, req, body, route, decodeURL)
		return
	}
	if ho != nil { // decode side: pull the prompt's KV, then decode
		req.Prefilled = e.prefilled(ho)
	}
	h, err := e.sched.Submit(req)
	if err != nil {
		rec.fail(w, e.submitError(err, op.promptParam), err)
		return
	}
	rec.h = h
	if ho != nil && !e.awaitTransfer(w, r, reqCtx, rec) {
		return
	}
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

// startServerSpan opens the request's SERVER span, "{operation} {model}",
// a child of the caller's traceparent when it is valid.
func (e *Engine) startServerSpan(r *http.Request, rec *genRecord, route string) (context.Context, *telemetry.Span) {
	name := spanname.Server(rec.op, rec.model)
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", rec.op),
		attribute.String("http.request.method", r.Method),
		attribute.String("http.route", route),
		attribute.String("request_id", rec.id),
	}
	if rec.model != "" {
		attrs = append(attrs, attribute.String("gen_ai.request.model", rec.model))
	}
	parent := telemetry.ExtractHTTP(r.Context(), r.Header)
	return e.spans.Start(parent, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(rec.t0), trace.WithAttributes(attrs...))
}

// decodeGeneration decodes and checks the body once, setting rec.model (the
// span is named after it): a model other than the served one is
// model_not_found even when the rest of the body is bad.
func (e *Engine) decodeGeneration(rec *genRecord, op operation, body []byte) (*api.Generation, *api.Error) {
	g, apiErr := op.decode(body)
	if apiErr == nil {
		rec.model = g.Model
	} else {
		rec.model = api.ModelOf(body) // only a bad body is read twice
	}
	if rec.model != "" && rec.model != e.cfg.Model {
		return nil, api.ModelNotFound(rec.model)
	}
	if apiErr != nil {
		return nil, apiErr
	}
	rec.stream = g.Stream
	return g, nil
}

// admitGeneration tokenizes the decoded request's prompt and resolves the
// output limit against the worker's model (after an earlier error apiErr, it
// only returns it). cause, when set, is the error behind apiErr, for the
// span.
func (e *Engine) admitGeneration(rec *genRecord, g *api.Generation, apiErr *api.Error) (prompt []int32, promptText string, _ *api.Error, cause error) {
	if apiErr != nil {
		return nil, "", apiErr, nil
	}
	info, ready := e.sched.WorkerInfo()
	if !ready {
		return nil, "", api.WorkerUnavailable("it has not answered yet"), scheduler.ErrWorkerUnavailable
	}
	if prompt, promptText, apiErr = e.buildPrompt(g, info); apiErr != nil {
		return nil, "", apiErr, nil
	}
	rec.promptTokens = len(prompt)
	if rec.maxTokens, apiErr = e.maxTokens(g, len(prompt), info); apiErr != nil {
		return nil, "", apiErr, nil
	}
	return prompt, promptText, nil, nil
}

// buildPrompt tokenizes the request's prompt and checks it fits the model.
func (e *Engine) buildPrompt(g *api.Generation, info *cbv1.InfoResponse) ([]int32, string, *api.Error) {
	var prompt []int32
	var text string
	switch {
	case g.Operation == api.OperationChat && e.file != nil:
		var err error
		if prompt, text, err = e.file.ChatTokensTools(api.ChatMessages(g.Messages), g.Tools); err != nil {
			return nil, "", api.BadRequestCode("messages", api.CodeInvalidValue, "The model's chat template cannot render these messages: %v", err)
		}
	case g.Operation == api.OperationChat:
		text = api.ChatPromptTools(g.Messages, g.Tools)
		prompt = append([]int32{info.GetBos()}, e.tok.Encode(text)...)
	case g.PromptTokens != nil:
		prompt = g.PromptTokens
		for i, t := range prompt {
			if v := info.GetVocab(); v > 0 && t >= v {
				return nil, "", api.BadRequestCode("prompt", api.CodeInvalidValue, "Token %d of the prompt (%d) is outside the vocabulary of %d tokens.", i, t, v)
			}
		}
		text = e.tok.Decode(prompt)
	case e.file != nil:
		text = g.Prompt
		prompt = e.file.PromptTokens(text)
	default:
		text = g.Prompt
		prompt = append([]int32{info.GetBos()}, e.tok.Encode(text)...)
	}
	if len(prompt) == 0 {
		// A model whose vocabulary adds no BOS and an empty prompt.
		return nil, "", api.BadRequestCode(promptParam(g.Operation), api.CodeInvalidValue, "The prompt is empty and this model adds no BOS token: give at least one token of prompt.")
	}
	if mp := int(info.GetMaxPositions()); mp > 0 && len(prompt) >= mp {
		return nil, "", api.BadRequestCode(promptParam(g.Operation), api.CodeContextLengthExceeded,
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
	if g.MaxTokensParam == "" { // a default of the API, not the client's: fit it
		return min(g.MaxTokens, room), nil
	}
	if g.MaxTokens > room {
		return 0, api.BadRequestCode(g.MaxTokensParam, api.CodeContextLengthExceeded,
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d for the completion).",
			info.GetMaxPositions(), promptLen+g.MaxTokens, promptLen, g.MaxTokens)
	}
	return g.MaxTokens, nil
}

// requestSeed is the sampling seed of a generation: the client's as given,
// else a fresh random one in [0, 2^53) (api.MaxGeneratedSeed: a JavaScript
// number holds it exactly, so any client can send the echoed seed back to
// replay the request), and whether it was generated.
func requestSeed(g *api.Generation) (seed int64, generated bool) {
	if g.Seed != nil {
		return *g.Seed, false
	}
	return rand.Int64N(api.MaxGeneratedSeed), true
}

// withSeed returns the JSON object body with its "seed" set to seed (body
// as is if it does not decode: it decoded once already).
func withSeed(body []byte, seed int64) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return body
	}
	m["seed"] = json.RawMessage(strconv.FormatInt(seed, 10))
	out, err := json.Marshal(m)
	if err != nil {
		return body
	}
	return out
}

// blendOptions maps a request's "cacheblend" settings to the scheduler's.
func blendOptions(o api.BlendOptions) scheduler.BlendOptions {
	b := scheduler.BlendOptions{RecompRatio: o.RecomputeRatio, QualityCheck: o.QualityCheck}
	if o.Selection == api.SelectionRandom {
		b.Selection = cbv1.Selection_SELECTION_RANDOM
	}
	return b
}
