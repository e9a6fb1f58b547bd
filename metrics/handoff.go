package metrics

import (
	"fmt"

	"github.com/cacheblend/cacheblend/contract"
)

// Outcome label values of cb_kv_handoff_blocks_total and result values of
// cb_kv_handoffs_total, in contract order.
var (
	handoffOutcomes = [...]string{"transferred", "deduped"}
	handoffResults  = [...]string{"ok", "error"}
)

// KVHandoff is one prefill/decode hand-over, as recorded by EngineMetrics.RecordKVHandoff:
// the seed's record_kv_transfer(sent, bytes, blocks_sent, blocks_deduped) plus the result.
type KVHandoff struct {
	// Direction is HandoffSent on the prefill engine, HandoffReceived on the decode engine.
	Direction HandoffDirection
	// Bytes is the KV moved from the prefill worker to the decode worker.
	Bytes int64
	// BlocksSent counts the blocks moved; BlocksDeduped those the decode engine already held
	// by prefix hash, which were not moved.
	BlocksSent, BlocksDeduped int64
	// OK is false when the hand-over failed (what moved before the failure is still counted).
	OK bool
}

// kvHandoff holds the resolved series of the hand-over instruments, one per label value
// combination.
type kvHandoff struct {
	bytes  enumSeries // one series per HandoffDirection
	blocks [len(handoffDirectionNames)][len(handoffOutcomes)]*series
	count  [len(handoffDirectionNames)][len(handoffResults)]*series
}

func newKVHandoff(b *builder) kvHandoff {
	k := kvHandoff{bytes: b.enum(contract.Counter, "cb_kv_handoff_bytes_total", handoffDirectionNames[:])}
	for d, dn := range handoffDirectionNames {
		for o, on := range handoffOutcomes {
			_, k.blocks[d][o] = b.fixed(contract.Counter, "cb_kv_handoff_blocks_total", []string{dn, on})
		}
		for r, rn := range handoffResults {
			_, k.count[d][r] = b.fixed(contract.Counter, "cb_kv_handoffs_total", []string{dn, rn})
		}
	}
	return k
}

// record validates the whole record before recording any of it.
func (k *kvHandoff) record(h KVHandoff) {
	if h.Bytes < 0 || h.BlocksSent < 0 || h.BlocksDeduped < 0 {
		k.bytes.in.sink.refuse(fmt.Errorf("metrics: kv hand-over: bytes %d blocks sent %d deduped %d: %w",
			h.Bytes, h.BlocksSent, h.BlocksDeduped, ErrNegative))
		return
	}
	sb := pick(k.bytes, h.Direction)
	if sb == nil {
		return
	}
	d := h.Direction
	sb.counter.Add(float64(h.Bytes))
	k.blocks[d][0].counter.Add(float64(h.BlocksSent))
	k.blocks[d][1].counter.Add(float64(h.BlocksDeduped))
	r := 0
	if !h.OK {
		r = 1
	}
	k.count[d][r].counter.Inc()
}

// RecordKVHandoff records one prefill/decode hand-over: bytes, blocks sent and blocks
// deduplicated by direction, and the hand-over by result (the seed's record_kv_transfer). A
// negative count, or a direction that is not a HandoffDirection constant, refuses the whole
// record (see Registry).
func (m *EngineMetrics) RecordKVHandoff(h KVHandoff) { m.handoff.record(h) }

// SetKVHandoffs sets the hand-overs the worker holds in state s (cb_worker_kv_handoffs). A
// negative n, or an s that is not a HandoffState constant, refuses the record (see Registry).
func (m *WorkerMetrics) SetKVHandoffs(s HandoffState, n int) {
	if n < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: worker hand-overs %s: %d: %w", s, n, ErrNegative))
		return
	}
	if sr := pick(m.handoffs, s); sr != nil {
		sr.gauge.Set(float64(n))
	}
}
