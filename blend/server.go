package blend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/blend/scatter"
	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/kvsock"
	"github.com/cacheblend/cacheblend/telemetry"
)

// lifecycle states of a Server.
const (
	stateNew = iota
	stateRunning
	stateStopped
)

var _ component.Lifecycle = (*Server)(nil)

// Server is the blend server. Create it with New, Start it (it serves gRPC
// on Config.Addr; Service can also be mounted on another gRPC server), and
// Shutdown it: the lifecycle of component.Lifecycle. All methods are safe
// for concurrent use. Its state is in parts named after what they own.
type Server struct {
	cfg      Config
	logger   *slog.Logger
	epoch    string
	bus      *events.Bus
	metrics  *metrics.BlendMetrics
	grpcOpts []grpc.ServerOption // component.Deps.GRPCServerOptions (mutual TLS, callers' roles)

	life   lifecycle
	regs   registrations
	chunks chunks
	// fleetDocs follows the fleet writes of stored documents (fleetdocs.go).
	fleetDocs fleetDocs
	lookups   lookups
	copies    copies
	// storeDocs follows the storage of stored documents, seqPending the
	// sequence files waiting for room, storage the L2 health gauges
	// (persist.go).
	storeDocs  storeDocs
	seqPending seqQueue
	storage    *metrics.StorageMetrics
}

// lifecycle is the state of a Server's run and of the gRPC server Start
// serves.
type lifecycle struct {
	gateMu   sync.RWMutex // guards state and the gRPC server; RPCs hold it shared while they enqueue
	state    int
	inflight sync.WaitGroup // RPC handlers in progress
	stop     chan struct{}  // closed by Shutdown
	bg       sync.WaitGroup // the goroutines Start runs
	grpcSrv  *grpc.Server   // set by Start
	health   *health.Server
	ln       net.Listener
}

// Stats is a snapshot of a Server's state and counters.
type Stats struct {
	// Workers is the number of registered (worker, rank) KV memories.
	Workers int
	// LookupsDone counts lookups run, LookupsRejected those refused (queue
	// full), LookupsAbandoned those skipped (their caller was gone).
	LookupsDone, LookupsRejected, LookupsAbandoned uint64
	// Registrations counts sequences registered in a fingerprint table,
	// RegistrationsDropped those dropped (queue full).
	Registrations, RegistrationsDropped uint64
	// LookupsStuck is the number of lookup workers running one lookup for
	// longer than Config.LookupStuckAfter (see Server.Health).
	LookupsStuck int
	// KVConnections is the number of open KV socket connections
	// (registered or handshaking).
	KVConnections int
	// KVRegistrationsRefused counts KV socket connections refused,
	// KVRegistrationsReleased the registrations released.
	KVRegistrationsRefused, KVRegistrationsReleased uint64
	// Fingerprints is the number of live fingerprints over every model's
	// table; UnregisteredStale the chunks unregistered by stale strikes.
	Fingerprints      int
	UnregisteredStale int64
	// Store, Pool: the chunk store's and the copy pool's own counters.
	Store chunkstore.Stats
	Pool  scatter.PoolStats
	// Fleet is the fleet tier's totals (zero without one).
	Fleet fleet.Stats
	// EventsPublished and EventsDropped are the event bus's totals.
	EventsPublished, EventsDropped uint64
}

