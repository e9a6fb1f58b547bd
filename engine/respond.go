package engine

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/scheduler"
)

// wait blocks until the request finished or its context ended.
func wait(ctx context.Context, h *scheduler.Handle) scheduler.Result {
	select {
	case <-h.Done():
	case <-ctx.Done():
	}
	return h.Snapshot()
}

// usage is the usage object of a generation of prompt tokens whose
// scheduler result is res: the token counts, the cached tokens and their
// split (the "cacheblend" extension), from what the scheduler planned at the
// request's first admission.
func usage(prompt int, res scheduler.Result) api.Usage {
	completion := len(res.Tokens)
	prefix := res.CachedTokens + res.PrefixReusedTokens
	nonPrefix := res.ReusedTokens - res.PrefixReusedTokens
	cached := min(prefix+nonPrefix, prompt)
	return api.Usage{
		PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion,
		PromptTokensDetails: &api.PromptTokensDetails{CachedTokens: cached},
		CacheBlend: &api.UsageCacheBlend{PrefixHitTokens: prefix, NonPrefixHitTokens: nonPrefix,
			RecomputedTokens: prompt - cached, QualitySampled: res.QualitySampled},
	}
}

// shape builds the response bodies of one operation: the only place where
// chat and completion responses differ. Every body and chunk carries the
// system fingerprint and the request's seed.
type shape struct {
	op, id, model string
	created       int64
	fingerprint   string
	seed          int64
}

// newShape is the shape of rec's responses (its seed drawn already).
func (e *Engine) newShape(rec *genRecord) shape {
	return shape{op: rec.op, id: rec.id, model: rec.model, created: time.Now().Unix(), fingerprint: e.fingerprint(), seed: rec.seed}
}

func (s shape) chat() bool { return s.op == api.OperationChat }

// head returns the fields every body and chunk of the response shares.
func head[C, U any](s shape, object string) api.Response[C, U] {
	seed := s.seed
	return api.Response[C, U]{ID: s.id, Object: object, Created: s.created, Model: s.model, SystemFingerprint: s.fingerprint, Seed: &seed}
}

// fingerprint is the engine's system_fingerprint: the served model (its
// name and file identity, and the worker's shape of it: vocabulary,
// positions, layers, tensor-parallel ranks) and the engine's build. It
// stays the same while all of them do (restarts included) and changes
// when any does; "" before the worker answered.
func (e *Engine) fingerprint() string {
	info, ok := e.sched.WorkerInfo()
	if !ok {
		return ""
	}
	return api.Fingerprint(e.cfg.Model, e.cfg.ModelIdentity, info.GetModelIdentity(),
		strconv.Itoa(int(info.GetVocab())), strconv.Itoa(int(info.GetMaxPositions())),
		strconv.Itoa(int(info.GetNumLayers())), strconv.Itoa(int(max(info.GetWorldSize(), 1))), buildID())
}

// whole is the body of a non-streamed response.
func (s shape) whole(text, reason string, u api.Usage) any {
	if s.chat() {
		b := head[api.ChatChoice, api.Usage](s, "chat.completion")
		b.Choices = []api.ChatChoice{{Message: api.ChatMessageOut{Role: "assistant", Content: text}, FinishReason: reason}}
		b.Usage = u
		return b
	}
	b := head[api.CompletionChoice, *api.Usage](s, "text_completion")
	b.Choices, b.Usage = []api.CompletionChoice{{Text: text, FinishReason: &reason}}, &u
	return b
}

// opening is the first event of a stream, if the operation has one (chat:
// the assistant role).
func (s shape) opening() (any, bool) {
	if !s.chat() {
		return nil, false
	}
	empty := ""
	b := head[api.ChatChunkChoice, *api.Usage](s, "chat.completion.chunk")
	b.Choices = []api.ChatChunkChoice{{Delta: api.ChatDelta{Role: "assistant", Content: &empty}}}
	return b, true
}

