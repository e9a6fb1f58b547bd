package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/engine/scheduler"
	"github.com/cacheblend/cacheblend/internal/idle"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

// Roles of an engine in prefill/decode disaggregation (Config.Role,
// docs/design.md §9).
const (
	// RoleBoth serves every request whole (prefill and decode); it refuses
	// the hand-over headers.
	RoleBoth = "both"
	// RolePrefill serves requests whole and, for a request naming a decode
	// engine (api.HeaderDecodeEngine), runs the prefill with CacheBlend
	// reuse, samples the first token and hands the request over.
	RolePrefill = "prefill"
	// RoleDecode serves requests whole and takes over requests a prefill
	// engine hands over (api.HeaderHandoff).
	RoleDecode = "decode"
)

// maxRelayBytes bounds a non-streamed answer relayed from a decode engine;
// maxRelayLine bounds one line of a relayed event stream.
const (
	maxRelayBytes = 64 << 20
	maxRelayLine  = 1 << 20
)

// handoffOf parses the request's hand-over header (decode side): nil, nil
// when there is none.
func handoffOf(r *http.Request) (*api.Handoff, error) {
	v := r.Header.Get(api.HeaderHandoff)
	if v == "" {
		return nil, nil
	}
	h, err := api.ParseHandoff(v)
	if err != nil {
		return nil, err
	}
	return &h, nil
}

// wrongRole is the 400 of a hand-over header sent to an engine of another
// role.
func wrongRole(header, role, want string) *api.Error {
	return &api.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "wrong_role",
		Message:   fmt.Sprintf("Header %s needs an engine with role %s; this engine's role is %s.", header, want, role),
		ErrorType: api.ErrorTypeInvalidRequest}
}

// badHandoff is the 400 of a malformed or mismatched hand-over.
func badHandoff(code, format string, args ...any) *api.Error {
	return &api.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code,
		Message: fmt.Sprintf(format, args...), ErrorType: api.ErrorTypeInvalidRequest}
}

// decodeUnavailable is the 503 of a decode engine that could not be
// reached or went away before answering: nothing was sent to the caller,
// which may retry with another decode engine.
func decodeUnavailable(err error) *api.Error {
	return &api.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "decode_unavailable",
		Message: "The decode engine is unavailable: " + err.Error(), ErrorType: api.ErrorTypeWorkerUnavailable}
}

