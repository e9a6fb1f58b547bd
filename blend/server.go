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
// for concurrent use.
type Server struct {
	cfg     Config
	logger  *slog.Logger
	epoch   string
	store   *chunkstore.Store
	fleet   *fleet.Tier // nil without a fleet tier
	bus     *events.Bus
	pool    *scatter.Pool
	metrics *metrics.BlendMetrics

	grpcOpts []grpc.ServerOption // component.Deps.GRPCServerOptions (mutual TLS, callers' roles)

	gateMu   sync.RWMutex // guards state; RPCs hold it shared while they enqueue
	state    int
	inflight sync.WaitGroup // RPC handlers in progress

	lookupQ chan func()   // lookups waiting for a lookup worker
	regQ    chan func()   // fingerprint registrations waiting for their goroutine
	stop    chan struct{} // closed by Shutdown
	bg      sync.WaitGroup

	busy []atomic.Int64 // per lookup worker: start (Unix ns) of its running lookup, 0 when idle

	// wmu guards the registrations and the KV socket's connections.
	wmu       sync.Mutex
	workers   map[workerKey]*workerMem
	kvln      *kvsock.Listener
	kvConns   map[*kvsock.Conn]struct{} // open connections, registered or handshaking
	kvPerPeer map[int32]int             // open connections per peer pid
	kvClosed  bool
	refusing  chan struct{} // semaphore of refuseKV's goroutines

	tmu    sync.RWMutex
	tables map[string]*fingerprint.Table // per model

	amu     sync.Mutex
	aliases map[aliasKey]chunkstore.Key // (rank-0 key, rank) -> that rank's key
	aliasOf map[chunkstore.Key]aliasKey // reverse, to forget on eviction

	copyIDs atomic.Uint64

	syncMu                             sync.Mutex // serializes syncStoreCounters
	lastL1Evict, lastL2Evict, lastCorr int64

	lookupsRejected, lookupsAbandoned, lookupsDone atomic.Uint64
	regDone, regDropped                            atomic.Uint64
	regsRefused, regsReleased                      atomic.Uint64

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
	// LookupsStuck is the number of lookup workers running one lookup for
	// longer than Config.LookupStuckAfter (see Server.Health).
	LookupsStuck int
	// KVConnections is the number of open KV socket connections
	// (registered or handshaking).
	KVConnections int
	// KVRegistrationsRefused counts KV socket connections refused (limits,
	// another user, a bad registration or descriptor);
	// KVRegistrationsReleased the registrations released (connection
	// closed, replaced, unregistered).
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
// subscriber; for option-B cb.request roots to carry the trace id derived
// from the request id, it must honour telemetry.ContextWithTraceID (a
// telemetry/provider Provider's provider, or an SDK provider built with
// provider.NewIDGenerator(nil)). deps.Registerer receives the
// lmcache_blend_* instruments. deps.GRPCServerOptions are added to its gRPC
// server's (mutual TLS and the callers' roles, see rpc/mtls). The server has
// no span helper, so deps.Profile is unused. Nil fields take the defaults of
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
		cfg:       cfg,
		logger:    logger,
		epoch:     hex.EncodeToString(eb[:]),
		bus:       events.NewBus(events.Config{QueueSize: cfg.EventQueue}),
		pool:      scatter.NewPool(scatter.PoolConfig{Workers: cfg.CopyWorkers}),
		metrics:   bm,
		lookupQ:   make(chan func(), cfg.LookupQueue),
		busy:      make([]atomic.Int64, cfg.LookupWorkers),
		regQ:      make(chan func(), cfg.RegisterQueue),
		stop:      make(chan struct{}),
		workers:   make(map[workerKey]*workerMem),
		kvConns:   make(map[*kvsock.Conn]struct{}),
		kvPerPeer: make(map[int32]int),
		refusing:  make(chan struct{}, maxRefusing),
		tables:    make(map[string]*fingerprint.Table),
		aliases:   make(map[aliasKey]chunkstore.Key),
		aliasOf:   make(map[chunkstore.Key]aliasKey),
	}
	if cfg.Fleet.URL != "" {
		if s.fleet, err = fleet.New(cfg.Fleet, logger); err != nil {
			return nil, fmt.Errorf("blend: %w", err)
		}
	}
	s.grpcOpts = deps.GRPCServerOptions
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
	if n, err := s.restoreSequences(); err != nil {
		return nil, err
	} else if n > 0 {
		logger.Info("sequences restored from L2", "sequences", n)
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

// Start listens on Config.Addr and on the KV socket (Config.KVSocket),
// starts the event bus, the copy pool, the lookup workers and their
// watchdog (see Health) and the fingerprint-registration goroutine, then
// serves gRPC on the listener (with telemetry.UnaryServerInterceptor, the
// BlendService and the gRPC health service) and accepts KV registrations on
// the socket until Shutdown; see Addr and KVSocket for the bound addresses.
// RPCs are answered Unavailable before it. ctx bounds the start-up only. Starting twice or
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
	kvln, err := kvsock.Listen(s.cfg.KVSocket)
	if err != nil {
		ln.Close()
		return fmt.Errorf("blend: KV socket: %w", err)
	}
	if err := s.pool.Start(ctx); err != nil {
		ln.Close()
		kvln.Close()
		return fmt.Errorf("blend: copy pool: %w", err)
	}
	if s.fleet != nil {
		if err := s.fleet.Start(ctx); err != nil {
			ln.Close()
			kvln.Close()
			_ = s.pool.Shutdown(ctx)
			return fmt.Errorf("blend: fleet tier: %w", err)
		}
	}
	s.bus.Start()
	for i := range s.cfg.LookupWorkers {
		s.bg.Go(func() { s.runLookups(i) })
	}
	s.bg.Go(s.watchLookups)
	s.bg.Go(func() { runQueue(s.regQ) })
	s.state = stateRunning
	s.wmu.Lock()
	s.kvln = kvln
	s.wmu.Unlock()
	s.bg.Go(func() { s.acceptKV(kvln) })
	s.serve(ln)
	return nil
}