// New builds a Server for cfg and deps; nothing runs and nothing listens
// until Start. deps.TracerProvider receives the spans of the tracing
// subscriber and must honour telemetry.ContextWithTraceID for option-B
// cb.request roots (a telemetry/provider provider, or an SDK provider built
// with provider.NewIDGenerator(nil)); deps.Registerer receives the
// lmcache_blend_* instruments; deps.GRPCServerOptions are added to its gRPC
// server's (see rpc/mtls). Nil fields take component.Deps.WithDefaults.
func New(cfg Config, deps component.Deps) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	deps = deps.WithDefaults()
	tp, logger := deps.TracerProvider, deps.Logger
	bm, err := metrics.NewBlendMetrics(deps.Registerer, metrics.WithOnRefused(func(err error) {
		logger.Warn("metrics record refused", "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("blend: %w", err)
	}
	sm, err := metrics.NewStorageMetrics(deps.Registerer, metrics.WithOnRefused(func(err error) {
		logger.Warn("metrics record refused", "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("blend: %w", err)
	}
	var eb [8]byte
	if _, err := rand.Read(eb[:]); err != nil {
		return nil, fmt.Errorf("blend: server epoch: %w", err)
	}
	s := &Server{
		cfg:      cfg,
		logger:   logger,
		epoch:    hex.EncodeToString(eb[:]),
		bus:      events.NewBus(events.Config{QueueSize: cfg.EventQueue}),
		metrics:  bm,
		grpcOpts: deps.GRPCServerOptions,
		life:     lifecycle{stop: make(chan struct{})},
		regs:     newRegistrations(),
		lookups:  newLookups(cfg),
		copies:   copies{pool: scatter.NewPool(scatter.PoolConfig{Workers: cfg.CopyWorkers})},
		storage:  sm,
	}
	s.storeDocs.logger = logger
	if err := s.chunks.init(cfg, logger, bm); err != nil {
		return nil, err
	}
	if n, err := s.restoreSequences(); err != nil {
		return nil, err
	} else if n > 0 {
		logger.Info("sequences restored from L2", "sequences", n)
	}
	ts, terr := events.NewTracingSubscriber(tp)
	ms, merr := events.NewMetricsSubscriber(bm)
	ls, lerr := events.NewL2ThroughputSubscriber(bm)
	if err := errors.Join(terr, merr, lerr); err != nil {
		return nil, fmt.Errorf("blend: %w", err)
	}
	for _, sub := range []interface {
		events.Subscriber
		EventTypes() []events.EventType
	}{ts, ms, ls, &s.storeDocs} {
		if err := s.bus.Subscribe(sub, sub.EventTypes()...); err != nil {
			return nil, fmt.Errorf("blend: %w", err)
		}
	}
	return s, nil
}

// Start listens on Config.Addr and on the KV socket (Config.KVSocket),
// starts the event bus, the copy pool, the lookup workers, their watchdog
// and the fingerprint registrations, then serves gRPC (BlendService and the
// gRPC health service) and accepts KV registrations until Shutdown. RPCs are
// answered Unavailable before it. ctx bounds the start-up only. Starting
// twice or after Shutdown is an error; when Start fails nothing is left
// running.
func (s *Server) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.life.gateMu.Lock()
	defer s.life.gateMu.Unlock()
	if s.life.state != stateNew {
		return errors.New("blend: server already started or shut down")
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("blend: listen %s: %w", s.cfg.Addr, err)
	}
	kvln, err := kvsock.Listen(s.cfg.KVSocket)
	if err != nil {
		ln.Close()
		return fmt.Errorf("blend: KV socket: %w", err)
	}
	if err := s.copies.pool.Start(ctx); err != nil {
		ln.Close()
		kvln.Close()
		return fmt.Errorf("blend: copy pool: %w", err)
	}
	if s.chunks.fleet != nil {
		if err := s.chunks.fleet.Start(ctx); err != nil {
			ln.Close()
			kvln.Close()
			_ = s.copies.pool.Shutdown(ctx)
			return fmt.Errorf("blend: fleet tier: %w", err)
		}
	}
	s.bus.Start()
	for i := range s.cfg.LookupWorkers {
		s.life.bg.Go(func() { s.runLookups(i) })
	}
	s.life.bg.Go(s.watchLookups)
	s.life.bg.Go(func() { runQueue(s.chunks.regQ) })
	s.life.state = stateRunning
	s.regs.mu.Lock()
	s.regs.ln = kvln
	s.regs.mu.Unlock()
	s.life.bg.Go(func() { s.acceptKV(kvln) })
	s.serve(ln)
	return nil
}

// Shutdown stops accepting RPCs (answered Unavailable) and KV connections
// (ending every registration), stops the gRPC server (gracefully, forcibly
// when ctx ends), lets the queued lookups and registrations finish, waits
// for the RPCs and copies in progress, drains the event bus and unmaps the
// workers' KV memories. It returns ctx's error (wrapped) when ctx ends
// first; the goroutines still finish on their own. Later calls return nil.
func (s *Server) Shutdown(ctx context.Context) error {
	s.life.gateMu.Lock()
	if s.life.state == stateStopped {
		s.life.gateMu.Unlock()
		return nil
	}
	s.life.state = stateStopped
	// No RPC can enqueue after this (they check the state under the shared
	// lock while sending), so the queues can be closed.
	close(s.lookups.queue)
	close(s.chunks.regQ)
	close(s.life.stop)
	srv, hs := s.life.grpcSrv, s.life.health
	s.life.gateMu.Unlock()
	s.closeKV()

	var errs []error
	if hs != nil {
		hs.Shutdown()
	}
	if srv != nil && waitCtx(ctx, srv.GracefulStop) != nil {
		srv.Stop() // GracefulStop returns at once then
	}
	if err := waitCtx(ctx, s.life.inflight.Wait); err != nil {
		errs = append(errs, fmt.Errorf("blend: waiting for RPCs: %w", err))
	}
	if err := waitCtx(ctx, s.life.bg.Wait); err != nil {
		errs = append(errs, fmt.Errorf("blend: waiting for workers: %w", err))
	}
	if err := s.copies.pool.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("blend: copy pool: %w", err))
	}
	if s.chunks.fleet != nil {
		if err := s.chunks.fleet.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("blend: %w", err))
		}
	}
	if err := s.bus.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("blend: %w", err))
	}
	s.releaseAllWorkers()
	return errors.Join(errs...)
}

