package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/tokenizer"
)

// Defaults of Config.
const (
	DefaultAddr             = "127.0.0.1:0"
	DefaultModelName        = "cb-llama"
	DefaultNumBlocks        = 2048
	DefaultBlockSize        = 16
	DefaultRegisterInterval = time.Second
	DefaultRPCTimeout       = 5 * time.Second
	DefaultMaxPendingStores = 64
)

// Config holds the worker's settings; every zero field takes its default.
type Config struct {
	// Addr is the gRPC listen address; default 127.0.0.1:0 (a free port).
	Addr string
	// BlendAddr is the blend server's gRPC address; empty disables reuse.
	BlendAddr string
	// WorkerID names this worker to the blend server; default worker-<pid>.
	WorkerID string
	// Rank is this worker's tensor-parallel rank (0).
	Rank int
	// ModelName is the served model's name; default cb-llama.
	ModelName string
	// Model sizes the transformer; zero fields take model defaults.
	Model model.Config
	// NumBlocks and BlockSize size the paged KV pool; default 2048 × 16.
	NumBlocks, BlockSize int
	// ShmDir is where the KV shared-memory file lives; default /dev/shm.
	ShmDir string
	// RegisterInterval is how often the worker (re-)registers its KV memory
	// with the blend server (a blend restart is noticed within it); default 1 s.
	RegisterInterval time.Duration
	// RPCTimeout bounds each blend-server call; default 5 s.
	RPCTimeout time.Duration
	// MaxPendingStores bounds the stores in flight; a store beyond it is
	// skipped and counted (the request is unaffected). Default 64.
	MaxPendingStores int
}

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.WorkerID == "" {
		c.WorkerID = fmt.Sprintf("worker-%d", os.Getpid())
	}
	if c.ModelName == "" {
		c.ModelName = DefaultModelName
	}
	if c.NumBlocks <= 0 {
		c.NumBlocks = DefaultNumBlocks
	}
	if c.BlockSize <= 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.RegisterInterval <= 0 {
		c.RegisterInterval = DefaultRegisterInterval
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = DefaultRPCTimeout
	}
	if c.MaxPendingStores <= 0 {
		c.MaxPendingStores = DefaultMaxPendingStores
	}
	return c
}

// Worker is the cb-worker process's component. Create it with New, then
// Start; Shutdown stops it and removes the shared-memory file. Its methods
// are safe for concurrent use; Execute calls are serialized internally.
type Worker struct {
	cfg     Config
	logger  *slog.Logger
	spans   *telemetry.Spans
	metrics *metrics.WorkerMetrics
	tok     tokenizer.Tokenizer

	model *model.Model
	kv    *kvcache.Memory

	grpcSrv *grpc.Server
	health  *health.Server
	ln      net.Listener

	blendConn *grpc.ClientConn
	blend     cbv1.BlendServiceClient

	execMu sync.Mutex // serializes Execute
	seqs   map[string]*seqState

	regMu      sync.Mutex
	registered bool
	epoch      string

	storeSem  chan struct{}
	storeMu   sync.Mutex
	storeDone []string

	bg       sync.WaitGroup
	stop     chan struct{}
	stopOnce sync.Once
}

// seqState is what the worker remembers of a request between steps.
type seqState struct {
	prompt []int32
	plan   *reuseplan.Plan // nil: computed in full
	rng    *rand.Rand
	// loaded is what the blend server wrote of the plan so far.
	loaded      reuseplan.Loaded
	reuseFailed bool
}

