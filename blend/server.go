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
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/blend/scatter"
	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
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
// for concurrent use.
type Server struct {
	cfg     Config
	logger  *slog.Logger
	epoch   string
	now     func() time.Time // the clock of registration expiry
	store   *chunkstore.Store
	bus     *events.Bus
	pool    *scatter.Pool
	metrics *metrics.BlendMetrics

	gateMu   sync.RWMutex // guards state; RPCs hold it shared while they enqueue
	state    int
	inflight sync.WaitGroup // RPC handlers in progress

	lookupQ chan func()   // lookups waiting for a lookup worker
	regQ    chan func()   // fingerprint registrations waiting for their goroutine
	stop    chan struct{} // closed by Shutdown: the registration reaper exits
	bg      sync.WaitGroup

	wmu     sync.Mutex
	workers map[workerKey]*workerMem

	tmu    sync.RWMutex
	tables map[string]*fingerprint.Table // per model

	amu     sync.Mutex
	aliases map[aliasKey]chunkstore.Key // (rank-0 key, rank) -> that rank's key
	aliasOf map[chunkstore.Key]aliasKey // reverse, to forget on eviction

	copyIDs atomic.Uint64

	syncMu                             sync.Mutex // serializes syncStoreCounters
	lastL1Evict, lastL2Evict, lastCorr int64

	lookupsRejected, lookupsAbandoned, lookupsDone atomic.Uint64
	regDone, regDropped, regsExpired               atomic.Uint64

	grpcMu  sync.Mutex // guards the gRPC server, set by Start
	grpcSrv *grpc.Server
	health  *health.Server
	ln      net.Listener
}

type aliasKey struct {
	base chunkstore.Key
	rank int
}

// Stats is a snapshot of a Server's state and counters.
type Stats struct {
	// Workers is the number of registered (worker, rank) KV memories.
	Workers int
	// LookupsDone counts lookups run; LookupsRejected the calls refused
	// because the queue was full; LookupsAbandoned the queued lookups skipped
	// because their caller's deadline had passed.
	LookupsDone, LookupsRejected, LookupsAbandoned uint64
	// Registrations counts sequences registered in a fingerprint table;
	// RegistrationsDropped those dropped because the queue was full.
	Registrations, RegistrationsDropped uint64
	// RegistrationsExpired counts worker KV registrations dropped because
	// they were not renewed within Config.RegistrationTTL.
	RegistrationsExpired uint64
	// Fingerprints is the number of live fingerprints over every model's
	// table; UnregisteredStale the chunks unregistered by stale strikes.
	Fingerprints      int
	UnregisteredStale int64
	// Store, Pool: the chunk store's and the copy pool's own counters.
	Store chunkstore.Stats
	Pool  scatter.PoolStats
	// EventsPublished and EventsDropped are the event bus's totals.
	EventsPublished, EventsDropped uint64
}