// checkHandoff checks the hand-over headers of a decoded request against
// the engine's role; decodeURL is the decode engine to hand over to
// (prefill side), ho the hand-over to take over (decode side).
func (e *Engine) checkHandoff(r *http.Request, ho *api.Handoff, hoErr error, prompt []int32) (decodeURL string, _ *api.Error) {
	dh := r.Header.Get(api.HeaderDecodeEngine)
	taking := ho != nil || hoErr != nil
	switch {
	case dh != "" && taking:
		return "", badHandoff("invalid_handoff", "Headers %s and %s exclude each other.", api.HeaderDecodeEngine, api.HeaderHandoff)
	case taking && e.cfg.Role != RoleDecode:
		return "", wrongRole(api.HeaderHandoff, e.cfg.Role, RoleDecode)
	case dh != "" && e.cfg.Role != RolePrefill:
		return "", wrongRole(api.HeaderDecodeEngine, e.cfg.Role, RolePrefill)
	case hoErr != nil:
		return "", badHandoff("invalid_handoff", "Header %s: %v.", api.HeaderHandoff, hoErr)
	case ho != nil:
		// Signed by a prefill engine of this stack, for this decode engine
		// (as the prefill engine addressed it), for this prompt, not expired.
		if err := ho.Verify(e.cfg.StackKey, selfURL(r), time.Now()); err != nil {
			return "", e.unauthenticated(api.HeaderHandoff, err)
		}
		if ho.N != len(prompt) || ho.Digest != api.PromptDigest(prompt) {
			return "", badHandoff("handoff_mismatch", "The prompt (%d tokens here) is not the one the prefill engine handed over (%d tokens).", len(prompt), ho.N)
		}
		if len(e.cfg.HandoffSources) > 0 && !slices.Contains(e.cfg.HandoffSources, ho.Worker) {
			return "", badHandoff("invalid_handoff", "Prefill worker %s is not among this engine's hand-over sources.", ho.Worker)
		}
		ho.Tokens = prompt // the decode worker checks the pulled blocks against them
		return "", nil
	case dh != "":
		u, err := api.ParseDecodeEngine(dh)
		if err != nil {
			return "", badHandoff("invalid_handoff", "Header %s: %v.", api.HeaderDecodeEngine, err)
		}
		// Only the gateway names decode engines (its proof, made with the
		// stack key), and only those of the allow-list.
		if err := api.VerifyDecodeAuth(e.cfg.StackKey, r.Header.Get(api.HeaderDecodeAuth), u, time.Now()); err != nil {
			return "", e.unauthenticated(api.HeaderDecodeEngine, err)
		}
		if !e.allowed[u] {
			e.sec.Refused(metrics.RefusedNotAllowed)
			return "", &api.Error{Status: http.StatusForbidden, Type: "permission_error", Code: CodeDecodeEngineNotAllowed,
				Message:   fmt.Sprintf("Decode engine %s is not in this prefill engine's allow-list (--decode-engine).", u),
				ErrorType: api.ErrorTypeUnauthorized}
		}
		if err := CheckAdvertise(e.cfg.WorkerAdvertise, u); err != nil {
			return "", &api.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: CodeHandoffMisconfigured,
				Message: err.Error(), ErrorType: api.ErrorTypeInternal}
		}
		return u, nil
	}
	return "", nil
}

// Codes of the 403 and 503 answers that protect a hand-over (docs/design.md
// §9, "Security").
const (
	// CodeHandoffUnauthenticated: X-CB-Handoff without a valid signature,
	// or X-CB-Decode-Engine without the gateway's valid proof
	// (X-CB-Decode-Auth), or an engine without a stack key.
	CodeHandoffUnauthenticated = "handoff_unauthenticated"
	// CodeDecodeEngineNotAllowed: X-CB-Decode-Engine names an engine
	// outside Config.DecodeEngines.
	CodeDecodeEngineNotAllowed = "decode_engine_not_allowed"
	// CodeHandoffPeerBusy: Config.MaxHandoffsPerPeer hand-overs to that
	// decode engine are in flight (503, Retry-After).
	CodeHandoffPeerBusy = "handoff_peer_busy"
)

// unauthenticated counts and answers a hand-over header that did not
// authenticate (err from api.Handoff.Verify or api.VerifyDecodeAuth).
func (e *Engine) unauthenticated(header string, err error) *api.Error {
	reason := metrics.RefusedBadSignature
	switch {
	case errors.Is(err, api.ErrNoStackKey):
		reason = metrics.RefusedNoKey
	case errors.Is(err, api.ErrExpired):
		reason = metrics.RefusedExpired
	}
	e.sec.Refused(reason)
	return &api.Error{Status: http.StatusForbidden, Type: "permission_error", Code: CodeHandoffUnauthenticated,
		Message: fmt.Sprintf("Header %s is not authenticated: %v.", header, err), ErrorType: api.ErrorTypeUnauthorized}
}