// waitCtx runs wait on a goroutine and returns when it returns or ctx ends.
func waitCtx(ctx context.Context, wait func()) error {
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stateErr is why the server does not answer in state, nil while running.
func stateErr(state int) error {
	switch state {
	case stateNew:
		return errors.New("blend server not started")
	case stateStopped:
		return errors.New("blend server shutting down")
	}
	return nil
}

// Epoch is the server epoch: random per process start, sent with every KV
// registration's answer (for the workers' logs).
func (s *Server) Epoch() string { return s.epoch }

// Metrics is the server's lmcache_blend_* instruments.
func (s *Server) Metrics() *metrics.BlendMetrics { return s.metrics }

// Service returns the gRPC service to mount on a grpc.Server
// (cbv1.RegisterBlendServiceServer). Mount it with
// telemetry.UnaryServerInterceptor so that a caller's gRPC trace metadata is
// honoured when a payload carries no trace_context.
func (s *Server) Service() cbv1.BlendServiceServer { return &service{s: s} }

// serve serves the BlendService and the gRPC health service on ln until
// Shutdown. Caller holds gateMu.
func (s *Server) serve(ln net.Listener) {
	srv := rpc.NewServer(s.grpcOpts...)
	cbv1.RegisterBlendServiceServer(srv, s.Service())
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	setServing(hs, healthpb.HealthCheckResponse_SERVING)
	s.life.grpcSrv, s.life.health, s.life.ln = srv, hs, ln
	s.life.bg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.logger.Error("blend gRPC server stopped", "err", err)
		}
	})
}

// KVSocket returns the path of the KV socket once started ("" before).
func (s *Server) KVSocket() string {
	s.regs.mu.Lock()
	defer s.regs.mu.Unlock()
	if s.regs.ln == nil {
		return ""
	}
	return s.regs.ln.Path()
}

// Addr returns the bound gRPC address once started ("" before), e.g. the
// port picked for "127.0.0.1:0".
func (s *Server) Addr() string {
	s.life.gateMu.RLock()
	defer s.life.gateMu.RUnlock()
	if s.life.ln == nil {
		return ""
	}
	return s.life.ln.Addr().String()
}

// MetricsBefore refreshes the instruments that mirror running totals and
// snapshots (event-bus totals, L1 bytes and chunks, fingerprints, evictions
// per tier, corrupt L2 files); pass it as the before-scrape hook of
// metrics.Handler. Safe for concurrent use.
func (s *Server) MetricsBefore() {
	s.metrics.SetEventBusTotals(s.bus.Published(), s.bus.Dropped())
	s.setStorageMetrics(s.storage)
	st := s.chunks.store.Stats()
	fps, _ := s.chunks.fingerprints()
	s.metrics.SetStorage(metrics.StorageStats{L1Bytes: st.L1Bytes, L1Chunks: int64(st.L1Chunks), Fingerprints: int64(fps)})
	s.chunks.syncCounters()
	if s.chunks.fleet != nil {
		f := s.chunks.fleet.Stats()
		s.metrics.SetRemoteTotals(metrics.RemoteStats{
			Hits: f.Hits, Misses: f.Misses, Corrupt: f.Corrupt, ReadErrors: f.ReadErrors,
			Writes: f.Writes, WritesDropped: f.WritesDropped, WriteErrors: f.WriteErrors,
			BytesRead: f.BytesRead, BytesWritten: f.BytesWritten,
			Matches: f.Matches, MatchTimeouts: f.MatchTimeouts, MatchErrors: f.MatchErrors,
			RetriesQueued: f.RetriesQueued, RetriesOK: f.RetriesOK, RetriesFailed: f.RetriesFailed,
			RetriesDropped: f.RetriesDropped, RetryQueued: int64(f.RetryQueued),
		})
	}
}