// Shutdown stops accepting RPCs (they are answered Unavailable), closes the
// KV socket and its connections (which ends every registration), stops the
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
	s.closeKV()

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
	if s.fleet != nil {
		if err := s.fleet.Shutdown(ctx); err != nil {
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
// Shutdown.
func (s *Server) serve(ln net.Listener) {
	srv := rpc.NewServer(s.grpcOpts...)
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

// KVSocket returns the path of the KV socket once started ("" before).
func (s *Server) KVSocket() string {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.kvln == nil {
		return ""
	}
	return s.kvln.Path()
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
	if s.fleet != nil {
		f := s.fleet.Stats()
		s.metrics.SetRemoteTotals(metrics.RemoteStats{
			Hits: f.Hits, Misses: f.Misses, Corrupt: f.Corrupt, ReadErrors: f.ReadErrors,
			Writes: f.Writes, WritesDropped: f.WritesDropped, WriteErrors: f.WriteErrors,
			BytesRead: f.BytesRead, BytesWritten: f.BytesWritten,
			Matches: f.Matches, MatchTimeouts: f.MatchTimeouts, MatchErrors: f.MatchErrors,
		})
	}
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
		Registrations: s.regDone.Load(), RegistrationsDropped: s.regDropped.Load(),
		KVRegistrationsRefused: s.regsRefused.Load(), KVRegistrationsReleased: s.regsReleased.Load(),
		Store: s.store.Stats(), Pool: s.pool.Stats(),
		EventsPublished: s.bus.Published(), EventsDropped: s.bus.Dropped(),
	}
	st.LookupsStuck, _ = s.stuckLookups(time.Now())
	if s.fleet != nil {
		st.Fleet = s.fleet.Stats()
	}
	s.wmu.Lock()
	st.Workers = len(s.workers)
	st.KVConnections = len(s.kvConns)
	s.wmu.Unlock()
	for _, t := range s.tableList() {
		ts := t.Stats()
		st.Fingerprints += ts.Fingerprints
		st.UnregisteredStale += ts.StaleUnregistered
	}
	return st
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

func (v *service) UnregisterKV(ctx context.Context, r *cbv1.UnregisterKVRequest) (*cbv1.UnregisterKVResponse, error) {
	if err := v.s.enter(); err != nil {
		return nil, err
	}
	defer v.s.leave()
	return v.s.unregisterKV(ctx, r)
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
