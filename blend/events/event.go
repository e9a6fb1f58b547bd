package events

import (
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// EventType names a blend-server event. START and END types come in pairs;
// [Tick] is the bus's periodic housekeeping event.
type EventType uint8

// The event types. Their String forms ("CB_LOOKUP_START", …) are the names
// of the design.
const (
	// Invalid is the zero EventType; the bus refuses it.
	Invalid EventType = iota
	LookupStart
	LookupEnd
	PrefixLookupStart
	PrefixLookupEnd
	FingerprintMatchStart
	FingerprintMatchEnd
	CoordinatorMatchStart
	CoordinatorMatchEnd
	SparsePrefetchStart
	SparsePrefetchEnd
	L2LoadTaskStart
	L2LoadTaskEnd
	ClassifyStart
	ClassifyEnd
	RetrieveStart
	RetrieveEnd
	ScatterStart
	ScatterEnd
	StoreStart
	StoreEnd
	// Tick is delivered by the bus's drain goroutine every
	// Config.TickInterval, with Time set to the wall clock; subscribers use it
	// to sweep state whose END never came. It may also be published (tests
	// use this to drive a sweep at a chosen time).
	Tick

	numEventTypes
)

var eventTypeNames = [numEventTypes]string{
	Invalid:               "INVALID",
	LookupStart:           "CB_LOOKUP_START",
	LookupEnd:             "CB_LOOKUP_END",
	PrefixLookupStart:     "CB_PREFIX_LOOKUP_START",
	PrefixLookupEnd:       "CB_PREFIX_LOOKUP_END",
	FingerprintMatchStart: "CB_FINGERPRINT_MATCH_START",
	FingerprintMatchEnd:   "CB_FINGERPRINT_MATCH_END",
	CoordinatorMatchStart: "CB_COORDINATOR_MATCH_START",
	CoordinatorMatchEnd:   "CB_COORDINATOR_MATCH_END",
	SparsePrefetchStart:   "CB_SPARSE_PREFETCH_START",
	SparsePrefetchEnd:     "CB_SPARSE_PREFETCH_END",
	L2LoadTaskStart:       "L2_LOAD_TASK_START",
	L2LoadTaskEnd:         "L2_LOAD_TASK_END",
	ClassifyStart:         "CB_CLASSIFY_START",
	ClassifyEnd:           "CB_CLASSIFY_END",
	RetrieveStart:         "CB_RETRIEVE_START",
	RetrieveEnd:           "CB_RETRIEVE_END",
	ScatterStart:          "CB_SCATTER_START",
	ScatterEnd:            "CB_SCATTER_END",
	StoreStart:            "CB_STORE_START",
	StoreEnd:              "CB_STORE_END",
	Tick:                  "TICK",
}

// String returns the design's name of t, such as "CB_LOOKUP_START", or
// "EventType(n)" for an unknown value.
func (t EventType) String() string {
	if t < numEventTypes {
		return eventTypeNames[t]
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// Valid reports whether t is one of the defined types other than [Invalid].
func (t EventType) Valid() bool { return t > Invalid && t < numEventTypes }

// IsStart reports whether t opens a pair (a *_START type).
func (t EventType) IsStart() bool { return t.Valid() && t != Tick && t%2 == 1 }

// IsEnd reports whether t closes a pair (an *_END type).
func (t EventType) IsEnd() bool { return t.Valid() && t != Tick && t%2 == 0 }

// Pair returns the other half of a START/END pair (LookupStart ↔ LookupEnd),
// or Invalid when t is not part of a pair.
func (t EventType) Pair() EventType {
	switch {
	case t.IsStart():
		return t + 1
	case t.IsEnd():
		return t - 1
	}
	return Invalid
}

// ErrUnknownEventType is wrapped by the errors of [ParseEventType] and
// [Bus.Subscribe] for a type name or value that is not defined.
var ErrUnknownEventType = errors.New("unknown event type")

// ParseEventType returns the EventType whose String form is s
// ("CB_LOOKUP_START", "TICK", …). An unknown name is an error wrapping
// [ErrUnknownEventType].
func ParseEventType(s string) (EventType, error) {
	for t := Invalid + 1; t < numEventTypes; t++ {
		if eventTypeNames[t] == s {
			return t, nil
		}
	}
	return Invalid, fmt.Errorf("parse event type %q: %w", s, ErrUnknownEventType)
}

// Event is one blend-server event. It is a plain value: publishing copies it
// into the bus queue, and the bus never modifies it (except to stamp a zero
// Time). Attrs is shared with the subscribers, so a publisher must not modify
// the slice after Publish.
type Event struct {
	// Type says which stage the event opens or closes.
	Type EventType
	// RequestID is the request the event belongs to (the engine's request
	// id). Subscribers pair START and END by it.
	RequestID string
	// Time is when the event happened: for a START the stage's start, for an
	// END its end (for an asynchronous copy, the time the copy finished).
	// A zero Time is replaced by the time of Publish.
	Time time.Time
	// CopyID tells apart concurrent instances of one stage within a request,
	// such as the several copies of a retrieve's scatter: the START and END
	// of one instance carry the same CopyID. Zero for stages that run once
	// at a time.
	CopyID uint64
	// ParentCopyID, on the START of a stage with a parent stage, is the
	// CopyID of the parent instance it belongs to (the retrieve of one
	// worker rank when the ranks of a tensor-parallel worker retrieve the
	// same request concurrently). Zero: the latest open parent instance.
	ParentCopyID uint64
	// TraceContext is the W3C traceparent the peer sent with the RPC, on
	// CB_LOOKUP_START, CB_RETRIEVE_START and CB_STORE_START; empty when the
	// peer sent none.
	TraceContext string
	// TraceState is the W3C tracestate the peer sent with TraceContext (its
	// vendor entries), empty when none; the spans of the request carry it.
	TraceState string
	// Attrs are the stage's attributes (see the Attr* keys). START and END
	// attributes are both copied onto the span.
	Attrs []attribute.KeyValue
	// Err, on an END, marks the stage as failed: its span gets status Error
	// with Err's text, and a failed retrieve is counted.
	Err error
}

// Attr returns the value of the attribute key in ev.Attrs (the last one when
// repeated) and whether it was present.
func (ev *Event) Attr(key attribute.Key) (attribute.Value, bool) {
	for i := len(ev.Attrs) - 1; i >= 0; i-- {
		if ev.Attrs[i].Key == key {
			return ev.Attrs[i].Value, true
		}
	}
	return attribute.Value{}, false
}

// Attribute keys of the blend spans and events (docs/design.md §6). Publishers build
// attributes with them, for example AttrNProbes.Int(n).
const (
	AttrRequestID = attribute.Key("request_id")

	// CB_LOOKUP_END (stamped on cb.lookup, and on the option-B cb.request root); the
	// names and definitions of cb.request in contract/spans.yaml.
	AttrRequestedTokens      = attribute.Key("requested_tokens")
	AttrPrefixHitTokens      = attribute.Key("prefix_hit_tokens")
	AttrNonPrefixHitTokens   = attribute.Key("non_prefix_hit_tokens")
	AttrHitTokens            = attribute.Key("hit_tokens")
	AttrHitRate              = attribute.Key("hit_rate")
	AttrPrefixCoverageTokens = attribute.Key("prefix_coverage_tokens")
	AttrNNonPrefixTokens     = attribute.Key("n_non_prefix_tokens")
	AttrFingerprintHits      = attribute.Key("fingerprint_hits")
	AttrStorageHits          = attribute.Key("storage_hits")
	AttrStaleChunks          = attribute.Key("stale_chunks")
	// AttrLookup is how the lookup ended, on the option-B cb.request root ("done").
	AttrLookup = attribute.Key("lookup")

	// CB_PREFIX_LOOKUP_END (mp.lookup_prefetch, also stamped on cb.lookup).
	AttrPrefixChunks = attribute.Key("prefix_chunks")

	// CB_FINGERPRINT_MATCH_END / CB_COORDINATOR_MATCH_END.
	AttrNProbes   = attribute.Key("n_probes")
	AttrTableHits = attribute.Key("table_hits")
	AttrMatches   = attribute.Key("matches")
	AttrTimedOut  = attribute.Key("timed_out")

	// CB_SPARSE_PREFETCH_END.
	AttrNKeys    = attribute.Key("n_keys")
	AttrL1Hits   = attribute.Key("l1_hits")
	AttrL2Misses = attribute.Key("l2_misses")

	// L2_LOAD_TASK_END (cb.l2_load). AttrMs is filled in from the event
	// times when the END does not carry it.
	AttrChunks = attribute.Key("chunks")
	AttrBytes  = attribute.Key("bytes")
	AttrMs     = attribute.Key("ms")

	// CB_CLASSIFY_END.
	AttrFound     = attribute.Key("found")
	AttrStale     = attribute.Key("stale")
	AttrPerRankOK = attribute.Key("per_rank_ok")

	// CB_SCATTER_END (cb.scatter).
	AttrScatteredTokens = attribute.Key("scattered_tokens")
	AttrSlotWrites      = attribute.Key("slot_writes")
	AttrPartialBlocks   = attribute.Key("partial_blocks")
	AttrNPrefixTokens   = attribute.Key("n_prefix_tokens")  // tokens written as stored
	AttrNShiftedTokens  = attribute.Key("n_shifted_tokens") // tokens written re-RoPE'd
	AttrDropped         = attribute.Key("dropped")
	// AttrScatterMs is the copy's duration on cb.scatter (filled in from the event
	// times), and on cb.retrieve the wall time from its first copy's start to its last
	// copy's end.
	AttrScatterMs = attribute.Key("scatter_ms")

	// CB_STORE_END (cb.store).
	AttrStoredChunks = attribute.Key("stored_chunks")
	AttrTokens       = attribute.Key("tokens")
)
