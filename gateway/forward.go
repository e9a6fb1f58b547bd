package gateway

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/internal/idle"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/modelfile"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/tokenizer"
)

// Failover reasons (the result and reason labels; an attempt that ends with one of them, before
// anything was written to the client, is retried on another engine).
const (
	failUnreachable = "unreachable" // no response (refused, reset, lost before the first content)
	failUnavailable = "unavailable" // 503, or an error event of an unavailable worker first
	failQueueFull   = "queue_full"  // 429
	// failDecode: the prefill engine answered 503 decode_unavailable (or opened its stream
	// with that error event): the decode engine it was given failed; the request is retried
	// on the same prefill engine with another decode engine.
	failDecode = "decode_unavailable"
	// failPeerBusy: the prefill engine answered 503 handoff_peer_busy: its hand-overs to the
	// decode engine it was given are at their limit (cb engine --max-handoffs-per-peer). The
	// engine is not down (the limit is per decode peer): the request goes to another prefill
	// engine, without marking this one down; with none left the 503 is passed through with its
	// Retry-After.
	failPeerBusy = "handoff_peer_busy"
)

// failoverResult is the cb_gateway_attempts_total result and cb_gateway_failovers_total reason
// of a failover reason: failDecode and failPeerBusy are the prefill engine's 503s.
func failoverResult(fail string) string {
	if fail == failDecode || fail == failPeerBusy {
		return failUnavailable
	}
	return fail
}

// newNonce returns 24 random hex digits: the nonce of a decode-engine proof.
func newNonce() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// record is what the gateway learns of one request, for its span, metrics and log line.
type record struct {
	request
	outcome
	routing
	output
	hooks attemptHooks
	last  lastFailure
	// abandoned: the gateway gave up on the current attempt's upstream call before the engine
	// ended it (the client gone, the request timed out, the engine silent past IdleTimeout, or
	// its stream lost); reset per attempt.
	abandoned bool
}

// request is what the client asked.
type request struct {
	op, model, route string
	t0               time.Time
	stream           bool
	promptTokens     int
}

// outcome is how the request was answered.
type outcome struct {
	status    int
	errType   string
	apiErr    *api.Error
	requestID string // the answering engine's X-Request-Id
}

// routing is where the request went.
type routing struct {
	routed       bool // a decision was made
	engine       string
	decodeEngine string // with prefill/decode routing: the decode engine of the last attempt
	// decodeFallback: with prefill/decode routing no decode engine could take the request, so
	// it was served whole on the prefill side (no X-CB-Decode-Engine).
	decodeFallback bool
	decision       Decision
	cand           Candidate
	cands          []Candidate
	attempts       int
	queueWait      time.Duration
}

// output is what the engine's answer carried.
type output struct {
	hasTTFT      bool
	ttft         time.Duration
	outputTokens int
	contentEvts  int
}

// attemptHooks are the current attempt's callbacks.
type attemptHooks struct {
	// detach stops the attempt's upstream call from following the client (see forward); nil
	// outside an attempt.
	detach func()
	// onCommit, when set, runs once before the first byte of an engine's response is written.
	onCommit func()
	// progress is the current attempt's upstream activity (nil outside an attempt).
	progress *progress
}

// lastFailure is the last retryable failure's response, sent when no engine is left.
type lastFailure struct {
	reason string
	status int
	header http.Header
	body   []byte
}

// commit runs onCommit once: the response is about to be written.
func (rec *record) commit() {
	if f := rec.hooks.onCommit; f != nil {
		rec.hooks.onCommit = nil
		f()
	}
}

// fail records apiErr and sends it, unless the client is gone (499).
func (rec *record) fail(w http.ResponseWriter, apiErr *api.Error) {
	rec.apiErr, rec.status, rec.errType = apiErr, apiErr.Status, apiErr.ErrorType
	if apiErr.Status != api.StatusClientClosedRequest {
		apiErr.Write(w)
	}
}

// serveGenerate serves POST /v1/chat/completions and /v1/completions: the body is decoded
// with the engine's decoder (a bad request is answered here with the engine's error) and the
// prompt tokenized as the engine does.
func (g *Gateway) serveGenerate(w *statusWriter, r *http.Request, op, route string, t0 time.Time) {
	g.serveRouted(w, r, &record{request: request{op: op, route: route, t0: t0}}, func(rec *record, body []byte) ([][]int32, *api.Error) {
		rec.model = api.ModelOf(body)
		decode := api.DecodeChat
		if op == api.OperationTextCompletion {
			decode = api.DecodeCompletion
		}
		gen, apiErr := decode(body)
		if apiErr != nil {
			return nil, apiErr
		}
		rec.stream = gen.Stream
		return [][]int32{promptTokens(g.file, gen)}, nil
	})
}