// Stats returns a snapshot of the server's state and counters.
func (s *Server) Stats() Stats {
	st := Stats{
		LookupsDone: s.lookups.done.Load(), LookupsRejected: s.lookups.rejected.Load(), LookupsAbandoned: s.lookups.abandoned.Load(),
		Registrations: s.chunks.regDone.Load(), RegistrationsDropped: s.chunks.regDropped.Load(),
		KVRegistrationsRefused: s.regs.refused.Load(), KVRegistrationsReleased: s.regs.released.Load(),
		Store: s.chunks.store.Stats(), Pool: s.copies.pool.Stats(),
		EventsPublished: s.bus.Published(), EventsDropped: s.bus.Dropped(),
	}
	st.LookupsStuck, _ = s.stuckLookups(time.Now())
	if s.chunks.fleet != nil {
		st.Fleet = s.chunks.fleet.Stats()
	}
	s.regs.mu.Lock()
	st.Workers = len(s.regs.workers)
	st.KVConnections = len(s.regs.conns)
	s.regs.mu.Unlock()
	st.Fingerprints, st.UnregisteredStale = s.chunks.fingerprints()
	return st
}

// service adapts Server to cbv1.BlendServiceServer.
type service struct {
	cbv1.UnimplementedBlendServiceServer
	s *Server
}

// serveRPC runs handler f for an RPC admitted while the server runs
// (Unavailable otherwise); Shutdown waits for it.
func serveRPC[Req, Resp any](s *Server, ctx context.Context, r Req, f func(context.Context, Req) (Resp, error)) (resp Resp, err error) {
	s.life.gateMu.RLock()
	err = stateErr(s.life.state)
	if err == nil {
		s.life.inflight.Add(1)
	}
	s.life.gateMu.RUnlock()
	if err != nil {
		return resp, status.Error(codes.Unavailable, err.Error())
	}
	defer s.life.inflight.Done()
	return f(ctx, r)
}

func (v *service) UnregisterKV(ctx context.Context, r *cbv1.UnregisterKVRequest) (*cbv1.UnregisterKVResponse, error) {
	return serveRPC(v.s, ctx, r, v.s.unregisterKV)
}

func (v *service) Lookup(ctx context.Context, r *cbv1.LookupRequest) (*cbv1.LookupResult, error) {
	return serveRPC(v.s, ctx, r, v.s.lookupRPC)
}

func (v *service) FleetStatus(ctx context.Context, r *cbv1.FleetStatusRequest) (*cbv1.FleetStatusResponse, error) {
	return serveRPC(v.s, ctx, r, v.s.fleetStatus)
}

func (v *service) StoreStatus(ctx context.Context, r *cbv1.StoreStatusRequest) (*cbv1.StoreStatusResponse, error) {
	return serveRPC(v.s, ctx, r, v.s.storeStatus)
}

func (v *service) Retrieve(ctx context.Context, r *cbv1.RetrieveRequest) (*cbv1.RetrieveResponse, error) {
	return serveRPC(v.s, ctx, r, v.s.retrieve)
}

func (v *service) Store(ctx context.Context, r *cbv1.StoreRequest) (*cbv1.StoreResponse, error) {
	return serveRPC(v.s, ctx, r, v.s.storeKV)
}

// traceContext is the payload's trace_context and trace_state, or else the
// W3C context the caller sent in gRPC metadata (traceparent and tracestate,
// extracted into ctx by telemetry.UnaryServerInterceptor), or "", "".
func traceContext(ctx context.Context, payload, state string) (traceparent, tracestate string) {
	if payload != "" {
		return payload, state
	}
	return telemetry.InjectStrings(ctx)
}
