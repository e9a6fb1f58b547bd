package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheblend/cacheblend/contract"
)

// HandoffRefusal is why a prefill/decode hand-over, or a part of one, was refused
// (cb_handoff_refused_total{reason}).
type HandoffRefusal uint8

// HandoffRefusal values, in contract order.
const (
	// RefusedNoKey: the engine has no stack key, so it cannot authenticate a hand-over.
	RefusedNoKey HandoffRefusal = iota
	// RefusedBadSignature: a hand-over token or a gateway's decode-engine proof is missing or
	// does not verify with the stack key (forged, or made for another prompt or engine).
	RefusedBadSignature
	// RefusedExpired: a signature that verifies, past its expiry.
	RefusedExpired
	// RefusedNotAllowed: X-CB-Decode-Engine names an engine outside the allow-list.
	RefusedNotAllowed
	// RefusedPeerBusy: the KV held for hand-overs to that decode engine is at its bound.
	RefusedPeerBusy
	// RefusedBlockMismatch: a pulled block holds other tokens than the prompt's (the decode
	// worker compared the chain hashes); nothing of the pull enters the prefix cache.
	RefusedBlockMismatch
)

var handoffRefusalNames = [...]string{"no_key", "bad_signature", "expired", "not_allowed", "peer_busy", "block_mismatch"}

// String returns the label value.
func (r HandoffRefusal) String() string {
	return enumName(handoffRefusalNames[:], "HandoffRefusal", r)
}

// HandoffSecurityMetrics counts refused hand-overs (cb_handoff_refused_total), on engines and
// on workers (each process registers it on its own registry). Safe for concurrent use.
type HandoffSecurityMetrics struct {
	facade
	refused enumSeries
}

// NewHandoffSecurityMetrics registers cb_handoff_refused_total on reg, one series per
// HandoffRefusal. Options as for NewEngineMetrics.
func NewHandoffSecurityMetrics(reg prometheus.Registerer, opts ...Option) (*HandoffSecurityMetrics, error) {
	return newFacade("hand-over security", reg, opts, func(b *builder) *HandoffSecurityMetrics {
		return &HandoffSecurityMetrics{facade: facade{b.r},
			refused: b.enum(contract.Counter, "cb_handoff_refused_total", handoffRefusalNames[:])}
	})
}

// Refused counts one refusal for reason r. A nil receiver records nothing; an r that is not a
// HandoffRefusal constant refuses the record (see Registry).
func (m *HandoffSecurityMetrics) Refused(r HandoffRefusal) {
	if m == nil {
		return
	}
	if s := pick(m.refused, r); s != nil {
		s.counter.Inc()
	}
}