// selfURL is this engine's base URL as the caller addressed it (scheme and
// Host header): the decode engine a hand-over must have been signed for.
func selfURL(r *http.Request) string {
	if r.TLS != nil {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

// acquirePeer takes one of the hand-over slots of the decode engine u; ok
// is false when its Config.MaxHandoffsPerPeer are taken. release gives the
// slot back (once).
func (e *Engine) acquirePeer(u string) (release func(), ok bool) {
	e.peerMu.Lock()
	defer e.peerMu.Unlock()
	if e.peers[u] >= e.cfg.MaxHandoffsPerPeer {
		return nil, false
	}
	e.peers[u]++
	var once sync.Once
	return func() {
		once.Do(func() {
			e.peerMu.Lock()
			defer e.peerMu.Unlock()
			if e.peers[u]--; e.peers[u] <= 0 {
				delete(e.peers, u)
			}
		})
	}, true
}

// CodeHandoffMisconfigured is the code of the 500 of a hand-over the
// prefill engine refuses because of its own configuration (a loopback
// WorkerAdvertise and a decode engine on another host).
const CodeHandoffMisconfigured = "handoff_misconfigured"

// IsLoopback reports whether the host of hostport (or of a URL) is a
// loopback address or "localhost".
func IsLoopback(hostport string) bool {
	if u, err := url.Parse(hostport); err == nil && u.Host != "" {
		hostport = u.Host
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckAdvertise refuses handing the worker address advertise over to the
// decode engine at decodeURL when advertise is a loopback address and the
// decode engine is not on loopback: its worker would dial its own host.
// The error says the fix.
func CheckAdvertise(advertise, decodeURL string) error {
	if !IsLoopback(advertise) || IsLoopback(decodeURL) {
		return nil
	}
	return fmt.Errorf("this prefill engine advertises its worker as %s, a loopback address the decode engine %s on another host cannot reach: "+
		"start it with --worker-advertise HOST:PORT (CB_ENGINE_WORKER_ADVERTISE), the worker's address as the decode hosts reach it", advertise, decodeURL)
}

// prefilled is the scheduler's view of a hand-over to take over: its pull
// asks the engine's worker to read the KV from the prefill worker.
func (e *Engine) prefilled(ho *api.Handoff) *scheduler.Prefilled {
	return &scheduler.Prefilled{FirstToken: ho.FirstToken, RNGDraws: ho.Draws,
		Pull: func(ctx context.Context, bt []int32, from int) (int64, error) {
			tp, ts := telemetry.InjectStrings(ctx)
			resp, err := e.worker.PullKV(ctx, &cbv1.PullKVRequest{
				RequestId: ho.ID, TraceContext: tp, TraceState: ts, Source: ho.Worker, Secret: ho.Secret,
				BlockTable: bt, FromBlock: int32(from), NTokens: int32(ho.N), Tokens: ho.Tokens,
			})
			return resp.GetBytes(), err
		}}
}

// awaitTransfer waits, on the decode side, until the request's KV has been
// pulled, then puts the transfer's report in the answer's headers and
// records it. It answers the error and returns false when the hand-over
// failed (nothing was written yet, so the status is the error's).
func (e *Engine) awaitTransfer(w *statusWriter, r *http.Request, reqCtx context.Context, rec *genRecord) bool {
	h := rec.h
	var res scheduler.Result
	for {
		res = h.Snapshot()
		// A failed pull ends the request in an update of its own, after the
		// transfer's: only a successful one (OK) ends the wait early.
		if res.Done || (res.Transfer != nil && res.Transfer.OK) || reqCtx.Err() != nil {
			break
		}
		select {
		case <-h.Changed():
		case <-h.Done():
		case <-reqCtx.Done():
		}
	}
	rep := metrics.KVHandoff{Direction: metrics.HandoffReceived, OK: res.Err == nil && res.Transfer != nil && res.Transfer.OK}
	if t := res.Transfer; t != nil {
		rep.Bytes, rep.BlocksSent, rep.BlocksDeduped = t.Bytes, int64(t.Sent), int64(t.Deduped)
		api.KVReport{Bytes: t.Bytes, BlocksSent: t.Sent, BlocksDeduped: t.Deduped}.Set(w.Header())
	}
	e.metrics.RecordKVHandoff(rep)
	if !rep.OK && (res.Done || reqCtx.Err() != nil) {
		apiErr, cause := resultError(r, reqCtx, res)
		rec.fail(w, apiErr, cause)
		return false
	}
	return true
}

// handOver serves a request on the prefill side: it prefills it (with
// CacheBlend reuse), samples the first token, and hands it over to the
// decode engine at decodeURL, whose answer it relays. The blocks stay held
// until the worker reports the keep's end (the decode worker read it, or
// ReleaseHandoff dropped it).
func (e *Engine) handOver(w *statusWriter, r *http.Request, ctx, reqCtx context.Context, rec *genRecord, g *api.Generation,
	req *scheduler.Request, body []byte, route, decodeURL string) {
	// The prompt's blocks stay held while the hand-over lasts: at most
	// MaxHandoffsPerPeer of them per decode engine.
	releasePeer, ok := e.acquirePeer(decodeURL)
	if !ok {
		e.sec.Refused(metrics.RefusedPeerBusy)
		apiErr := &api.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: CodeHandoffPeerBusy,
			Message: fmt.Sprintf("%d hand-overs to decode engine %s are in flight (the limit); retry, or use another decode engine.",
				e.cfg.MaxHandoffsPerPeer, decodeURL), ErrorType: api.ErrorTypeWorkerUnavailable}
		rec.fail(w, apiErr.WithRetryAfter(1), errors.New("hand-over slots of the decode engine taken"))
		return
	}
	defer releasePeer()
	secret := make([]byte, scheduler.SecretBytes)
	_, _ = rand.Read(secret)
	req.MaxTokens, req.HandoffSecret, req.OnToken = 1, secret, nil
	h, err := e.sched.Submit(req)
	if err != nil {
		rec.fail(w, e.submitError(err, operationOf(rec.op).promptParam), err)
		return
	}
	rec.h = h
	res := wait(reqCtx, h)
	if !res.Done || res.Err != nil {
		apiErr, cause := resultError(r, reqCtx, res)
		rec.fail(w, apiErr, cause)
		return
	}
	defer e.sched.ReleaseHandoff(rec.id) // a no-op once the decode worker read the KV
	ho := api.Handoff{ID: rec.id, Worker: e.cfg.WorkerAdvertise, Secret: secret, FirstToken: res.Tokens[0],
		N: len(req.Prompt), Digest: api.PromptDigest(req.Prompt), Expires: time.Now().Add(api.HandoffTTL).Unix()}
	if g.Temperature > 0 { // the worker drew once for the first token (model.Sample)
		ho.Draws = 1
	}
	ho = ho.Sign(e.cfg.StackKey, decodeURL)
	// The call's overall deadline is the request's (reqCtx, a child of ctx:
	// the span's parent is the same); a decode engine silent for
	// HandoffIdleTimeout is cut.
	tctx, span := e.spans.Start(reqCtx, spanname.KVTransfer, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("request_id", rec.id), attribute.String("decode_engine", decodeURL)))
	defer span.End()
	tctx, cut := context.WithCancelCause(tctx)
	defer cut(nil)
	var act idle.Activity
	stopIdle := idle.Watch(e.cfg.HandoffIdleTimeout, &act, func() { cut(errHandoffIdle) })
	defer stopIdle()
	out, err := http.NewRequestWithContext(tctx, http.MethodPost, decodeURL+route, bytes.NewReader(body))
	if err != nil {
		e.handOverFailed(w, span, rec, api.Internal(err.Error()), err)
		return
	}
	out.Header.Set("Content-Type", "application/json")
	// The caller's Authorization never leaves this engine: the decode
	// engine gets this engine's own API key (the stack's engines share it).
	if k := e.cfg.APIKey; k != "" {
		out.Header.Set("Authorization", "Bearer "+k)
	}
	out.Header.Set(api.HeaderHandoff, ho.String())
	telemetry.InjectHTTP(tctx, out.Header)
	// Given up while the decode engine may still work on it: its spans may
	// outlive this one (the contract's abandoned hand-over).
	defer func() {
		if tctx.Err() != nil {
			span.SetAttributes(attribute.Bool("abandoned", true))
		}
	}()
	resp, err := e.client.Do(out)
	if err != nil {
		err = handoffError(tctx, err)
		apiErr := decodeUnavailable(err)
		if reqCtx.Err() != nil {
			apiErr, _ = resultError(r, reqCtx, scheduler.Result{})
		}
		e.handOverFailed(w, span, rec, apiErr, err)
		return
	}
	act.Touch()
	resp.Body = idle.Body(resp.Body, &act)
	defer resp.Body.Close()
	kv, reported := api.ParseKVReport(resp.Header)
	span.SetAttributes(attribute.Int64("bytes", kv.Bytes), attribute.Int("blocks_sent", kv.BlocksSent),
		attribute.Int("blocks_deduped", kv.BlocksDeduped), attribute.Int("blocks", kv.BlocksSent+kv.BlocksDeduped),
		attribute.Int("http.response.status_code", resp.StatusCode))
	e.metrics.RecordKVHandoff(metrics.KVHandoff{Direction: metrics.HandoffSent, Bytes: kv.Bytes, BlocksSent: int64(kv.BlocksSent),
		BlocksDeduped: int64(kv.BlocksDeduped), OK: reported && resp.StatusCode == http.StatusOK})
	e.relay(tctx, w, resp, rec, g.Stream, usage(len(req.Prompt), res))
	if rec.apiErr != nil && rec.status >= 500 {
		span.SetError(rec.apiErr.ErrorType, rec.cause)
	}
}

// handOverFailed answers a hand-over that reached no decode engine.
func (e *Engine) handOverFailed(w *statusWriter, span *telemetry.Span, rec *genRecord, apiErr *api.Error, err error) {
	span.SetAttributes(attribute.Int64("bytes", 0), attribute.Int("blocks_sent", 0), attribute.Int("blocks_deduped", 0))
	span.SetError(apiErr.Code, err)
	e.metrics.RecordKVHandoff(metrics.KVHandoff{Direction: metrics.HandoffSent})
	rec.fail(w, apiErr, err)
}

// relayedError is the API error recorded for a decode engine's error
// answer of status (its body is relayed as it is): its code is the one
// the body's OpenAI error object carries (the decode engine's, e.g.
// context_length_exceeded), else api.DefaultCode(status).
func relayedError(status int, body []byte) *api.Error {
	et := api.ErrorTypeInternal
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed:
		et = api.ErrorTypeInvalidRequest
	case http.StatusUnauthorized:
		et = api.ErrorTypeUnauthorized
	case http.StatusNotFound:
		et = api.ErrorTypeNotFound
	case http.StatusRequestEntityTooLarge:
		et = api.ErrorTypePayloadTooLarge
	case http.StatusTooManyRequests:
		et = api.ErrorTypeQueueFull
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		et = api.ErrorTypeWorkerUnavailable
	case http.StatusGatewayTimeout, http.StatusRequestTimeout:
		et = api.ErrorTypeTimeout
	}
	e := &api.Error{Status: status, Type: "server_error", Code: api.DefaultCode(status),
		Message: fmt.Sprintf("The decode engine answered %d.", status), ErrorType: et}
	var eb api.ErrorBody
	if json.Unmarshal(body, &eb) == nil {
		if c := eb.Error.Code; c != nil && *c != "" && len(*c) <= maxRelayedCode {
			e.Code = *c
		}
		if eb.Error.Type != "" && len(eb.Error.Type) <= maxRelayedCode {
			e.Type = eb.Error.Type
		}
	}
	return e
}

// maxRelayedCode bounds the code and type taken from a decode engine's
// error body (longer ones keep the defaults).
const maxRelayedCode = 64

// relay copies the decode engine's answer to the caller: status, content
// headers and body; an event stream event by event, each flushed. A stream
// the decode engine breaks off (or that falls silent past the hand-over's
// idle timeout, which cuts ctx) ends with an OpenAI error event and
// [DONE]; a caller that goes away stops the relay (and so the decode
// engine's request). The usage of the answer (its cached-token counts) is
// replaced by pu, the prefill side's: the reuse happened here, the decode
// engine only deduplicated the blocks it received.
func (e *Engine) relay(ctx context.Context, w *statusWriter, resp *http.Response, rec *genRecord, stream bool, pu api.Usage) {
	for _, k := range []string{"Content-Type", "Cache-Control", "X-Accel-Buffering", api.HeaderKVBytes, api.HeaderKVBlocksSent, api.HeaderKVBlocksDeduped} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.Header().Del("Content-Length")
	rec.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		rec.apiErr = relayedError(resp.StatusCode, nil)
	}
	events := resp.StatusCode == http.StatusOK && stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if !events {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxRelayBytes))
		if err != nil {
			err = handoffError(ctx, err)
			if resp.StatusCode == http.StatusOK && len(b) == 0 {
				// Nothing came: the caller may still go elsewhere.
				apiErr := decodeUnavailable(err)
				rec.apiErr, rec.status, rec.cause = apiErr, apiErr.Status, err
				apiErr.Write(w)
				return
			}
			rec.apiErr, rec.cause = decodeUnavailable(err), err
		}
		if resp.StatusCode == http.StatusOK {
			b = withUsage(b, pu)
		} else if err == nil {
			rec.apiErr = relayedError(resp.StatusCode, b) // the decode engine's code
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(b)
		return
	}
	w.WriteHeader(resp.StatusCode)
	out := &sseWriter{w: w, rc: http.NewResponseController(w)}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxRelayLine {
			err = fmt.Errorf("a stream line beyond %d bytes", maxRelayLine)
		} else if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == nil {
			if data, ok := bytes.CutPrefix(line, []byte("data: {")); ok && bytes.Contains(data, []byte(`"usage"`)) {
				line = append(append([]byte("data: "), withUsage(bytes.TrimSpace(line[len("data: "):]), pu)...), '\n')
			}
			out.raw(string(line))
			line = line[:0]
			if out.err != nil {
				rec.apiErr, rec.status, rec.cause = api.Canceled(), api.StatusClientClosedRequest, out.err
				return
			}
			continue
		}
		if errors.Is(err, io.EOF) && len(line) == 0 {
			return // the stream ended after its last event
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		err = handoffError(ctx, err)
		// Broken off: a partial line is dropped, the caller gets an error.
		apiErr := decodeUnavailable(fmt.Errorf("its stream broke off: %w", err))
		rec.apiErr, rec.cause = apiErr, err
		out.send(apiErr.Body())
		out.raw("data: [DONE]\n\n")
		return
	}
}

// withUsage returns the JSON object b with the cached-token counts of its
// "usage" (prompt_tokens_details, cacheblend) replaced by pu's; b as it is
// when it has no usage or does not decode.
func withUsage(b []byte, pu api.Usage) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil || len(m["usage"]) == 0 || string(m["usage"]) == "null" {
		return b
	}
	var u api.Usage
	if json.Unmarshal(m["usage"], &u) != nil {
		return b
	}
	u.PromptTokensDetails, u.CacheBlend = pu.PromptTokensDetails, pu.CacheBlend
	ub, err := json.Marshal(u)
	if err != nil {
		return b
	}
	m["usage"] = ub
	out, err := json.Marshal(m)
	if err != nil {
		return b
	}
	return out
}

// errHandoffIdle cuts a hand-over whose decode engine sent nothing for
// Config.HandoffIdleTimeout.
var errHandoffIdle = errors.New("no byte from the decode engine within the hand-over idle timeout")

// handoffError names the idle timeout when it is what cut the call (ctx)
// behind err.
func handoffError(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, errHandoffIdle) {
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return err
}