// New builds a Server for cfg and deps; nothing runs and nothing listens
// until Start. deps.TracerProvider receives the spans of the tracing
// subscriber; for option-B cb.request roots to carry the trace id derived
// from the request id, it must honour telemetry.ContextWithTraceID (a
// telemetry/provider Provider's provider, or an SDK provider built with
// provider.NewIDGenerator(nil)). deps.Registerer receives the
// lmcache_blend_* instruments. The server has no span helper, so
// deps.Profile is unused. Nil fields take the defaults of
// component.Deps.WithDefaults.
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
	var eb [8]byte
	if _, err := rand.Read(eb[:]); err != nil {
		return nil, fmt.Errorf("blend: server epoch: %w", err)
	}
	s := &Server{
		cfg:     cfg,
		logger:  logger,
		epoch:   hex.EncodeToString(eb[:]),
		now:     time.Now,
		bus:     events.NewBus(events.Config{QueueSize: cfg.EventQueue}),
		pool:    scatter.NewPool(scatter.PoolConfig{Workers: cfg.CopyWorkers}),
		metrics: bm,
		lookupQ: make(chan func(), cfg.LookupQueue),
		regQ:    make(chan func(), cfg.RegisterQueue),
		stop:    make(chan struct{}),
		workers: make(map[workerKey]*workerMem),
		tables:  make(map[string]*fingerprint.Table),
		aliases: make(map[aliasKey]chunkstore.Key),
		aliasOf: make(map[chunkstore.Key]aliasKey),
	}
	s.store, err = chunkstore.New(chunkstore.Config{
		L1Bytes:   cfg.L1Bytes,
		Dir:       cfg.L2Dir,
		L2Bytes:   cfg.L2Bytes,
		ChunkSize: cfg.ChunkSize,
		OnEvict:   s.onEvict,
	})
	if err != nil {
		return nil, fmt.Errorf("blend: chunk store: %w", err)
	}
	ts, err := events.NewTracingSubscriber(tp)
	if err != nil {
		return nil, fmt.Errorf("blend: %w", err)
	}
	ms, err := events.NewMetricsSubscriber(bm)
	if err != nil {
		return nil, fmt.Errorf("blend: %w", err)
	}
	ls, err := events.NewL2ThroughputSubscriber(bm)
	if err != nil {
		return nil, fmt.Errorf("blend: %w", err)
	}
	for _, sub := range []struct {
		s     events.Subscriber
		types []events.EventType
	}{{ts, ts.EventTypes()}, {ms, ms.EventTypes()}, {ls, ls.EventTypes()}} {
		if err := s.bus.Subscribe(sub.s, sub.types...); err != nil {
			return nil, fmt.Errorf("blend: %w", err)
		}
	}
	return s, nil
}

// Start listens on Config.Addr, starts the event bus, the copy pool, the
// lookup workers, the fingerprint-registration goroutine and the
// registration reaper, then serves gRPC on the listener (with
// telemetry.UnaryServerInterceptor, the BlendService and the gRPC health
// service) until Shutdown; see Addr for the bound address. RPCs are answered
// Unavailable before it. ctx bounds the start-up only. Starting twice or
// after Shutdown is an error; when Start fails nothing is left running.
func (s *Server) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.state != stateNew {
		return errors.New("blend: server already started or shut down")
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("blend: listen %s: %w", s.cfg.Addr, err)
	}
	if err := s.pool.Start(ctx); err != nil {
		ln.Close()
		return fmt.Errorf("blend: copy pool: %w", err)
	}
	s.bus.Start()
	for range s.cfg.LookupWorkers {
		s.bg.Go(func() { runQueue(s.lookupQ) })
	}
	s.bg.Go(func() { runQueue(s.regQ) })
	s.bg.Go(s.reapRegistrations)
	s.state = stateRunning
	s.serve(ln)
	return nil
}

// Shutdown stops accepting RPCs (they are answered Unavailable), stops the
// gRPC server started by Start (gracefully, forcibly when ctx ends), lets
// the queued lookups and fingerprint registrations finish, waits for the
// RPCs and copies in progress, drains the event bus into its subscribers,
// and unmaps the workers' KV memories. It returns ctx's error (wrapped)
// when ctx ends first; the goroutines still finish on their own. Later
// calls return nil.
func (s *Server) Shutdown(ctx context.Context) error {
	s.gateMu.Lock()
	if s.state == stateStopped {
		s.gateMu.Unlock()
		return nil
	}
	s.state = stateStopped
	// No RPC can enqueue after this (they check the state under the shared
	// lock while sending), so the queues can be closed.
	close(s.lookupQ)
	close(s.regQ)
	close(s.stop)
	s.gateMu.Unlock()

	var errs []error
	s.grpcMu.Lock()
	srv, hs := s.grpcSrv, s.health
	s.grpcMu.Unlock()
	if hs != nil {
		hs.Shutdown()
	}
	if srv != nil {
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			srv.Stop()
			<-done
		}
	}
	if err := waitCtx(ctx, s.inflight.Wait); err != nil {
		errs = append(errs, fmt.Errorf("blend: waiting for RPCs: %w", err))
	}
	if err := waitCtx(ctx, s.bg.Wait); err != nil {
		errs = append(errs, fmt.Errorf("blend: waiting for workers: %w", err))
	}
	if err := s.pool.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("blend: copy pool: %w", err))
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