// promptTokens returns the prompt's tokens as the engine builds them, the request's tools
// included: with a model file its chat template and tokenizer (modelfile.File.ChatTokensTools)
// or its tokens of the completion prompt; else BOS and the byte tokens of the chat template
// (api.ChatPromptTools) or of the completion prompt; or the prompt's token ids.
func promptTokens(f *modelfile.File, g *api.Generation) []int32 {
	var tok tokenizer.Tokenizer
	if f != nil {
		switch {
		case g.Operation == api.OperationChat:
			toks, _, err := f.ChatTokensTools(api.ChatMessages(g.Messages), g.Tools)
			if err != nil {
				return nil // the engine answers the error
			}
			return toks
		case g.PromptTokens != nil:
			return g.PromptTokens
		}
		return f.PromptTokens(g.Prompt)
	}
	switch {
	case g.Operation == api.OperationChat:
		return tok.AppendEncode([]int32{tokenizer.BOS}, api.ChatPromptTools(g.Messages, g.Tools))
	case g.PromptTokens != nil:
		return g.PromptTokens
	}
	return tok.AppendEncode([]int32{tokenizer.BOS}, g.Prompt)
}

// serveDocuments serves POST /v1/documents: the documents go to one engine, which ingests
// them.
func (g *Gateway) serveDocuments(w *statusWriter, r *http.Request, route string, t0 time.Time) {
	g.serveRouted(w, r, &record{request: request{route: route, t0: t0}}, func(rec *record, body []byte) ([][]int32, *api.Error) {
		docs, apiErr := api.DecodeDocuments(body)
		if apiErr != nil {
			return nil, apiErr
		}
		rec.model = docs.Model
		var tok tokenizer.Tokenizer
		toks := make([][]int32, len(docs.Docs))
		for i, d := range docs.Docs {
			if g.file != nil {
				toks[i] = g.file.Vocab.Encode(d.Text)
			} else {
				toks[i] = tok.Encode(d.Text)
			}
		}
		return toks, nil
	})
}

// serveRouted serves a generation (rec.op set) or a document ingest under the request's
// SERVER span, recorded by finish: it reads the body, parse decodes it into the token
// sequences the engine will hold (the prompt, or the documents), and the request is routed
// by them (the policy weighs the reuse each engine's index expects, and the load), forwarded,
// and registered in the chosen engine's reuse index.
func (g *Gateway) serveRouted(w *statusWriter, r *http.Request, rec *record, parse func(*record, []byte) ([][]int32, *api.Error)) {
	ctx, span := g.startSpan(r, rec)
	defer func() { g.finish(ctx, span, rec, w) }()
	body, apiErr := g.front.ReadRequest(w, r)
	var seqs [][]int32
	if apiErr == nil {
		seqs, apiErr = parse(rec, body)
	}
	if apiErr != nil {
		rec.fail(w, apiErr)
		return
	}
	for _, t := range seqs {
		rec.promptTokens += len(t)
	}
	job := &routeJob{req: &RouteRequest{Operation: rec.op, PromptTokens: max(1, rec.promptTokens)},
		hits: make([]int, len(g.pool.engines)), exclude: map[int]bool{}, handOver: rec.op != "" && g.decode != nil}
	if rec.op == "" {
		job.req.Operation, job.units = "documents", len(seqs)
	}
	for i, u := range g.pool.engines {
		for _, t := range seqs {
			job.hits[i] += u.index.Match(t)
		}
	}
	g.dispatch(ctx, w, r, rec, job, body, rec.route, func(u *upstream) {
		for _, t := range seqs {
			u.index.Register(t)
		}
	})
}

