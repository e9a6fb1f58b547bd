package scheduler

import (
	"context"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
)

type seqState int

const (
	stWaiting seqState = iota
	stRunning
	stStoring // a document whose prefill is done, waiting for its store report
	stPulling // a Prefilled request whose KV is being pulled
	stDone
)

// seq is the scheduler's state of one request. It is guarded by Scheduler.mu.
type seq struct {
	req   *Request
	id    string
	h     *Handle
	state seqState

	kv    seqKV    // its tokens and their KV blocks
	trace seqTrace // its spans and the trace context the worker gets
	lk    *lookup  // its CacheBlend lookup; nil when it makes none
	reuse seqReuse // the reuse plan of its first admission
	step  *cbv1.SeqStep

	pullCancel context.CancelFunc // of a Prefilled request's pull in flight
	stopWatch  func() bool        // stops the watch of Request.Ctx

	started   bool // the worker holds the request's state
	admitted  bool // taken into a batch at least once
	resumed   bool // re-admitted after a preemption
	storeSent bool
	cancelled bool
}

// seqKV is a request's tokens and the KV blocks that hold them, as the
// block manager sees them.
type seqKV struct {
	tokens     []int32 // prompt, then generated tokens
	nPrompt    int
	maxLen     int // the prompt and every token it may generate
	prefillEnd int // tokens to prefill in the current pass (grows after a preemption)
	computed   int // leading tokens whose KV is in blocks
	blocks     []int32
	hashes     []kvcache.BlockHash // chain hashes of the full blocks of tokens
	committed  int                 // leading blocks registered in the prefix cache
	noCache    bool                // Request.NoReuse: no hit in the prefix cache
}

// seqTrace is a request's spans: cb.request and cb.schedule (none for
// documents and Prefilled requests), and the trace context of its steps.
type seqTrace struct {
	reqCtx    context.Context // holds cb.request (the request's ctx for documents)
	reqSpan   *telemetry.Span
	schedCtx  context.Context
	schedSpan *telemetry.Span
	parent    string     // traceparent for SeqStep.trace_context
	state     string     // tracestate for SeqStep.trace_state
	meta      *buildMeta // cb.build_meta until the first step metadata is built
}

// buildMeta is cb.build_meta of a request admitted in this iteration: from
// the start of its plan to the end of its step metadata.
type buildMeta struct {
	start time.Time
	attrs []attribute.KeyValue
}

// seqReuse is the CacheBlend plan of a request's first admission: the plan
// the worker gets, the positions it loads from its Start on (sorted,
// disjoint), and the compute share of one of them in the forward (see
// blendTokenCost). Zero without a plan.
type seqReuse struct {
	plan   *cbv1.CBPlan
	ranges []reuseplan.Range
	cost   float64
}

func (r *seqReuse) reset() { r.plan, r.ranges, r.cost = nil, r.ranges[:0], 0 }

// without removes sq from list.
func without(list []*seq, sq *seq) []*seq {
	return slices.DeleteFunc(list, func(x *seq) bool { return x == sq })
}

// item is one sequence's share of a step.
type item struct {
	sq     *seq
	n      int
	sample bool
}