// enter admits an RPC while the server runs; the caller must call leave.
func (s *Server) enter() error {
	s.gateMu.RLock()
	defer s.gateMu.RUnlock()
	switch s.state {
	case stateNew:
		return status.Error(codes.Unavailable, "blend server not started")
	case stateStopped:
		return status.Error(codes.Unavailable, "blend server shutting down")
	}
	s.inflight.Add(1)
	return nil
}

func (s *Server) leave() { s.inflight.Done() }

// Epoch is the server epoch: random per process start, returned by
// RegisterKV so that workers notice a restart.
func (s *Server) Epoch() string { return s.epoch }

// Metrics is the server's lmcache_blend_* instruments.
func (s *Server) Metrics() *metrics.BlendMetrics { return s.metrics }

// Service returns the gRPC service to mount on a grpc.Server
// (cbv1.RegisterBlendServiceServer). Mount it with
// telemetry.UnaryServerInterceptor so that a caller's gRPC trace metadata is
// honoured when a payload carries no trace_context.
func (s *Server) Service() cbv1.BlendServiceServer { return &service{s: s} }

// serve serves the BlendService and the gRPC health service on ln until
// Shutdown.
func (s *Server) serve(ln net.Listener) {
	srv := rpc.NewServer()
	cbv1.RegisterBlendServiceServer(srv, s.Service())
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(cbv1.BlendService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.grpcMu.Lock()
	s.grpcSrv, s.health, s.ln = srv, hs, ln
	s.grpcMu.Unlock()
	s.bg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.logger.Error("blend gRPC server stopped", "err", err)
		}
	})
}

// Addr returns the bound gRPC address once started ("" before), e.g. the
// port picked for "127.0.0.1:0".
func (s *Server) Addr() string {
	s.grpcMu.Lock()
	defer s.grpcMu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// MetricsBefore refreshes the instruments that mirror running totals and
// snapshots (event-bus totals, L1 bytes and chunks, fingerprints, evictions
// per tier, corrupt L2 files); pass it as the before-scrape hook of
// metrics.Handler. Safe for concurrent use.
func (s *Server) MetricsBefore() {
	s.metrics.SetEventBusTotals(s.bus.Published(), s.bus.Dropped())
	st := s.store.Stats()
	fps := 0
	for _, t := range s.tableList() {
		fps += t.Stats().Fingerprints
	}
	s.metrics.SetStorage(metrics.StorageStats{L1Bytes: st.L1Bytes, L1Chunks: int64(st.L1Chunks), Fingerprints: int64(fps)})
	s.syncStoreCounters()
}

// syncStoreCounters advances chunks_evicted{tier} and l2_corrupt_chunks to
// the chunk store's totals (budget evictions only; corrupt files count
// apart).
func (s *Server) syncStoreCounters() {
	st := s.store.Stats()
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if d := st.L1Evictions - s.lastL1Evict; d > 0 {
		s.metrics.AddChunksEvicted(metrics.TierL1, int(d))
		s.lastL1Evict = st.L1Evictions
	}
	if d := st.L2Evictions - s.lastL2Evict; d > 0 {
		s.metrics.AddChunksEvicted(metrics.TierL2, int(d))
		s.lastL2Evict = st.L2Evictions
	}
	if d := st.Corrupt - s.lastCorr; d > 0 {
		s.metrics.AddL2CorruptChunks(int(d))
		s.lastCorr = st.Corrupt
	}
}

// Stats returns a snapshot of the server's state and counters.
func (s *Server) Stats() Stats {
	st := Stats{
		LookupsDone: s.lookupsDone.Load(), LookupsRejected: s.lookupsRejected.Load(), LookupsAbandoned: s.lookupsAbandoned.Load(),
		Registrations: s.regDone.Load(), RegistrationsDropped: s.regDropped.Load(), RegistrationsExpired: s.regsExpired.Load(),
		Store: s.store.Stats(), Pool: s.pool.Stats(),
		EventsPublished: s.bus.Published(), EventsDropped: s.bus.Dropped(),
	}
	s.wmu.Lock()
	st.Workers = len(s.workers)
	s.wmu.Unlock()
	for _, t := range s.tableList() {
		ts := t.Stats()
		st.Fingerprints += ts.Fingerprints
		st.UnregisteredStale += ts.StaleUnregistered
	}
	return st
}

// reapRegistrations drops worker KV registrations not renewed within
// RegistrationTTL, until Shutdown.
func (s *Server) reapRegistrations() {
	t := time.NewTicker(min(s.cfg.RegistrationTTL, time.Second))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.expireWorkers(s.now())
		}
	}
}