// dispatch routes the request and forwards it, failing over to another engine while attempts
// fail before anything was written to the client. register records the request in the chosen
// engine's reuse index when it is routed there.
func (g *Gateway) dispatch(ctx context.Context, w *statusWriter, r *http.Request, rec *record, job *routeJob, body []byte, path string, register func(*upstream)) {
	reqCtx, cancel := context.WithTimeout(ctx, g.cfg.RequestTimeout)
	defer cancel()
	var djob *routeJob // the decode engine's job of a hand-over
	if job.handOver {
		djob = &routeJob{req: job.req, hits: make([]int, len(g.decode.engines)), exclude: map[int]bool{}}
	}
	for {
		qctx, qcancel := context.WithTimeout(reqCtx, g.cfg.QueueTimeout)
		l, err := g.pool.acquire(qctx, job)
		var dl *lease
		if err == nil && djob != nil {
			// The decode engine: least loaded among the healthy ones not failed for this
			// request, from its own pool (slots, queue). None reachable: the prefill engine
			// serves the request whole (it is an engine like any other).
			switch dl, err = g.decode.acquire(qctx, djob); {
			case errors.Is(err, errNoEngine):
				dl, err = nil, nil
				rec.decodeFallback = true
			case err != nil:
				g.pool.release(l)
			}
		}
		qcancel()
		if err != nil {
			g.refuse(w, r, rec, reqCtx, err)
			return
		}
		rec.queueWait += l.waited
		g.metrics.QueueWait(l.waited)
		rec.attempts++
		rec.routed, rec.engine, rec.decision, rec.cand, rec.cands = true, l.u.name, l.decision, l.cand, l.all
		g.metrics.RouteDecision(g.policyName, l.u.name, l.decision.Reason, rec.promptTokens, min(l.cand.ExpectedHitTokens, rec.promptTokens))
		register(l.u)
		extra := l.decision.Header
		rec.decodeEngine = ""
		if dl != nil {
			rec.decodeEngine, rec.decodeFallback = dl.u.name, false
			extra = extra.Clone()
			if extra == nil {
				extra = http.Header{}
			}
			extra.Set(api.HeaderDecodeEngine, dl.u.url)
			// The gateway's proof that it chose the decode engine (the prefill engine refuses
			// the header without it).
			if u, err := api.ParseDecodeEngine(dl.u.url); err == nil && len(g.cfg.StackKey) > 0 {
				extra.Set(api.HeaderDecodeAuth, api.DecodeAuth(g.cfg.StackKey, u, newNonce(), time.Now().Add(api.HandoffTTL)))
			}
		}
		fail := g.attempt(reqCtx, w, r, rec, l, extra, body, path)
		g.pool.release(l)
		if dl != nil {
			g.decode.release(dl)
		}
		if fail == failDecode && dl != nil {
			// The decode engine failed: another one, on the same prefill engine.
			g.metrics.Failover(dl.u.name, failUnavailable)
			djob.exclude[dl.u.i] = true
			g.markDown(g.decode, dl.u, "hand-over failed: "+failDecode)
			continue
		}
		if fail == "" {
			if !w.Wrote() && rec.apiErr != nil && rec.apiErr.Status != api.StatusClientClosedRequest {
				rec.apiErr.Write(w) // the request timed out before the engine answered
			}
			return
		}
		g.metrics.Failover(l.u.name, failoverResult(fail))
		job.exclude[l.u.i] = true
		if fail != failQueueFull && fail != failPeerBusy {
			g.markDown(g.pool, l.u, "request failed: "+fail)
		}
	}
}

// refuse answers a request the pool could not route.
func (g *Gateway) refuse(w *statusWriter, r *http.Request, rec *record, reqCtx context.Context, err error) {
	ra := retryAfter(g.cfg.HealthInterval)
	switch {
	case errors.Is(err, errQueueFull):
		g.metrics.Rejection("queue_full")
		w.Header().Set("Retry-After", ra)
		rec.fail(w, queueFull(g.cfg.MaxQueue))
	case errors.Is(err, errQueueTimeout) && reqCtx.Err() == nil:
		g.metrics.Rejection("queue_timeout")
		w.Header().Set("Retry-After", ra)
		rec.fail(w, queueTimeout(g.cfg.QueueTimeout))
	case errors.Is(err, errNoEngine) && rec.last.status != 0:
		// Every engine that could be tried failed; send the last one's answer.
		g.metrics.Rejection("no_engine")
		copyHeaders(w.Header(), rec.last.header)
		w.Header().Set(HeaderEngine, rec.engine)
		if w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", ra)
		}
		w.WriteHeader(rec.last.status)
		_, _ = w.Write(rec.last.body)
		rec.status, rec.errType = rec.last.status, errorTypeOfStatus(rec.last.status)
	case errors.Is(err, errNoEngine):
		g.metrics.Rejection("no_engine")
		w.Header().Set("Retry-After", ra)
		detail := "no engine is up"
		if rec.last.reason != "" {
			detail = fmt.Sprintf("every engine tried failed (last: %s %s)", rec.engine, rec.last.reason)
		}
		rec.fail(w, noEngine(detail))
	case r.Context().Err() == nil && errors.Is(reqCtx.Err(), context.DeadlineExceeded):
		rec.fail(w, api.Timeout("it ran past the request timeout"))
	default:
		rec.fail(w, api.Canceled())
	}
}

