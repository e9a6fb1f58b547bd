package engine

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/scheduler"
	"github.com/cacheblend/cacheblend/telemetry"
)

// serveDocuments serves POST /v1/documents: every document is prefilled on
// its own (no special tokens, so its tokens match wherever it is quoted) and
// stored in the blend server by the worker; the response comes once every
// store was reported done. Each document is traced as a
// cb.store_pre_computed span, the root of its own trace (or a child of the
// caller's traceparent).
func (e *Engine) serveDocuments(w *statusWriter, r *http.Request, _ string, t0 time.Time) {
	callID := newID("docs-")
	w.Header().Set("X-Request-Id", callID)
	parent := telemetry.ExtractHTTP(r.Context(), r.Header)
	var (
		apiErr  *api.Error
		nDocs   int
		nTokens int
	)
	defer func() {
		status, errType, level := http.StatusOK, "", slog.LevelInfo
		if apiErr != nil {
			status, errType = apiErr.Status, apiErr.ErrorType
			if status >= 500 {
				level = slog.LevelError
			}
		}
		e.log.LogAttrs(parent, level, "documents",
			slog.String("request_id", callID), slog.Int("status", status), slog.String("error_type", errType),
			slog.Float64("duration_s", time.Since(t0).Seconds()), slog.Int("documents", nDocs), slog.Int("tokens", nTokens))
	}()
	fail := func(err *api.Error) {
		if err.Status == http.StatusServiceUnavailable && err.RetryAfter == 0 {
			err = err.WithRetryAfter(WorkerRetryAfter)
		}
		apiErr = err
		if err.Status != api.StatusClientClosedRequest {
			err.Write(w)
		} else {
			w.Status = err.Status
		}
	}

	body, err := e.front.ReadRequest(w, r)
	if err != nil {
		fail(err)
		return
	}
	docs, err := api.DecodeDocuments(body)
	if err != nil {
		fail(err)
		return
	}
	if docs.Model != "" && docs.Model != e.cfg.Model {
		fail(api.ModelNotFound(docs.Model))
		return
	}
	info, ready := e.sched.WorkerInfo()
	if !ready {
		fail(api.WorkerUnavailable("it has not answered yet"))
		return
	}
	toks := make([][]int32, len(docs.Docs))
	for i, d := range docs.Docs {
		toks[i] = e.tok.Encode(d.Text)
		if mp := int(info.GetMaxPositions()); mp > 0 && len(toks[i]) > mp {
			fail(api.BadRequest("documents", "Document %d has %d tokens; the model allows %d.", i, len(toks[i]), mp))
			return
		}
		nTokens += len(toks[i])
	}
	nDocs = len(docs.Docs)

	reqCtx, cancel := context.WithTimeout(r.Context(), e.cfg.RequestTimeout)
	defer cancel()
	type job struct {
		id   string
		h    *scheduler.Handle
		span *telemetry.Span
	}
	jobs := make([]job, 0, len(docs.Docs))
	// endSpans ends every document span after a failure: stored documents
	// end normally, the others carry the failure (or their abandonment).
	endSpans := func(err error, errType string) {
		for _, j := range jobs {
			switch res := j.h.Snapshot(); {
			case res.Done && res.Err == nil:
			case res.Done:
				j.span.SetError(scheduler.ErrorType(res.Err), res.Err)
			default:
				j.span.SetError(errType, err)
			}
			j.span.End()
		}
	}
	for i, d := range docs.Docs {
		id := newID("doc-")
		_, span := e.spans.Start(parent, spanname.CBStorePreComputed, trace.WithAttributes(
			attribute.String("request_id", id),
			attribute.Int("document_index", i),
			attribute.String("document_id", d.ID),
			attribute.Int("n_tokens", len(toks[i])),
		))
		// The scheduler's request carries the span's context (the worker's
		// trace context) and the HTTP request's cancellation and deadline.
		ctx := trace.ContextWithSpanContext(reqCtx, span.SpanContext())
		h, serr := e.sched.Submit(&scheduler.Request{ID: id, Prompt: toks[i], Document: true, Ctx: ctx})
		if serr != nil {
			span.SetError(errorTypeOf(e.submitError(serr, "documents")), serr)
			span.End()
			cancel() // abandon the documents already queued
			endSpans(context.Canceled, "canceled")
			fail(e.submitError(serr, "documents"))
			return
		}
		jobs = append(jobs, job{id: id, h: h, span: span})
	}

	out := api.DocumentList{Object: "list", Model: e.cfg.Model, Usage: api.Usage{PromptTokens: nTokens, TotalTokens: nTokens}}
	for i, j := range jobs {
		res := wait(reqCtx, j.h)
		if !res.Done || res.Err != nil {
			aerr, cause := resultError(r, reqCtx, res)
			cancel()
			endSpans(cause, "canceled")
			fail(aerr)
			return
		}
		id := docs.Docs[i].ID
		if id == "" {
			id = j.id
		}
		out.Data = append(out.Data, api.DocumentResult{Object: "document", ID: id, Index: i, Tokens: len(toks[i]), Status: "stored"})
	}
	for _, j := range jobs {
		j.span.End()
	}
	writeJSON(w, http.StatusOK, out)
}

func errorTypeOf(e *api.Error) string { return e.ErrorType }
