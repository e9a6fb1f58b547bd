package blend

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// runLookups is lookup worker i: it runs the queued lookups until the queue
// is closed and drained, stamping the start of each for the watchdog.
func (s *Server) runLookups(i int) {
	for run := range s.lookups.queue {
		s.lookups.busy[i].Store(time.Now().UnixNano())
		run()
		s.lookups.busy[i].Store(0)
	}
}

// stuckLookups returns how many lookup workers have been running one lookup
// for longer than Config.LookupStuckAfter at now, and the longest run.
func (s *Server) stuckLookups(now time.Time) (n int, longest time.Duration) {
	for i := range s.lookups.busy {
		t0 := s.lookups.busy[i].Load()
		if t0 == 0 {
			continue
		}
		if d := now.Sub(time.Unix(0, t0)); d > s.cfg.LookupStuckAfter {
			n++
			longest = max(longest, d)
		}
	}
	return n, longest
}

// Health reports whether the server can answer lookups: nil when running
// with no stuck lookup worker, else an error naming the reason (not
// started, shut down, or a lookup running longer than
// Config.LookupStuckAfter: its worker recovers when it returns). The gRPC
// health service reports the same (NOT_SERVING while stuck), updated by a
// watchdog within a quarter of LookupStuckAfter (at most 1 s). Safe for
// concurrent use.
func (s *Server) Health() error {
	s.life.gateMu.RLock()
	err := stateErr(s.life.state)
	s.life.gateMu.RUnlock()
	if err != nil {
		return err
	}
	if n, longest := s.stuckLookups(time.Now()); n > 0 {
		return fmt.Errorf("%d of %d lookup workers stuck: a lookup running for %v (limit %v)",
			n, len(s.lookups.busy), longest.Round(time.Millisecond), s.cfg.LookupStuckAfter)
	}
	return nil
}

// watchInterval is the watchdog's period for a LookupStuckAfter of d.
func watchInterval(d time.Duration) time.Duration {
	return min(max(d/4, 10*time.Millisecond), time.Second)
}

// watchLookups mirrors the lookup workers' state into the gRPC health
// service until Shutdown: NOT_SERVING while a worker is stuck, SERVING again
// when it returns. Transitions are logged.
func (s *Server) watchLookups() {
	t := time.NewTicker(watchInterval(s.cfg.LookupStuckAfter))
	defer t.Stop()
	serving := true
	for {
		select {
		case <-s.life.stop:
			return
		case <-t.C:
		}
		n, longest := s.stuckLookups(time.Now())
		if (n == 0) == serving {
			continue
		}
		serving = n == 0
		st := healthpb.HealthCheckResponse_SERVING
		if serving {
			s.logger.Info("lookup workers recovered: serving")
		} else {
			st = healthpb.HealthCheckResponse_NOT_SERVING
			s.logger.Warn("lookup worker stuck: health NOT_SERVING", "stuck", n, "workers", len(s.lookups.busy),
				"running_for", longest.String(), "limit", s.cfg.LookupStuckAfter.String())
		}
		s.life.gateMu.RLock()
		hs := s.life.health
		s.life.gateMu.RUnlock()
		setServing(hs, st)
	}
}

// setServing sets the status of the server and of BlendService in hs (nil:
// not serving yet).
func setServing(hs *health.Server, st healthpb.HealthCheckResponse_ServingStatus) {
	if hs != nil {
		hs.SetServingStatus("", st)
		hs.SetServingStatus(cbv1.BlendService_ServiceDesc.ServiceName, st)
	}
}

// FleetHealth describes the fleet tier's state for /health (a detail line,
// not a check: with Redis unreachable the node still serves from its own
// tiers, so it is degraded, not down): "" without a fleet tier; else
// "reachable" or "degraded: Redis unreachable", with the retry queue's
// depth, the last Redis error and how long ago it was, and the values read
// from Redis that were refused. It may probe Redis (one PING, bounded by the
// fleet tier's OpTimeout) when its last outcome is older than
// fleet.Config.HealthMaxAge. Safe for concurrent use.
func (s *Server) FleetHealth() string {
	if s.chunks.fleet == nil {
		return ""
	}
	h := s.chunks.fleet.Health(context.Background())
	state := "reachable"
	if !h.Reachable {
		state = "degraded: Redis unreachable (serving from the local tiers)"
	}
	out := fmt.Sprintf("%s; retry queue %d; refused values %d", state, h.RetryQueued, h.Refused)
	if h.LastError != "" {
		out += fmt.Sprintf("; last error %s ago: %s", time.Since(h.LastErrorAt).Round(time.Millisecond), h.LastError)
	}
	return out
}

// FleetTrustTotals returns the fleet tier's refused values and
// reachability for metrics.FleetTrust (as FleetHealth: probing Redis when
// its last outcome is older than fleet.Config.HealthMaxAge); ok is false
// without a fleet tier. Safe for concurrent use.
func (s *Server) FleetTrustTotals() (st metrics.FleetTrustStats, ok bool) {
	if s.chunks.fleet == nil {
		return st, false
	}
	f := s.chunks.fleet.Stats()
	return metrics.FleetTrustStats{
		Unauthenticated: f.RefusedUnauthenticated, Oversize: f.RefusedOversize, Malformed: f.RefusedMalformed,
		NonFinite: f.RefusedNonFinite, WriteNonFinite: f.WritesRefused, Reachable: s.chunks.fleet.Health(context.Background()).Reachable,
	}, true
}