// attempt forwards the request to the lease's engine and relays the answer. It returns a
// failover reason when the engine failed before anything was written to the client (the
// caller tries another engine), else "" (the request is answered, or the client is gone).
func (g *Gateway) attempt(ctx context.Context, w *statusWriter, r *http.Request, rec *record, l *lease, extra http.Header, body []byte, path string) string {
	u := l.u
	attrs := []attribute.KeyValue{
		attribute.String("route.engine", u.name),
		attribute.Int("route.attempt", rec.attempts),
		attribute.String("http.request.method", r.Method),
		attribute.String("server.address", u.name),
	}
	if extra.Get(api.HeaderDecodeEngine) != "" {
		attrs = append(attrs, attribute.String("route.decode_engine", rec.decodeEngine))
	}
	actx, span := g.spans.Start(ctx, spanname.GatewayAttempt, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	// The attempt is cut when the engine is taken out of routing before its response began
	// (a failed health check, or another request's failed attempt): it fails over.
	actx, cancel := context.WithCancelCause(actx)
	defer cancel(nil)
	pr := &progress{cancel: cancel}
	rec.hooks.onCommit, rec.hooks.progress, rec.abandoned = g.pool.track(u, pr), pr, false
	fail, errType, err := g.forward(actx, w, r, rec, u, extra, body, path, span)
	rec.commit()
	rec.hooks.progress = nil
	if fail != "" || rec.abandoned {
		// The gateway gave up on the call: the engine's spans under it may outlive it.
		span.SetAttributes(attribute.Bool(AttrAbandoned, true))
	}
	switch {
	case fail != "":
		span.SetError(fail, err)
		g.metrics.Attempt(u.name, failoverResult(fail))
		rec.last.reason = fail
		if fail == failUnreachable {
			rec.last.status, rec.last.header, rec.last.body = 0, nil, nil
		}
	case errType == "broken":
		span.SetError(api.ErrorTypeWorkerUnavailable, err)
		g.metrics.Attempt(u.name, "broken")
	default:
		g.metrics.Attempt(u.name, "ok")
		if errType != "" {
			span.SetAttributes(telemetry.ErrorTypeKey.String(errType))
		}
	}
	span.End()
	return fail
}

// forward sends one attempt and relays the response. It returns the failover reason (nothing
// written), or errType "broken" when the engine was lost after the response began.
func (g *Gateway) forward(ctx context.Context, w *statusWriter, r *http.Request, rec *record, u *upstream, extra http.Header, body []byte, path string, span *telemetry.Span) (fail, errType string, err error) {
	// The upstream call follows ctx (the client leaving, the attempt cut) until the last event
	// of a stream has been relayed; from then on (detach) the call only reads the engine's end
	// of the response, bounded by trailerWait, so that a client leaving right after [DONE]
	// does not end the attempt before the engine has finished answering.
	upCtx, upCancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer upCancel(nil)
	stopFollow := context.AfterFunc(ctx, func() { upCancel(context.Cause(ctx)) })
	defer stopFollow()
	rec.hooks.detach = func() {
		if stopFollow() {
			time.AfterFunc(trailerWait, func() { upCancel(errTrailerWait) })
		}
	}
	pr := rec.hooks.progress
	if pr == nil {
		pr = &progress{}
	}
	stopIdle := idle.Watch(g.cfg.IdleTimeout, &pr.Activity, func() { upCancel(errIdleTimeout) })
	defer stopIdle()
	req, err := http.NewRequestWithContext(upCtx, r.Method, u.url+path, bytes.NewReader(body))
	if err != nil {
		return failUnreachable, "", err
	}
	for _, k := range []string{"Content-Type", "Accept", "Accept-Encoding", "User-Agent"} {
		if v := r.Header.Values(k); len(v) > 0 {
			req.Header[k] = v
		}
	}
	if req.Header.Get("Content-Type") == "" && len(body) > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
	if g.cfg.EngineAPIKey != "" {
		req.Header.Set("Authorization", "Bearer "+g.cfg.EngineAPIKey)
	} else if v := r.Header.Values("Authorization"); len(v) > 0 {
		req.Header["Authorization"] = v
	}
	for k, v := range extra {
		req.Header[k] = v
	}
	telemetry.InjectHTTP(ctx, req.Header)
	resp, err := g.client.Do(req)
	if err != nil {
		if clientDone(ctx) {
			return clientGone(r, rec, ctx, err)
		}
		return failUnreachable, "", upstreamError(upCtx, u, err)
	}
	pr.Touch()
	resp.Body = idle.Body(resp.Body, &pr.Activity)
	defer resp.Body.Close()
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	switch resp.StatusCode {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		b, _ := drain(resp.Body, 64<<10)
		rec.last.status, rec.last.header, rec.last.body = resp.StatusCode, resp.Header.Clone(), b
		if resp.StatusCode == http.StatusTooManyRequests {
			return failQueueFull, "", fmt.Errorf("engine %s: %s", u.name, resp.Status)
		}
		if extra.Get(api.HeaderDecodeEngine) != "" {
			switch errorCode(b) {
			case failDecode:
				return failDecode, "", fmt.Errorf("engine %s: %s decode_unavailable (decode engine %s)", u.name, resp.Status, rec.decodeEngine)
			case failPeerBusy:
				return failPeerBusy, "", fmt.Errorf("engine %s: %s handoff_peer_busy (decode engine %s)", u.name, resp.Status, rec.decodeEngine)
			}
		}
		return failUnavailable, "", fmt.Errorf("engine %s: %s", u.name, resp.Status)
	}
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return g.relayStream(ctx, upCtx, w, r, rec, u, resp)
	}
	return g.relayWhole(ctx, upCtx, w, r, rec, u, resp)
}

