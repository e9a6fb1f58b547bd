package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// StorageHealth is the state of a blend server's L2 (its chunk files on disk) that
// StorageMetrics exposes.
type StorageHealth struct {
	// DiskFull: the last L2 write failed with a full disk (ENOSPC or EDQUOT).
	DiskFull bool
	// PendingChunks are held in memory only because their L2 write failed (not durable).
	PendingChunks int64
	// Budget is the L2 byte budget (0: unbounded).
	Budget int64
}

// StorageMetrics exposes a blend server's L2 health: lmcache_blend_l2_disk_full,
// lmcache_blend_l2_pending_chunks and lmcache_blend_l2_budget_bytes. Safe for concurrent use.
type StorageMetrics struct {
	facade
	diskFull, pending, budget *series
}

// NewStorageMetrics registers the L2 health gauges on reg. Options as for NewEngineMetrics.
func NewStorageMetrics(reg prometheus.Registerer, opts ...Option) (*StorageMetrics, error) {
	return newFacade("storage", reg, opts, func(b *builder) *StorageMetrics {
		return &StorageMetrics{facade: facade{b.r},
			diskFull: b.gaugeSeries("lmcache_blend_l2_disk_full"),
			pending:  b.gaugeSeries("lmcache_blend_l2_pending_chunks"),
			budget:   b.gaugeSeries("lmcache_blend_l2_budget_bytes"),
		}
	})
}

// Set records h. A nil receiver records nothing.
func (m *StorageMetrics) Set(h StorageHealth) {
	if m == nil {
		return
	}
	full := 0.0
	if h.DiskFull {
		full = 1
	}
	if h.PendingChunks < 0 || h.Budget < 0 {
		m.reg.sink.refuse(fmt.Errorf("metrics: storage health %+v: %w", h, ErrNegative))
		return
	}
	m.diskFull.gauge.Set(full)
	m.pending.gauge.Set(float64(h.PendingChunks))
	m.budget.gauge.Set(float64(h.Budget))
}
