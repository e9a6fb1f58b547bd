package scheduler

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// Finish reasons of a successful [Result].
const (
	FinishStop   = "stop"   // EOS sampled or OnToken asked to stop
	FinishLength = "length" // MaxTokens or the model's positions reached
	FinishStored = "stored" // a document's prefill and store are done
	// FinishHandoff: a request with a HandoffSecret sampled its first token;
	// its worker keeps the prompt's KV for the decode engine.
	FinishHandoff = "handoff"
)

// SecretBytes is the length of Request.HandoffSecret.
const SecretBytes = 32

// Prefilled is the decode half of a prefill/decode hand-over
// (docs/design.md §9): the prompt was prefilled by another engine, whose
// worker keeps its KV, and its first token sampled there.
type Prefilled struct {
	// FirstToken is the token the prefill engine sampled; it is the
	// request's first output token here.
	FirstToken int32
	// RNGDraws is the number of samples drawn for the request on the
	// prefill worker (SeqStep.rng_draws): 1 for a sampled first token.
	RNGDraws uint32
	// Pull copies the prompt's KV into blockTable (ceil(prompt/block size)
	// blocks) from block fromBlock on; the blocks before it were found in
	// this engine's prefix cache (by chain hash) and are not sent. It is
	// called once, when the request is admitted and unless every block was
	// found, on a goroutine of its own and without the scheduler's lock,
	// with a context derived from Request.Ctx that ends when the request is
	// dropped; it returns the bytes moved. On error the request fails with
	// ErrHandoff.
	Pull func(ctx context.Context, blockTable []int32, fromBlock int) (bytes int64, err error)
}

// Transfer describes the KV hand-over of a request: on the decode side its
// pull, in Result.Transfer.
type Transfer struct {
	// Blocks is the prompt's blocks; Deduped those found in the prefix
	// cache (not sent); Sent those pulled.
	Blocks, Deduped, Sent int
	// Bytes is the KV pulled.
	Bytes int64
	// Start and End bound the pull (End zero until it ended).
	Start, End time.Time
	// Done is set once the pull succeeded (the request then runs) or
	// failed (the request then fails, in a later update: wait for the
	// Result's Done, not for this one, to see the failure).
	Done bool
	// OK is set with Done when the pull succeeded.
	OK bool
}

// Request is one generation (or document ingest) handed to [Scheduler.Submit].
// The scheduler never modifies it.
type Request struct {
	// ID is unique among the requests in flight; it is the request_id of
	// every RPC and span.
	ID string
	// Prompt is the prompt's token ids, special tokens included. Non-empty.
	Prompt []int32
	// MaxTokens bounds the generated tokens (>= 1). Ignored for documents.
	MaxTokens int
	// Sampling is passed to the worker as-is; nil means the worker's
	// defaults.
	Sampling *cbv1.SamplingParams
	// IgnoreEOS keeps generating after the end-of-sequence token.
	IgnoreEOS bool
	// NoReuse computes the prompt in full: no CacheBlend lookup, no hit in
	// the engine's prefix cache, and the prompt is not stored (the baseline
	// of a reuse measurement; the API's "cacheblend": {"reuse": false}).
	NoReuse bool
	// Blend holds the request's CacheBlend settings; the zero value takes
	// the engine's (Config.RecompRatio, the check-layer deviation rule, the
	// worker's quality sample rate).
	Blend BlendOptions
	// Document marks a document ingest: the prompt is prefilled on its own,
	// nothing is sampled, the worker stores its KV in the blend server, and
	// the request finishes (reason "stored") when the worker reports the
	// store done. No lookup is made for it.
	Document bool
	// HandoffSecret, when set (SecretBytes bytes), hands the request over
	// to a decode engine after its prefill (prefill role): it is prefilled
	// as usual (CacheBlend reuse included), its first token is sampled, and
	// it finishes with reason FinishHandoff while its worker keeps the
	// prompt's KV for a decode worker to read with this secret. The
	// scheduler holds the prompt's blocks until the worker reports the
	// keep ended (read, dropped through ReleaseHandoff, or expired), at
	// most HandoffTimeout. Set MaxTokens to 1.
	HandoffSecret []byte
	// Prefilled, when set, makes the request the decode half of a
	// hand-over (decode role): no lookup and no cb.request span; on
	// admission the scheduler takes the prompt's blocks (its prefix cache
	// first), pulls the rest, registers them in the prefix cache, and the
	// request continues with Prefilled.FirstToken as its first token.
	Prefilled *Prefilled
	// OnToken, when set, is called with every sampled token except an
	// end-of-sequence one, in order, on the step loop's goroutine but
	// without the scheduler's lock, before the next step is scheduled;
	// returning true finishes the request with reason "stop". The step loop
	// waits for it, so it should be quick; it may call the scheduler.
	OnToken func(tok int32) (stop bool)
	// Ctx carries the parent span of cb.request (for documents, the span
	// whose context the worker gets) and the request's cancellation: when it
	// ends the request is dropped and fails with ErrCanceled.
	Ctx context.Context
}