// AttrAbandoned is the bool attribute set (true) on a gateway.attempt span whose upstream
// call the gateway gave up on: failed over, the client gone, the request timed out, the
// engine silent past IdleTimeout or its stream lost. The engine's spans under such an attempt
// may end after it.
const AttrAbandoned = "gateway.abandoned"

// errIdleTimeout cuts an upstream call whose engine sent no byte for Config.IdleTimeout.
var errIdleTimeout = errors.New("gateway: no byte from the engine within the idle timeout")

// upstreamError names the idle timeout when it is what cut the call behind err.
func upstreamError(upCtx context.Context, u *upstream, err error) error {
	if errors.Is(context.Cause(upCtx), errIdleTimeout) {
		return fmt.Errorf("engine %s: %w: %w", u.name, errIdleTimeout, err)
	}
	return err
}

// clientDone reports whether ctx ended because the client went away or the request timed
// out, not because the gateway cut the attempt (errEngineDown).
func clientDone(ctx context.Context) bool {
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), errEngineDown)
}

// clientGone records a request whose context ended under an attempt, with err: 504 after
// the request timeout (sent when nothing was written yet), else 499. It returns the
// attempt's result (answered: no failover).
func clientGone(r *http.Request, rec *record, ctx context.Context, err error) (string, string, error) {
	rec.abandoned = true
	if r.Context().Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		rec.apiErr = api.Timeout("it ran past the request timeout")
	} else {
		rec.apiErr = api.Canceled()
	}
	rec.status, rec.errType = rec.apiErr.Status, rec.apiErr.ErrorType
	return "", rec.errType, err
}

// clientClosed records a request whose client could not be written to (499), with err. It
// returns the attempt's result (answered: no failover).
func (rec *record) clientClosed(err error) (string, string, error) {
	rec.abandoned = true
	rec.status, rec.errType = api.StatusClientClosedRequest, api.ErrorTypeCanceled
	return "", rec.errType, err
}

// respond commits the response: it takes the engine's end-to-end headers, names the engine,
// and records the engine's request id and status.
func (rec *record) respond(w *statusWriter, u *upstream, resp *http.Response) http.Header {
	rec.commit()
	h := w.Header()
	copyHeaders(h, resp.Header)
	h.Set(HeaderEngine, u.name)
	rec.requestID, rec.status = resp.Header.Get("X-Request-Id"), resp.StatusCode
	return h
}

