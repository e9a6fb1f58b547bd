package engine

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/scheduler"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
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
	var ids []string
	if apiErr == nil {
		out, ids, apiErr = e.storeDocuments(parent, r, docs, toks)
	}
	if apiErr == nil {
		out.Usage = api.Usage{PromptTokens: nTokens, TotalTokens: nTokens}
		res := withFleetState(parent, e.blend, e.log, out, ids)
		if apiErr = withStoreState(parent, e.blend, e.log, res, ids); apiErr == nil {
			writeJSON(w, http.StatusOK, res)
			return
		}
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

// fleetStatusTimeout bounds the engine's fleet status query (the blend
// server waits at most its FleetStatusWait, 1 s by default, for the writes).
const fleetStatusTimeout = 3 * time.Second

// documentResult is api.DocumentResult with the document's fleet state.
type documentResult struct {
	api.DocumentResult
	// Fleet is, with a blend server that has a fleet tier (Redis), whether
	// other nodes can find the document: "shared" (its chunks and directory
	// entry are in Redis), "pending" (some fleet writes failed and are being
	// retried: shared once Redis answers again), "not_shared" (a write was
	// dropped: store it again to share it). Absent without a fleet tier, or
	// when the blend server did not answer the query ("unknown" is never
	// guessed).
	Fleet string `json:"fleet,omitempty"`
	// L2 is, with a blend server that keeps chunk files (L2), whether the
	// document's chunks reached them: "stored", or "failed: <cause>" (e.g.
	// "failed: no space left on device"; the document's status is then
	// memory_only). Absent without an L2 or when the blend server did not
	// answer.
	L2 string `json:"l2,omitempty"`
	// Error is why a document's status is not "stored".
	Error string `json:"error,omitempty"`
}

// documentList is the body of a POST /v1/documents response (api.DocumentList
// with documentResult entries).
type documentList struct {
	Object string           `json:"object"`
	Model  string           `json:"model"`
	Data   []documentResult `json:"data"`
	Usage  api.Usage        `json:"usage"`
}

// withFleetState asks the blend server bc (nil: nothing is asked) for the
// fleet state of the stored documents (BlendService.FleetStatus, by their
// request ids ids, in order) and puts it in the answer; a document not
// shared is logged.
func withFleetState(ctx context.Context, bc cbv1.BlendServiceClient, log *slog.Logger, out *api.DocumentList, ids []string) *documentList {
	res := &documentList{Object: out.Object, Model: out.Model, Usage: out.Usage, Data: make([]documentResult, len(out.Data))}
	for i, d := range out.Data {
		res.Data[i].DocumentResult = d
	}
	if bc == nil || len(ids) == 0 || len(ids) != len(out.Data) {
		return res
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fleetStatusTimeout)
	defer cancel()
	st, err := bc.FleetStatus(ctx, &cbv1.FleetStatusRequest{RequestIds: ids})
	if err != nil {
		log.Warn("fleet state of the stored documents unknown", "err", err)
		return res
	}
	if !st.GetFleet() || len(st.GetStates()) != len(ids) {
		return res // no fleet tier (or a malformed answer: nothing guessed)
	}
	for i := range res.Data {
		state := st.GetStates()[i]
		res.Data[i].Fleet = state
		if state != "shared" {
			log.Warn("document stored on this node but not shared in the fleet yet",
				"request_id", ids[i], "document_id", res.Data[i].ID, "fleet", state)
		}
	}
	return res
}

// Document statuses of a POST /v1/documents answer (documentResult.Status).
const (
	// DocStored: the chunks are held in every tier the blend server has (L1
	// memory, and its L2 chunk files when it has an L2).
	DocStored = "stored"
	// DocMemoryOnly: held in L1 memory (reusable now) but an L2 write failed:
	// a restart of the blend server loses the document (l2 and error say
	// why; it is written to L2 later once a write succeeds, or store it
	// again then).
	DocMemoryOnly = "memory_only"
	// DocFailed: some chunk is held by no tier: store the document again.
	DocFailed = "failed"
	// DocUnconfirmed: the worker reported the store done but the blend
	// server did not confirm it (it did not answer, or no store of the
	// document reached it in time): reuse is likely but not promised.
	DocUnconfirmed = "unconfirmed"
)

// storeStatusTimeout bounds the engine's store status query (the blend
// server waits at most its FleetStatusWait, 1 s by default, for the
// stores' ends).
const storeStatusTimeout = 3 * time.Second

// withStoreState asks the blend server bc (nil: nothing is asked) where the
// stored documents' chunks are held (BlendService.StoreStatus, by their
// request ids ids, in order) and sets each document's status, l2 and error.
// It returns an error for the whole request when no document was stored
// in any tier: 507 insufficient_storage when the blend server's disk is
// full, else 503 with Retry-After (the client may retry; nothing was kept).
// A partial answer (some memory_only or failed) stays 200: each document
// says what happened to it.
func withStoreState(ctx context.Context, bc cbv1.BlendServiceClient, log *slog.Logger, res *documentList, ids []string) *api.Error {
	if bc == nil || len(ids) == 0 || len(ids) != len(res.Data) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeStatusTimeout)
	defer cancel()
	st, err := bc.StoreStatus(ctx, &cbv1.StoreStatusRequest{RequestIds: ids})
	if status.Code(err) == codes.Unimplemented {
		// A blend server older than StoreStatus: the status stays the
		// worker's report (the store was done), as before it.
		return nil
	}
	if err != nil || len(st.GetStates()) != len(ids) {
		log.Warn("storage state of the stored documents unknown", "err", err)
		for i := range res.Data {
			res.Data[i].Status = DocUnconfirmed
		}
		return nil
	}
	failed := 0
	for i := range res.Data {
		d, s := &res.Data[i], st.GetStates()[i]
		switch s.GetState() {
		case "stored":
			d.Status = DocStored
			if st.GetL2() {
				d.L2 = "stored"
			}
		case "memory_only":
			d.Status, d.Error = DocMemoryOnly, "held in memory only, not durable: L2 write failed: "+s.GetError()
			d.L2 = "failed: " + s.GetError()
		case "failed":
			failed++
			d.Status, d.Error = DocFailed, "not stored: "+s.GetError()
			if st.GetL2() {
				d.L2 = "failed: " + s.GetError()
			}
		default:
			d.Status = DocUnconfirmed
		}
		if d.Status != DocStored {
			log.Error("document not stored durably", "request_id", ids[i], "document_id", d.ID,
				"status", d.Status, "l2", d.L2, "err", s.GetError(), "disk_full", st.GetDiskFull())
		}
	}
	if failed < len(res.Data) {
		return nil
	}
	msg := "No document was stored: " + st.GetStates()[0].GetError() + "."
	if st.GetDiskFull() {
		return &api.Error{Status: http.StatusInsufficientStorage, Type: "server_error", Code: "insufficient_storage",
			Message: msg + " The blend server's disk is full.", ErrorType: "internal"}
	}
	return &api.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "store_failed",
		Message: msg, ErrorType: "internal"}
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
			return nil, nil, api.BadRequestCode("documents", api.CodeContextLengthExceeded,
				"Document %d has %d tokens; the model allows %d.", i, len(toks[i]), mp)
		}
	}
	return docs, toks, nil
}

// storeDocuments submits every document to the scheduler, each under its
// cb.store_pre_computed span (a child of parent), and waits until all are
// stored; it returns the answer and the documents' request ids. On a failure
// the documents still queued are abandoned.
func (e *Engine) storeDocuments(parent context.Context, r *http.Request, docs *api.Documents, toks [][]int32) (*api.DocumentList, []string, *api.Error) {
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
			return nil, nil, apiErr
		}
		jobs = append(jobs, job{id: id, h: h, span: span})
	}
	out := &api.DocumentList{Object: "list", Model: e.cfg.Model}
	for i, j := range jobs {
		res := wait(reqCtx, j.h)
		if !res.Done || res.Err != nil {
			apiErr, cause := resultError(r, reqCtx, res)
			abandon(cause)
			return nil, nil, apiErr
		}
		id := docs.Docs[i].ID
		if id == "" {
			id = j.id
		}
		out.Data = append(out.Data, api.DocumentResult{Object: "document", ID: id, Index: i, Tokens: len(toks[i]), Status: "stored"})
	}
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		j.span.End()
		ids[i] = j.id
	}
	return out, ids, nil
}