// Result is the state of a request, as seen through [Handle.Snapshot].
type Result struct {
	// Tokens are the generated tokens so far (EOS included when sampled).
	Tokens []int32
	// TokenTimes[i] is when Tokens[i] came back from the worker.
	TokenTimes []time.Time
	// Done is set once the request finished; then exactly one of
	// FinishReason and Err is set.
	Done         bool
	FinishReason string
	Err          error
	// Admitted is when the scheduler first took the request into a batch
	// (the end of engine.queue); zero if it never was.
	Admitted time.Time
	// Finished is when the request finished.
	Finished time.Time
	// PromptTokens is the prompt length.
	PromptTokens int
	// CachedTokens counts the prompt tokens of the first admission served
	// from the engine's prefix cache; ReusedTokens those loaded through the
	// CacheBlend plan (prefix and non-prefix legs).
	CachedTokens, ReusedTokens int
	// PrefixReusedTokens are the ReusedTokens of the plan's prefix leg:
	// loaded as an exact continuation of the cached prefix, not computed.
	PrefixReusedTokens int
	// QualitySampled reports that the worker snapshotted the request for
	// its online quality check (SeqOutput.quality_sampled).
	QualitySampled bool
	// Preemptions counts how often the request was preempted.
	Preemptions int
	// Lookup is the blend server's lookup result, when one came back.
	Lookup *cbv1.LookupResult
	// Fallback is the reason the request was scheduled without a lookup
	// result ("error", "timeout", "unavailable", "queue_full"), or "".
	Fallback string
	// Transfer is the KV pull of a Prefilled request, nil otherwise. It is
	// shared by snapshots: read it, never change it.
	Transfer *Transfer
}

// BlendOptions are a request's CacheBlend settings (Request.Blend).
type BlendOptions struct {
	// RecompRatio, when set, replaces Config.RecompRatio in the request's
	// plan: a share in [0, 1] of the reused tokens the check layer
	// recomputes (0 reuses without recompute).
	RecompRatio *float64
	// Selection is the rule that picks them (the plan's selection); its
	// random rule is seeded by the request's sampling seed.
	Selection cbv1.Selection
	// QualityCheck asks the worker to check the request's quality online
	// (SeqStep.quality_check).
	QualityCheck bool
}

// Handle follows one submitted request. Its methods are safe for
// concurrent use.
type Handle struct {
	mu     sync.Mutex
	res    Result
	notify chan struct{} // cap 1: "something changed"
	done   chan struct{} // closed when finished
}

// handleTokensCap bounds the output tokens a Handle has room for up front.
const handleTokensCap = 256

func newHandle(promptLen, maxTokens int) *Handle {
	n := min(max(maxTokens, 0), handleTokensCap)
	return &Handle{
		res:    Result{PromptTokens: promptLen, Tokens: make([]int32, 0, n), TokenTimes: make([]time.Time, 0, n)},
		notify: make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
}

// Changed returns a channel that receives a value after the result changed
// (new tokens, or the end). Several changes may be coalesced into one value.
func (h *Handle) Changed() <-chan struct{} { return h.notify }

// Done returns a channel closed when the request finished.
func (h *Handle) Done() <-chan struct{} { return h.done }

// Snapshot returns a copy of the current result. The slices are safe to
// read: the scheduler only appends.
func (h *Handle) Snapshot() Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.res
	r.Tokens = slices.Clip(r.Tokens)
	r.TokenTimes = slices.Clip(r.TokenTimes)
	return r
}

// Wait blocks until the request finished or ctx ended, and returns the
// snapshot.
func (h *Handle) Wait(ctx context.Context) (Result, error) {
	select {
	case <-h.done:
		return h.Snapshot(), nil
	case <-ctx.Done():
		return h.Snapshot(), ctx.Err()
	}
}

func (h *Handle) update(f func(r *Result)) {
	h.mu.Lock()
	f(&h.res)
	h.mu.Unlock()
	h.poke()
}

func (h *Handle) poke() { notify(h.notify) }

// notify sends on ch (capacity 1) unless a value is already waiting.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// finish ends the request once; later calls do nothing.
func (h *Handle) finish(reason string, err error, now time.Time) {
	h.mu.Lock()
	if h.res.Done {
		h.mu.Unlock()
		return
	}
	h.res.Done = true
	h.res.Finished = now
	if err != nil {
		h.res.Err = err
	} else {
		h.res.FinishReason = reason
	}
	h.mu.Unlock()
	close(h.done)
	h.poke()
}