// relayWhole relays a non-streamed response. A body up to MaxBufferedBody is read in full
// before anything is written, so an engine lost in the middle is failed over.
func (g *Gateway) relayWhole(ctx, upCtx context.Context, w *statusWriter, r *http.Request, rec *record, u *upstream, resp *http.Response) (string, string, error) {
	limit := g.cfg.MaxBufferedBody
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		if clientDone(ctx) {
			return clientGone(r, rec, ctx, err)
		}
		return failUnreachable, "", upstreamError(upCtx, u, err)
	}
	h := rec.respond(w, u, resp)
	rec.errType = errorTypeOfStatus(resp.StatusCode)
	if int64(len(b)) <= limit {
		h.Set("Content-Length", fmt.Sprint(len(b)))
	}
	w.WriteHeader(resp.StatusCode)
	_, werr := w.Write(b)
	if int64(len(b)) > limit && werr == nil {
		_, err = io.Copy(w, resp.Body)
	}
	if resp.StatusCode == http.StatusOK && rec.op != "" {
		var out struct {
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(b, &out) == nil && out.Usage != nil && out.Usage.CompletionTokens >= 0 {
			rec.outputTokens = out.Usage.CompletionTokens
		}
	}
	if werr != nil {
		return rec.clientClosed(werr)
	}
	if err != nil {
		rec.errType, rec.abandoned = api.ErrorTypeWorkerUnavailable, true
		return "", "broken", upstreamError(upCtx, u, err)
	}
	return "", rec.errType, nil
}

// relayStream relays a streamed response (server-sent events). Events before the first one
// with content (the chat role event) are held back: an engine lost before it, or one that
// sends an error event of an unavailable worker first, is failed over as if it had never
// answered. From the first content on every event is passed through and flushed, and while
// the engine is silent the client gets ": keep-alive" comment lines every Config.KeepAlive;
// an engine lost later (or silent past Config.IdleTimeout) ends the stream with an error
// event and [DONE].
func (g *Gateway) relayStream(ctx, upCtx context.Context, w *statusWriter, r *http.Request, rec *record, u *upstream, resp *http.Response) (string, string, error) {
	sr := newSSEReader(resp.Body)
	var pending []byte
	out := &clientStream{w: w}
	defer out.close()
	for {
		ev, err := sr.next()
		if err != nil {
			if clientDone(ctx) {
				return clientGone(r, rec, ctx, err)
			}
			err = upstreamError(upCtx, u, err)
			if !out.committed() {
				return failUnreachable, "", fmt.Errorf("engine %s: stream lost before it began: %w", u.name, err)
			}
			lost := engineLost(u.name)
			if errors.Is(err, errIdleTimeout) {
				lost = idleTimeout(u.name, g.cfg.IdleTimeout)
			}
			b, _ := json.Marshal(lost.Body())
			_ = out.write(fmt.Appendf(nil, "data: %s\n\ndata: [DONE]\n\n", b))
			rec.errType, rec.apiErr, rec.abandoned = lost.ErrorType, lost, true
			return "", "broken", fmt.Errorf("engine %s: stream lost: %w", u.name, err)
		}
		if !out.committed() {
			if ev.Error && (ev.Code == "worker_unavailable" || ev.Code == "shutting_down") {
				return failUnavailable, "", fmt.Errorf("engine %s: error event %s before the stream began", u.name, ev.Code)
			}
			if ev.Error && ev.Code == failDecode && rec.decodeEngine != "" {
				e := &api.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: failDecode,
					Message: "The decode engine " + rec.decodeEngine + " is unavailable.", ErrorType: api.ErrorTypeWorkerUnavailable}
				eb, _ := json.Marshal(e.Body())
				rec.last.status, rec.last.header, rec.last.body = e.Status, http.Header{"Content-Type": {"application/json"}}, eb
				return failDecode, "", fmt.Errorf("engine %s: error event %s before the stream began", u.name, ev.Code)
			}
			if !(ev.Content || ev.Finish || ev.Usage || ev.Done || ev.Error) {
				pending = append(pending, ev.Raw...)
				continue
			}
			rec.respond(w, u, resp).Del("Content-Length")
			w.WriteHeader(http.StatusOK)
			if err := out.commit(pending, g.cfg.KeepAlive); err != nil {
				return rec.clientClosed(err)
			}
		}
		if ev.Content {
			if !rec.hasTTFT {
				rec.hasTTFT, rec.ttft = true, time.Since(rec.t0)
			}
			rec.contentEvts++
		}
		if ev.Usage {
			rec.outputTokens = ev.CompletionTokens
		}
		if ev.Error {
			rec.errType = errorTypeOfCode(ev.Code)
		}
		if err := out.write(ev.Raw); err != nil {
			return rec.clientClosed(err)
		}
		if ev.Done {
			out.close()
			if rec.hooks.detach != nil {
				rec.hooks.detach()
			}
			_, _ = drain(resp.Body, 4096)
			return "", rec.errType, nil
		}
	}
}

