package metrics

import "strconv"

// ForwardPhase is the phase label of cb_worker_forward_duration_seconds. The zero value is
// PhasePrefill. Other values are refused (see the package doc); a plain integer, safe to share.
type ForwardPhase uint8

// Forward phases, in contract order.
const (
	// PhasePrefill is "prefill": a prefill computing every token (no reuse, or after a failed
	// reuse).
	PhasePrefill ForwardPhase = iota
	// PhaseFullRecomp is "full_recomp": the layers before the check layer, recomputed fully.
	PhaseFullRecomp
	// PhaseCheck is "check": the check layer selecting the tokens to recompute.
	PhaseCheck
	// PhasePartial is "partial": the layers after the check layer, for the selected tokens.
	PhasePartial
	// PhaseDecode is "decode": one decode step.
	PhaseDecode
)

var forwardPhaseNames = [...]string{"prefill", "full_recomp", "check", "partial", "decode"}

// String returns the label value, e.g. "prefill", or "ForwardPhase(n)" for a value that is not
// one of the constants.
func (p ForwardPhase) String() string { return enumName(forwardPhaseNames[:], "ForwardPhase", p) }

// KVDirection is the direction label of cb_kv_transfer_{bytes,tokens}_total. The zero value is
// KVLoad. Other values are refused (see the package doc); a plain integer, safe to share.
type KVDirection uint8

// KV transfer directions, in contract order.
const (
	// KVLoad is "load": KV moved from the blend server into the KV memory.
	KVLoad KVDirection = iota
	// KVStore is "store": KV moved from the KV memory to the blend server.
	KVStore
)

var kvDirectionNames = [...]string{"load", "store"}

// String returns the label value, "load" or "store", or "KVDirection(n)" for a value that is
// not one of the constants.
func (d KVDirection) String() string { return enumName(kvDirectionNames[:], "KVDirection", d) }

// BlendOp is the op label of cb_worker_blend_failures_total: the worker's call to the blend
// server that failed. The zero value is BlendOpRegister. Other values are refused (see the
// package doc); a plain integer, safe to share.
type BlendOp uint8

// Blend server operations, in contract order.
const (
	// BlendOpRegister is "register": registering the worker's KV memory.
	BlendOpRegister BlendOp = iota
	// BlendOpRetrieve is "retrieve": loading reused KV.
	BlendOpRetrieve
	// BlendOpStore is "store": storing a prompt's KV.
	BlendOpStore
)

var blendOpNames = [...]string{"register", "retrieve", "store"}

// String returns the label value, e.g. "register", or "BlendOp(n)" for a value that is not one
// of the constants.
func (o BlendOp) String() string { return enumName(blendOpNames[:], "BlendOp", o) }

// Tier is the tier label of lmcache_blend_chunks_evicted_total. The zero value is TierL1. Other
// values are refused (see the package doc); a plain integer, safe to share.
type Tier uint8

// Storage tiers, in contract order.
const (
	// TierL1 is "l1": memory.
	TierL1 Tier = iota
	// TierL2 is "l2": disk.
	TierL2
)

var tierNames = [...]string{"l1", "l2"}

// String returns the label value, "l1" or "l2", or "Tier(n)" for a value that is not one of the
// constants.
func (t Tier) String() string { return enumName(tierNames[:], "Tier", t) }

// enumName returns names[e], or typ(e) when e is not a declared constant.
func enumName[E ~uint8](names []string, typ string, e E) string {
	if int(e) < len(names) {
		return names[e]
	}
	return typ + "(" + strconv.Itoa(int(e)) + ")"
}

// labelEnum is a typed label value.
type labelEnum interface {
	~uint8
	String() string
}

// HandoffDirection is the direction label of the prefill/decode hand-over instruments
// (cb_kv_handoff_bytes_total, cb_kv_handoff_blocks_total, cb_kv_handoffs_total): the prefill
// engine records HandoffSent, the decode engine HandoffReceived. The zero value is HandoffSent.
// Other values are refused (see the package doc); a plain integer, safe to share.
type HandoffDirection uint8

// Hand-over directions, in contract order.
const (
	// HandoffSent is "sent": recorded by the prefill engine that handed a request over.
	HandoffSent HandoffDirection = iota
	// HandoffReceived is "received": recorded by the decode engine that took it over.
	HandoffReceived
)

var handoffDirectionNames = [...]string{"sent", "received"}

// String returns the label value, "sent" or "received", or "HandoffDirection(n)" for a value
// that is not one of the constants.
func (d HandoffDirection) String() string {
	return enumName(handoffDirectionNames[:], "HandoffDirection", d)
}

// HandoffState is the state label of cb_worker_kv_handoffs. The zero value is HandoffKept.
// Other values are refused (see the package doc); a plain integer, safe to share.
type HandoffState uint8

// Hand-over states of a worker, in contract order.
const (
	// HandoffKept is "kept": prompts whose KV a prefill worker keeps for a decode worker.
	HandoffKept HandoffState = iota
	// HandoffPulling is "pulling": reads a decode worker runs from a prefill worker.
	HandoffPulling
)

var handoffStateNames = [...]string{"kept", "pulling"}

// String returns the label value, "kept" or "pulling", or "HandoffState(n)" for a value that
// is not one of the constants.
func (s HandoffState) String() string { return enumName(handoffStateNames[:], "HandoffState", s) }

// QualityCheck is the result label of cb_worker_quality_checks_total. The zero value is
// QualityDone.
type QualityCheck uint8

var qualityCheckNames = [...]string{"done", "dropped", "failed"}

// String returns the label value.
func (q QualityCheck) String() string { return enumName(qualityCheckNames[:], "QualityCheck", q) }

// Online quality check results, in contract order.
const (
	// QualityDone is "done": a sampled request was compared with its full prefill.
	QualityDone QualityCheck = iota
	// QualityDropped is "dropped": the checker was busy or over its CPU budget.
	QualityDropped
	// QualityFailed is "failed": the check could not run (an error).
	QualityFailed
)
