package metrics

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRecordKVHandoff: the seed's record_kv_transfer(sent, bytes, blocks_sent,
// blocks_deduped) by direction, the hand-over counted by result; bad records refused whole.
func TestRecordKVHandoff(t *testing.T) {
	var rf refusals
	reg := prometheus.NewRegistry()
	m, err := NewEngineMetrics(reg, rf.opt())
	if err != nil {
		t.Fatal(err)
	}
	m.RecordKVHandoff(KVHandoff{Direction: HandoffSent, Bytes: 6144, BlocksSent: 3, BlocksDeduped: 5, OK: true})
	m.RecordKVHandoff(KVHandoff{Direction: HandoffReceived, Bytes: 2048, BlocksSent: 1, OK: false})
	rf.none(t, "valid hand-overs")
	m.RecordKVHandoff(KVHandoff{Direction: HandoffSent, Bytes: -1})
	if err := rf.one(t, "negative bytes"); !errors.Is(err, ErrNegative) {
		t.Errorf("negative bytes: %v", err)
	}
	m.RecordKVHandoff(KVHandoff{Direction: HandoffDirection(7), Bytes: 1})
	var le *LabelError
	if err := rf.one(t, "bad direction"); !errors.As(err, &le) {
		t.Errorf("bad direction: %v", err)
	}
	fams := gather(t, reg)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"cb_kv_handoff_bytes_total", map[string]string{"direction": "sent"}, 6144},
		{"cb_kv_handoff_bytes_total", map[string]string{"direction": "received"}, 2048},
		{"cb_kv_handoff_blocks_total", map[string]string{"direction": "sent", "outcome": "transferred"}, 3},
		{"cb_kv_handoff_blocks_total", map[string]string{"direction": "sent", "outcome": "deduped"}, 5},
		{"cb_kv_handoff_blocks_total", map[string]string{"direction": "received", "outcome": "transferred"}, 1},
		{"cb_kv_handoffs_total", map[string]string{"direction": "sent", "result": "ok"}, 1},
		{"cb_kv_handoffs_total", map[string]string{"direction": "received", "result": "error"}, 1},
		{"cb_kv_handoffs_total", map[string]string{"direction": "received", "result": "ok"}, 0},
	} {
		if got := value(fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// TestSetKVHandoffs: the worker's gauge by state; a negative count is refused.
func TestSetKVHandoffs(t *testing.T) {
	var rf refusals
	reg := prometheus.NewRegistry()
	m, err := NewWorkerMetrics(reg, rf.opt())
	if err != nil {
		t.Fatal(err)
	}
	m.SetKVHandoffs(HandoffKept, 2)
	m.SetKVHandoffs(HandoffPulling, 1)
	m.SetKVHandoffs(HandoffKept, -1)
	if err := rf.one(t, "negative"); !errors.Is(err, ErrNegative) {
		t.Errorf("negative: %v", err)
	}
	fams := gather(t, reg)
	if v := value(fams, "cb_worker_kv_handoffs", map[string]string{"state": "kept"}); v != 2 {
		t.Errorf("kept %v", v)
	}
	if v := value(fams, "cb_worker_kv_handoffs", map[string]string{"state": "pulling"}); v != 1 {
		t.Errorf("pulling %v", v)
	}
}