// keepAliveLine is the SSE comment the gateway writes to a client while the engine is silent.
const keepAliveLine = ": keep-alive\n\n"

// clientStream is the client's side of a relayed stream once committed: writes flushed one
// by one, and a keep-alive comment whenever nothing was written for the keep-alive period.
// The relay and the keep-alive goroutine write under mu; close stops the goroutine and waits
// for it (call it before the handler returns). Not usable after close.
type clientStream struct {
	w *statusWriter

	mu     sync.Mutex
	last   time.Time // of the last write
	err    error     // the first write error
	closed bool
	stop   chan struct{} // nil until commit
	exited chan struct{}
}

func (c *clientStream) committed() bool { return c.stop != nil }

// commit writes the held-back events and starts the keep-alives every period.
func (c *clientStream) commit(pending []byte, period time.Duration) error {
	c.stop, c.exited = make(chan struct{}), make(chan struct{})
	err := c.write(pending)
	go c.keepAlive(period)
	return err
}

// write writes b and flushes it.
func (c *clientStream) write(b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeLocked(b)
}

func (c *clientStream) writeLocked(b []byte) error {
	if c.err != nil {
		return c.err
	}
	if _, c.err = c.w.Write(b); c.err == nil {
		c.err = c.w.FlushError()
	}
	c.last = time.Now()
	return c.err
}

// keepAlive writes keepAliveLine whenever nothing was written for period, until close.
func (c *clientStream) keepAlive(period time.Duration) {
	defer close(c.exited)
	t := time.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.mu.Lock()
			if c.closed || c.err != nil {
				c.mu.Unlock()
				return
			}
			left := period - now.Sub(c.last)
			if left <= 0 {
				_ = c.writeLocked([]byte(keepAliveLine))
				left = period
			}
			c.mu.Unlock()
			t.Reset(left)
		}
	}
}

// close stops the keep-alives and waits for their goroutine. Idempotent.
func (c *clientStream) close() {
	c.mu.Lock()
	was := c.closed
	c.closed = true
	c.mu.Unlock()
	if c.stop != nil && !was {
		close(c.stop)
		<-c.exited
	}
}

// errorCode returns the code of an OpenAI-shaped error body, "" when it has none.
func errorCode(b []byte) string {
	var eb api.ErrorBody
	if json.Unmarshal(b, &eb) != nil || eb.Error.Code == nil {
		return ""
	}
	return *eb.Error.Code
}

// trailerWait bounds the read of a stream's end after its last event was relayed.
const trailerWait = 5 * time.Second

// errTrailerWait cuts an upstream call whose end did not come within trailerWait.
var errTrailerWait = errors.New("gateway: the engine's stream did not end after its last event")

// hopByHop are the headers a proxy does not pass on.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
}

// copyHeaders copies src's end-to-end headers into dst.
func copyHeaders(dst, src http.Header) {
	for k, v := range src {
		if !hopByHop[http.CanonicalHeaderKey(k)] {
			dst[k] = append([]string(nil), v...)
		}
	}
}

// drain reads at most limit bytes of r and returns them.
func drain(r io.Reader, limit int64) ([]byte, error) {
	return io.ReadAll(io.LimitReader(r, limit))
}

// startSpan opens the request's SERVER span, gateway.request, a child of the caller's
// traceparent when it is valid.
func (g *Gateway) startSpan(r *http.Request, rec *record) (context.Context, *telemetry.Span) {
	attrs := []attribute.KeyValue{
		attribute.String("http.request.method", r.Method),
		attribute.String("http.route", rec.route),
		attribute.String("route.policy", g.policy.Name()),
	}
	if rec.op != "" {
		attrs = append(attrs, attribute.String("gen_ai.operation.name", rec.op))
	}
	parent := telemetry.ExtractHTTP(r.Context(), r.Header)
	return g.spans.Start(parent, spanname.GatewayRequest, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(rec.t0), trace.WithAttributes(attrs...))
}

