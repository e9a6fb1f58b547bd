package metrics

import (
	"context"
	"errors"
	"time"
)

// RemoteStats are the fleet tier's running totals for BlendMetrics.SetRemoteTotals.
type RemoteStats struct {
	// Chunk reads by result, and failed read batches.
	Hits, Misses, Corrupt, ReadErrors uint64
	// Writes by result, and failed writes.
	Writes, WritesDropped, WriteErrors uint64
	// Bytes read and written.
	BytesRead, BytesWritten uint64
	// Coordinator matches by result.
	Matches, MatchTimeouts, MatchErrors uint64
}

// remoteSeries are the lmcache_blend_remote_* and coordinator series.
type remoteSeries struct {
	hits, misses, corrupt, readErrs, writes, dropped, writeErrs *series
	bytesRead, bytesWritten                                     *series
	matches, matchTimeouts, matchErrs                           *series
	loadDur                                                     *HistogramSeries
}

func newRemoteSeries(b *builder) remoteSeries {
	return remoteSeries{
		hits:          b.counterSeries("lmcache_blend_remote_reads_total", "hit"),
		misses:        b.counterSeries("lmcache_blend_remote_reads_total", "miss"),
		corrupt:       b.counterSeries("lmcache_blend_remote_reads_total", "corrupt"),
		readErrs:      b.counterSeries("lmcache_blend_remote_errors_total", "read"),
		writeErrs:     b.counterSeries("lmcache_blend_remote_errors_total", "write"),
		writes:        b.counterSeries("lmcache_blend_remote_writes_total", "ok"),
		dropped:       b.counterSeries("lmcache_blend_remote_writes_total", "dropped"),
		bytesRead:     b.counterSeries("lmcache_blend_remote_bytes_total", "read"),
		bytesWritten:  b.counterSeries("lmcache_blend_remote_bytes_total", "write"),
		matches:       b.counterSeries("lmcache_blend_coordinator_matches_total", "ok"),
		matchTimeouts: b.counterSeries("lmcache_blend_coordinator_matches_total", "timeout"),
		matchErrs:     b.counterSeries("lmcache_blend_coordinator_matches_total", "error"),
		loadDur:       b.histogramSeries("lmcache_blend_remote_load_duration_seconds"),
	}
}

// SetRemoteTotals advances the fleet-tier counters to the tier's running totals (call
// before each scrape). A total lower than the previous one is refused for that counter
// (ErrCounterDecrease; see Registry); the others still move.
func (m *BlendMetrics) SetRemoteTotals(s RemoteStats) {
	r := &m.remote
	var errs []error
	for _, c := range []struct {
		name  string
		s     *series
		total uint64
	}{
		{"lmcache_blend_remote_reads_total", r.hits, s.Hits},
		{"lmcache_blend_remote_reads_total", r.misses, s.Misses},
		{"lmcache_blend_remote_reads_total", r.corrupt, s.Corrupt},
		{"lmcache_blend_remote_errors_total", r.readErrs, s.ReadErrors},
		{"lmcache_blend_remote_errors_total", r.writeErrs, s.WriteErrors},
		{"lmcache_blend_remote_writes_total", r.writes, s.Writes},
		{"lmcache_blend_remote_writes_total", r.dropped, s.WritesDropped},
		{"lmcache_blend_remote_bytes_total", r.bytesRead, s.BytesRead},
		{"lmcache_blend_remote_bytes_total", r.bytesWritten, s.BytesWritten},
		{"lmcache_blend_coordinator_matches_total", r.matches, s.Matches},
		{"lmcache_blend_coordinator_matches_total", r.matchTimeouts, s.MatchTimeouts},
		{"lmcache_blend_coordinator_matches_total", r.matchErrs, s.MatchErrors},
	} {
		if err := c.s.setTotal(c.name, float64(c.total)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		m.reg.sink.refuse(err)
	}
}

// ObserveRemoteLoad records the duration of one pipelined chunk read from the fleet tier; a
// negative duration is refused (see Registry).
func (m *BlendMetrics) ObserveRemoteLoad(ctx context.Context, d time.Duration) {
	m.remote.loadDur.ObserveContext(ctx, d.Seconds())
}