// New builds a Worker. tp may be nil (no tracing); profile, when non-nil,
// receives one JSONL line per span (CB_PROFILE); reg receives the worker's
// instruments (contract/instruments.yaml); logger may be nil (discard).
func New(cfg Config, tp trace.TracerProvider, profile *telemetry.ProfileSink, reg prometheus.Registerer, logger *slog.Logger) (*Worker, error) {
	cfg = cfg.withDefaults()
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	wm, err := metrics.NewWorkerMetrics(reg, metrics.WithOnRefused(func(err error) {
		logger.Warn("metrics record refused", "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("worker: metrics: %w", err)
	}
	var pw io.Writer // stays a nil interface when profile is nil
	if profile != nil {
		pw = profile
	}
	spans := telemetry.NewSpans(tp, "github.com/cacheblend/cacheblend/worker", pw)
	return &Worker{
		cfg:      cfg,
		logger:   logger,
		spans:    spans,
		metrics:  wm,
		seqs:     make(map[string]*seqState),
		storeSem: make(chan struct{}, cfg.MaxPendingStores),
		stop:     make(chan struct{}),
	}, nil
}

// Start builds the model, creates the KV shared memory (removing files a
// crashed worker left), starts the gRPC server and the registration loop.
func (w *Worker) Start(ctx context.Context) error {
	if removed, err := kvcache.RemoveStale(w.cfg.ShmDir); err == nil && len(removed) > 0 {
		w.logger.Info("removed stale KV shared memory", "files", removed)
	}
	m, err := model.New(w.cfg.Model)
	if err != nil {
		return fmt.Errorf("worker: model: %w", err)
	}
	w.model = m
	kv, err := kvcache.Create(w.cfg.ShmDir, m.Config().KVLayout(w.cfg.NumBlocks, w.cfg.BlockSize))
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.kv = kv
	ln, err := net.Listen("tcp", w.cfg.Addr)
	if err != nil {
		w.closeResources()
		return fmt.Errorf("worker: listen %s: %w", w.cfg.Addr, err)
	}
	w.ln = ln
	w.grpcSrv = rpc.NewServer()
	cbv1.RegisterWorkerServiceServer(w.grpcSrv, &service{w: w})
	w.health = health.NewServer()
	healthpb.RegisterHealthServer(w.grpcSrv, w.health)
	if w.cfg.BlendAddr != "" {
		conn, err := rpc.Dial(w.cfg.BlendAddr)
		if err != nil {
			w.closeResources()
			ln.Close()
			return fmt.Errorf("worker: blend client: %w", err)
		}
		w.blendConn = conn
		w.blend = cbv1.NewBlendServiceClient(conn)
		w.bg.Add(1)
		go w.registerLoop()
	}
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		if err := w.grpcSrv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			w.logger.Error("grpc server stopped", "err", err)
		}
	}()
	w.logger.Info("worker started", "addr", ln.Addr().String(), "shm", kv.Path(), "layers", m.Config().Layers,
		"dim", m.Config().Dim, "blocks", w.cfg.NumBlocks, "block_size", w.cfg.BlockSize, "blend", w.cfg.BlendAddr)
	return nil
}

// Addr is the bound gRPC address (after Start).
func (w *Worker) Addr() string {
	if w.ln == nil {
		return ""
	}
	return w.ln.Addr().String()
}

// ShmPath is the KV shared-memory file's path (after Start).
func (w *Worker) ShmPath() string {
	if w.kv == nil {
		return ""
	}
	return w.kv.Path()
}

// Model is the worker's model (after Start).
func (w *Worker) Model() *model.Model { return w.model }

// Registered reports whether the blend server currently has this worker's
// KV memory registered.
func (w *Worker) Registered() bool {
	w.regMu.Lock()
	defer w.regMu.Unlock()
	return w.registered
}

// Shutdown stops serving (in-flight steps finish, bounded by ctx), waits for
// pending stores, and removes the shared-memory file.
func (w *Worker) Shutdown(ctx context.Context) error {
	w.stopOnce.Do(func() { close(w.stop) })
	if w.health != nil {
		w.health.Shutdown()
	}
	if w.grpcSrv != nil {
		done := make(chan struct{})
		go func() { w.grpcSrv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			w.grpcSrv.Stop()
			<-done
		}
	}
	// Wait for pending stores (they hold the KV memory).
	for i := 0; i < cap(w.storeSem); i++ {
		select {
		case w.storeSem <- struct{}{}:
		case <-ctx.Done():
			i = cap(w.storeSem)
		}
	}
	w.bg.Wait()
	if w.blendConn != nil {
		w.blendConn.Close()
	}
	return w.closeResources()
}

func (w *Worker) closeResources() error {
	var errs []error
	if w.kv != nil {
		errs = append(errs, w.kv.Close())
	}
	return errors.Join(errs...)
}

// registerLoop registers the KV memory at start and every RegisterInterval
// (idempotent on the server), so a restarted blend server gets it back.
func (w *Worker) registerLoop() {
	defer w.bg.Done()
	t := time.NewTicker(w.cfg.RegisterInterval)
	defer t.Stop()
	for {
		w.register()
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

func (w *Worker) register() {
	l := w.kv.Layout()
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.RPCTimeout)
	defer cancel()
	resp, err := w.blend.RegisterKV(ctx, &cbv1.RegisterKVRequest{
		WorkerId: w.cfg.WorkerID, Rank: int32(w.cfg.Rank), ShmPath: w.kv.Path(), Model: w.cfg.ModelName,
		Layout: &cbv1.KVLayout{NumLayers: int32(l.NumLayers), NumBlocks: int32(l.NumBlocks), BlockSize: int32(l.BlockSize),
			KvHeads: int32(l.KVHeads), HeadDim: int32(l.HeadDim), RopeTheta: w.model.Config().RoPETheta},
	})
	w.regMu.Lock()
	was, prevEpoch := w.registered, w.epoch
	if err != nil {
		w.registered = false
	} else {
		w.registered = true
		w.epoch = resp.GetServerEpoch()
	}
	w.regMu.Unlock()
	switch {
	case err != nil && was:
		w.metrics.BlendFailure(metrics.BlendOpRegister)
		w.logger.Warn("blend server unreachable; serving without reuse", "err", err)
	case err != nil:
		w.metrics.BlendFailure(metrics.BlendOpRegister)
	case !was || prevEpoch != resp.GetServerEpoch():
		w.logger.Info("registered KV memory with the blend server", "epoch", resp.GetServerEpoch(), "shm", w.kv.Path())
	}
}