// publish puts ev on the bus (dropped and counted when full).
func (s *Server) publish(ev events.Event) { s.bus.Publish(ev) }

// table returns the fingerprint table of model, creating it when create.
func (s *Server) table(model string, create bool) *fingerprint.Table {
	s.tmu.RLock()
	t := s.tables[model]
	s.tmu.RUnlock()
	if t != nil || !create {
		return t
	}
	s.tmu.Lock()
	defer s.tmu.Unlock()
	if t = s.tables[model]; t == nil {
		t = fingerprint.NewTable(fingerprint.Config{Window: s.cfg.FingerprintWindow})
		s.tables[model] = t
	}
	return t
}

func (s *Server) tableList() []*fingerprint.Table {
	s.tmu.RLock()
	defer s.tmu.RUnlock()
	out := make([]*fingerprint.Table, 0, len(s.tables))
	for _, t := range s.tables {
		out = append(out, t)
	}
	return out
}

// onEvict is the chunk store's eviction callback: a chunk held by no tier
// any more gets a stale strike in the fingerprint tables (two strikes
// unregister it) and loses its rank alias.
func (s *Server) onEvict(key chunkstore.Key, _ chunkstore.Tier, gone bool) {
	if !gone {
		return
	}
	s.amu.Lock()
	if a, ok := s.aliasOf[key]; ok {
		delete(s.aliasOf, key)
		if s.aliases[a] == key {
			delete(s.aliases, a)
		}
	}
	s.amu.Unlock()
	s.markStale(key)
}

// markStale gives key a stale strike in every table holding it and counts
// the fingerprints that this unregisters.
func (s *Server) markStale(key chunkstore.Key) {
	for _, t := range s.tableList() {
		if t.MarkStale(key) {
			s.metrics.AddFingerprintsUnregistered(1)
		}
	}
}

// rankKey translates a rank-0 chunk key to rank's key.
func (s *Server) rankKey(key chunkstore.Key, rank int) (chunkstore.Key, bool) {
	if rank == 0 {
		return key, true
	}
	s.amu.Lock()
	defer s.amu.Unlock()
	k, ok := s.aliases[aliasKey{key, rank}]
	return k, ok
}

func (s *Server) setAliases(base, keys []chunkstore.Key, rank int) {
	s.amu.Lock()
	defer s.amu.Unlock()
	for i, k := range keys {
		a := aliasKey{base[i], rank}
		if old, ok := s.aliases[a]; ok && old != k {
			delete(s.aliasOf, old)
		}
		s.aliases[a] = k
		s.aliasOf[k] = a
	}
}

// service adapts Server to cbv1.BlendServiceServer.
type service struct {
	cbv1.UnimplementedBlendServiceServer
	s *Server
}

func (v *service) RegisterKV(ctx context.Context, r *cbv1.RegisterKVRequest) (*cbv1.RegisterKVResponse, error) {
	if err := v.s.enter(); err != nil {
		return nil, err
	}
	defer v.s.leave()
	return v.s.registerKV(ctx, r)
}

func (v *service) Lookup(ctx context.Context, r *cbv1.LookupRequest) (*cbv1.LookupResult, error) {
	if err := v.s.enter(); err != nil {
		return nil, err
	}
	defer v.s.leave()
	return v.s.lookupRPC(ctx, r)
}

func (v *service) Retrieve(ctx context.Context, r *cbv1.RetrieveRequest) (*cbv1.RetrieveResponse, error) {
	if err := v.s.enter(); err != nil {
		return nil, err
	}
	defer v.s.leave()
	return v.s.retrieve(ctx, r)
}

func (v *service) Store(ctx context.Context, r *cbv1.StoreRequest) (*cbv1.StoreResponse, error) {
	if err := v.s.enter(); err != nil {
		return nil, err
	}
	defer v.s.leave()
	return v.s.storeKV(ctx, r)
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