// chunk is a stream event carrying text and, on the last one, the reason.
func (s shape) chunk(text string, reason *string) any {
	if s.chat() {
		d := api.ChatDelta{}
		if text != "" {
			d.Content = &text
		}
		b := head[api.ChatChunkChoice, *api.Usage](s, "chat.completion.chunk")
		b.Choices = []api.ChatChunkChoice{{Delta: d, FinishReason: reason}}
		return b
	}
	b := head[api.CompletionChoice, *api.Usage](s, "text_completion")
	b.Choices = []api.CompletionChoice{{Text: text, FinishReason: reason}}
	return b
}

// usage is the stream's usage event (stream_options.include_usage).
func (s shape) usage(u api.Usage) any {
	if s.chat() {
		b := head[api.ChatChunkChoice, *api.Usage](s, "chat.completion.chunk")
		b.Choices, b.Usage = []api.ChatChunkChoice{}, &u
		return b
	}
	b := head[api.CompletionChoice, *api.Usage](s, "text_completion")
	b.Choices, b.Usage = []api.CompletionChoice{}, &u
	return b
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
	rec.status = http.StatusOK
	writeJSON(w, http.StatusOK, e.newShape(rec).whole(echo+ts.all(), res.FinishReason, usage(rec.promptTokens, res)))
}

// sseWriter writes server-sent events, flushing each (queue: not yet, the
// next flushed event carries it); after the first write error it writes
// nothing more and keeps the error.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte // the event being written, reused
	err error
}

func (s *sseWriter) send(v any) {
	s.queue(v)
	s.flush()
}

// queue writes the event of v without flushing: the events that end a
// stream go out in one write.
func (s *sseWriter) queue(v any) {
	if s.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		s.err = err
		return
	}
	s.buf = append(append(append(s.buf[:0], "data: "...), b...), "\n\n"...)
	_, s.err = s.w.Write(s.buf)
}

func (s *sseWriter) raw(line string) {
	if s.err != nil {
		return
	}
	if _, s.err = io.WriteString(s.w, line); s.err == nil {
		s.flush()
	}
}

func (s *sseWriter) flush() {
	if s.err == nil {
		s.err = s.rc.Flush()
	}
}

// stream serves a generation as server-sent events.
func (e *Engine) stream(w *statusWriter, r *http.Request, reqCtx context.Context, rec *genRecord, g *api.Generation, ts *textStream, echo string) {
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rec.status = http.StatusOK
	out := &sseWriter{w: w, rc: http.NewResponseController(w)}
	sh := e.newShape(rec)
	if first, ok := sh.opening(); ok {
		out.send(first)
	}
	if echo != "" {
		out.send(sh.chunk(echo, nil))
	}
	var res scheduler.Result
	for done := false; !done && out.err == nil; {
		select {
		case <-rec.h.Changed():
		case <-rec.h.Done():
		case <-reqCtx.Done():
		}
		res = rec.h.Snapshot()
		done = res.Done || reqCtx.Err() != nil
		if txt := ts.take(); txt != "" && done {
			out.queue(sh.chunk(txt, nil)) // flushed with the stream's end
		} else if txt != "" {
			out.send(sh.chunk(txt, nil))
		}
	}
	if out.err != nil { // the client went away
		rec.apiErr, rec.status, rec.cause = api.Canceled(), api.StatusClientClosedRequest, out.err
		return
	}
	if !res.Done || res.Err != nil {
		apiErr, cause := resultError(r, reqCtx, res)
		rec.apiErr, rec.cause = apiErr, cause
		if apiErr.Status == api.StatusClientClosedRequest {
			rec.status = apiErr.Status
			return
		}
		out.queue(apiErr.Body()) // headers are gone: the error travels as an event
		out.raw("data: [DONE]\n\n")
		return
	}
	// The stream's end goes out in one flush: the last text, the finish
	// reason, the usage and [DONE].
	if rest := ts.finish(); rest != "" {
		out.queue(sh.chunk(rest, nil))
	}
	reason := res.FinishReason
	out.queue(sh.chunk("", &reason))
	if g.IncludeUsage {
		out.queue(sh.usage(usage(rec.promptTokens, res)))
	}
	out.raw("data: [DONE]\n\n")
	if out.err != nil {
		rec.apiErr, rec.status, rec.cause = api.Canceled(), api.StatusClientClosedRequest, out.err
	}
}
