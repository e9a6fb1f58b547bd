package blend

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// The fleet state of ingested documents, asked for by the engine before it
// answers POST /v1/documents (BlendService.FleetStatus).
const (
	// MaxFleetStatusIDs bounds the documents of one FleetStatus call.
	MaxFleetStatusIDs = 256
	// MaxFleetDocuments bounds the documents whose fleet writes a server
	// follows; beyond it the oldest are forgotten (a query then answers
	// not_shared for them).
	MaxFleetDocuments = 4096
	// DefaultFleetStatusWait is the default of Config.FleetStatusWait.
	DefaultFleetStatusWait = time.Second
)

// fleetDocs follows the fleet writes of the documents stored recently, by
// request id (every rank of a tensor-parallel worker stores under one id).
// Safe for concurrent use.
type fleetDocs struct {
	mu    sync.Mutex
	byID  map[string]*fleet.Group
	order []string // ids, oldest first
}

// group returns the Group of document id, creating it (and forgetting the
// oldest beyond MaxFleetDocuments).
func (d *fleetDocs) group(id string) *fleet.Group {
	d.mu.Lock()
	defer d.mu.Unlock()
	if g := d.byID[id]; g != nil {
		return g
	}
	if d.byID == nil {
		d.byID = make(map[string]*fleet.Group)
	}
	for len(d.order) >= MaxFleetDocuments {
		delete(d.byID, d.order[0])
		d.order[0] = ""
		d.order = d.order[1:]
	}
	g := fleet.NewGroup()
	d.byID[id] = g
	d.order = append(d.order, id)
	return g
}

func (d *fleetDocs) lookup(id string) *fleet.Group {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.byID[id]
}

// FleetDocuments returns the fleet state of the documents stored under ids,
// after waiting until each one's writes were attempted once (or ctx ends);
// ok is false without a fleet tier. An id no store reached is NotShared.
func (s *Server) FleetDocuments(ctx context.Context, ids []string) (states []fleet.GroupState, ok bool) {
	if s.chunks.fleet == nil {
		return nil, false
	}
	states = make([]fleet.GroupState, len(ids))
	for i, id := range ids {
		g := s.fleetDocs.lookup(id)
		if g == nil {
			states[i] = fleet.NotShared
		} else {
			states[i] = g.Wait(ctx)
		}
		s.metrics.RecordFleetDocument(string(states[i]))
	}
	return states, true
}

// fleetStatus answers BlendService.FleetStatus.
func (s *Server) fleetStatus(ctx context.Context, r *cbv1.FleetStatusRequest) (*cbv1.FleetStatusResponse, error) {
	ids := r.GetRequestIds()
	if len(ids) == 0 || len(ids) > MaxFleetStatusIDs {
		return nil, status.Errorf(codes.InvalidArgument, "fleet status: %d document ids (want 1..%d)", len(ids), MaxFleetStatusIDs)
	}
	for _, id := range ids {
		if err := checkRequest("fleet status", id, -1); err != nil {
			return nil, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.FleetStatusWait)
	defer cancel()
	states, ok := s.FleetDocuments(wctx, ids)
	resp := &cbv1.FleetStatusResponse{Fleet: ok}
	for _, st := range states {
		resp.States = append(resp.States, string(st))
	}
	return resp, nil
}