// finish records the request: the SERVER span's routing attributes and status, the metrics,
// and one JSON log line (inside the span), then ends the span.
func (g *Gateway) finish(ctx context.Context, span *telemetry.Span, rec *record, w *statusWriter) {
	end := time.Now()
	status := cmp.Or(rec.status, w.Status, http.StatusOK)
	if rec.errType == "" && status >= 400 {
		rec.errType = errorTypeOfStatus(status)
	}
	expected := min(rec.cand.ExpectedHitTokens, rec.promptTokens)
	span.SetAttributes(
		attribute.String("route.engine", rec.engine),
		attribute.Float64("route.score", rec.decision.Score),
		attribute.Int("route.expected_hit_tokens", expected),
		attribute.Int("route.prompt_tokens", rec.promptTokens),
		attribute.Int("route.attempts", rec.attempts),
		attribute.Float64("route.queue_wait_ms", float64(rec.queueWait.Microseconds())/1000),
		attribute.Int("http.response.status_code", status),
	)
	if rec.routed {
		span.SetAttributes(attribute.String("route.reason", rec.decision.Reason))
	}
	if rec.decodeEngine != "" {
		span.SetAttributes(attribute.String("route.decode_engine", rec.decodeEngine))
	}
	switch {
	case status >= 500 || rec.errType == api.ErrorTypeWorkerUnavailable:
		var cause error
		if rec.apiErr != nil {
			cause = errors.New(rec.apiErr.Message)
		}
		span.SetError(rec.errType, cause)
	case rec.errType != "":
		span.SetAttributes(telemetry.ErrorTypeKey.String(rec.errType))
	}
	out := cmp.Or(rec.outputTokens, rec.contentEvts)
	g.metrics.RecordRequest(ctx, metrics.GatewayRequestRecord{
		Operation: rec.op, Model: rec.model, Policy: g.policyName, Engine: rec.engine, Status: status,
		ErrorType: rec.errType, E2E: end.Sub(rec.t0), TTFT: rec.ttft, HasTTFT: rec.hasTTFT, OutputTokens: out,
	})
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelError
	}
	attrs := []slog.Attr{
		slog.String("route", rec.route),
		// The answering engine's id, else the one the gateway's own answer carries (its error
		// made here, with api.NewRequestID): the id the client can quote.
		slog.String("request_id", cmp.Or(rec.requestID, w.Header().Get(api.HeaderRequestID))),
		slog.Int("status", status),
		slog.String("error_type", rec.errType),
		slog.String("engine", rec.engine),
		slog.String("decode_engine", rec.decodeEngine),
		slog.Bool("decode_fallback", rec.decodeFallback),
		slog.String("policy", g.policy.Name()),
		slog.String("reason", rec.decision.Reason),
		slog.Float64("score", rec.decision.Score),
		slog.Int("expected_hit_tokens", expected),
		slog.Int("prompt_tokens", rec.promptTokens),
		slog.Int("attempts", rec.attempts),
		slog.Float64("queue_wait_s", rec.queueWait.Seconds()),
		slog.Float64("duration_s", end.Sub(rec.t0).Seconds()),
		slog.Bool("stream", rec.stream),
	}
	if rec.hasTTFT {
		attrs = append(attrs, slog.Float64("ttft_s", rec.ttft.Seconds()))
	}
	if len(rec.cands) > 0 {
		// What the policy saw: engine load/expected hit tokens per candidate.
		cands := make([]string, len(rec.cands))
		for i, c := range rec.cands {
			cands[i] = fmt.Sprintf("%s load=%.2f hit=%d", c.Name, c.Load, c.ExpectedHitTokens)
		}
		attrs = append(attrs, slog.String("candidates", strings.Join(cands, " ")))
	}
	if rec.apiErr != nil {
		attrs = append(attrs, slog.String("error", rec.apiErr.Message))
	}
	g.log.LogAttrs(ctx, level, "request", attrs...)
	span.End(trace.WithTimestamp(end))
}

// serveModels forwards GET /v1/models (and /v1/models/{model}) to an engine that is up, the
// least loaded first, failing over to the others.
func (g *Gateway) serveModels(w *statusWriter, r *http.Request, _ string, _ time.Time) {
	if apiErr := g.front.Authorize(r); apiErr != nil {
		apiErr.Write(w)
		return
	}
	snap := g.pool.snapshot()
	order := make([]int, 0, len(snap))
	for i, s := range snap {
		if s.up {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(snap[a].load, snap[b].load) })
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.RequestTimeout)
	defer cancel()
	rec := &record{request: request{t0: time.Now()}}
	for _, i := range order {
		u := g.pool.engines[i]
		rec.engine = u.name
		fail, _, _ := g.forward(ctx, w, r, rec, u, nil, nil, r.URL.Path, nil)
		if fail == "" {
			return
		}
		if fail != failQueueFull {
			g.markDown(g.pool, u, "request failed: "+fail)
		}
	}
	w.Header().Set("Retry-After", retryAfter(g.cfg.HealthInterval))
	noEngine("no engine is up").Write(w)
}
