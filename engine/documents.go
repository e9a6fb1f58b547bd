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
	docs, toks, apiErr := e.readDocuments(w, r)
	nTokens := 0
	for _, t := range toks {
		nTokens += len(t)
	}
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
			slog.Float64("duration_s", time.Since(t0).Seconds()), slog.Int("documents", len(toks)), slog.Int("tokens", nTokens))
	}()
	var out *api.DocumentList
	if apiErr == nil {
		out, apiErr = e.storeDocuments(parent, r, docs, toks)
	}
	if apiErr == nil {
		out.Usage = api.Usage{PromptTokens: nTokens, TotalTokens: nTokens}
		writeJSON(w, http.StatusOK, out)
		return
	}
	if apiErr.Status == http.StatusServiceUnavailable && apiErr.RetryAfter == 0 {
		apiErr = apiErr.WithRetryAfter(WorkerRetryAfter)
	}
	if apiErr.Status != api.StatusClientClosedRequest {
		apiErr.Write(w)
	} else {
		w.Status = apiErr.Status
	}
}

// readDocuments reads and decodes a documents request and tokenizes its
// documents, each within the model's positions.
func (e *Engine) readDocuments(w *statusWriter, r *http.Request) (*api.Documents, [][]int32, *api.Error) {
	body, apiErr := e.front.ReadRequest(w, r)
	if apiErr != nil {
		return nil, nil, apiErr
	}
	docs, apiErr := api.DecodeDocuments(body)
	if apiErr != nil {
		return nil, nil, apiErr
	}
	if docs.Model != "" && docs.Model != e.cfg.Model {
		return nil, nil, api.ModelNotFound(docs.Model)
	}
	info, ready := e.sched.WorkerInfo()
	if !ready {
		return nil, nil, api.WorkerUnavailable("it has not answered yet")
	}
	toks := make([][]int32, len(docs.Docs))
	for i, d := range docs.Docs {
		toks[i] = e.tok.Encode(d.Text)
		if mp := int(info.GetMaxPositions()); mp > 0 && len(toks[i]) > mp {
			return nil, nil, api.BadRequest("documents", "Document %d has %d tokens; the model allows %d.", i, len(toks[i]), mp)
		}
	}
	return docs, toks, nil
}

// storeDocuments submits every document to the scheduler, each under its
// cb.store_pre_computed span (a child of parent), and waits until all are
// stored. On a failure the documents still queued are abandoned.
func (e *Engine) storeDocuments(parent context.Context, r *http.Request, docs *api.Documents, toks [][]int32) (*api.DocumentList, *api.Error) {
	reqCtx, cancel := context.WithTimeout(r.Context(), e.cfg.RequestTimeout)
	defer cancel()
	type job struct {
		id   string
		h    *scheduler.Handle
		span *telemetry.Span
	}
	jobs := make([]job, 0, len(docs.Docs))
	// abandon cancels the documents still queued and ends every document
	// span: stored documents end normally, the others carry the failure
	// (or their abandonment).
	abandon := func(err error) {
		cancel()
		for _, j := range jobs {
			switch res := j.h.Snapshot(); {
			case res.Done && res.Err == nil:
			case res.Done:
				j.span.SetError(scheduler.ErrorType(res.Err), res.Err)
			default:
				j.span.SetError("canceled", err)
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
			apiErr := e.submitError(serr, "documents")
			span.SetError(apiErr.ErrorType, serr)
			span.End()
			abandon(context.Canceled)
			return nil, apiErr
		}
		jobs = append(jobs, job{id: id, h: h, span: span})
	}
	out := &api.DocumentList{Object: "list", Model: e.cfg.Model}
	for i, j := range jobs {
		res := wait(reqCtx, j.h)
		if !res.Done || res.Err != nil {
			apiErr, cause := resultError(r, reqCtx, res)
			abandon(cause)
			return nil, apiErr
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
	return out, nil
}
