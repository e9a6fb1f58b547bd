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
	// Failed writes put on the retry queue, retries by result, failed writes dropped
	// (retry queue full, or left at shutdown), and the retry queue's length now.
	RetriesQueued, RetriesOK, RetriesFailed, RetriesDropped uint64
	RetryQueued                                             int64
}

// remoteSeries are the lmcache_blend_remote_* and coordinator series.
type remoteSeries struct {
	hits, misses, corrupt, readErrs, writes, dropped, writeErrs *series
	bytesRead, bytesWritten                                     *series
	matches, matchTimeouts, matchErrs                           *series
	loadDur                                                     *HistogramSeries
	retryQueued, retryOK, retryFailed, retryDropped             *series
	retryLen                                                    *series
	docShared, docPending, docNotShared                         *series
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
		retryQueued:   b.counterSeries("lmcache_blend_remote_write_retries_total", "queued"),
		retryOK:       b.counterSeries("lmcache_blend_remote_write_retries_total", "ok"),
		retryFailed:   b.counterSeries("lmcache_blend_remote_write_retries_total", "failed"),
		retryDropped:  b.counterSeries("lmcache_blend_remote_write_retries_total", "dropped"),
		retryLen:      b.gaugeSeries("lmcache_blend_remote_retry_queue"),
		docShared:     b.counterSeries("lmcache_blend_remote_documents_total", "shared"),
		docPending:    b.counterSeries("lmcache_blend_remote_documents_total", "pending"),
		docNotShared:  b.counterSeries("lmcache_blend_remote_documents_total", "not_shared"),
	}
}

// SetRemoteTotals advances the fleet-tier counters to the tier's running totals (call
// before each scrape). A total lower than the previous one is refused for that counter
// (ErrCounterDecrease; see Registry); the others still move.
func (m *BlendMetrics) SetRemoteTotals(s RemoteStats) {
	r := &m.remote
	var errs []error
	for _, t := range []runningTotal{
		{r.hits, s.Hits}, {r.misses, s.Misses}, {r.corrupt, s.Corrupt},
		{r.readErrs, s.ReadErrors}, {r.writeErrs, s.WriteErrors},
		{r.writes, s.Writes}, {r.dropped, s.WritesDropped},
		{r.bytesRead, s.BytesRead}, {r.bytesWritten, s.BytesWritten},
		{r.matches, s.Matches}, {r.matchTimeouts, s.MatchTimeouts}, {r.matchErrs, s.MatchErrors},
		{r.retryQueued, s.RetriesQueued}, {r.retryOK, s.RetriesOK}, {r.retryFailed, s.RetriesFailed},
		{r.retryDropped, s.RetriesDropped},
	} {
		errs = append(errs, t.s.setTotal(float64(t.total)))
	}
	r.retryLen.gauge.Set(float64(max(0, s.RetryQueued)))
	m.reg.sink.refuseErr(errors.Join(errs...))
}

// RecordFleetDocument counts a document ingest by its fleet state when the engine asked
// for it (lmcache_blend_remote_documents_total): "shared", "pending" or "not_shared"; any
// other state is refused (see Registry).
func (m *BlendMetrics) RecordFleetDocument(state string) {
	r := &m.remote
	switch state {
	case "shared":
		r.docShared.counter.Inc()
	case "pending":
		r.docPending.counter.Inc()
	case "not_shared":
		r.docNotShared.counter.Inc()
	default:
		m.reg.sink.refuseErr(&LabelError{Metric: "lmcache_blend_remote_documents_total", Label: "state", Value: state,
			Reason: ReasonNotAllowed, Want: []string{"shared", "pending", "not_shared"}})
	}
}

// ObserveRemoteLoad records the duration of one pipelined chunk read from the fleet tier; a
// negative duration is refused (see Registry).
func (m *BlendMetrics) ObserveRemoteLoad(ctx context.Context, d time.Duration) {
	m.remote.loadDur.ObserveContext(ctx, d.Seconds())
}
