package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/gguf"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/modelfile"
	"github.com/cacheblend/cacheblend/offheap"
	"github.com/cacheblend/cacheblend/rankgroup"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/kvsock"
	"github.com/cacheblend/cacheblend/telemetry"
	"github.com/cacheblend/cacheblend/tokenizer"
	"github.com/cacheblend/cacheblend/tp"
)

// Defaults of Config.
const (
	DefaultAddr             = "127.0.0.1:0"
	DefaultNumBlocks        = 2048
	DefaultBlockSize        = 16
	DefaultKVType           = "f16"
	DefaultRegisterInterval = time.Second
	DefaultRPCTimeout       = 5 * time.Second
	DefaultMaxPendingStores = 64
)

// Config holds the worker's settings; every zero field takes its default.
// A Config is a plain value, read once by New.
type Config struct {
	// Addr is the gRPC listen address; default 127.0.0.1:0 (a free port).
	Addr string
	// WorkerID names this worker to the blend server; default worker-<pid>.
	WorkerID string
	// Rank is this worker's tensor-parallel rank (0).
	Rank int
	// ModelName is the served model's name; default defaults.Model
	// ("cb-llama") for the built-in model, the file's served name
	// (modelfile.File.Name) with ModelPath.
	ModelName string
	// ModelPath is a GGUF model file to serve (see model.Load); empty: the
	// built-in model. Its bytes are read into the worker's own memory with
	// transparent huge pages (gguf.Resident: no TLB miss per 4 KiB page of
	// weights; a decode step 0–10% faster on Llama-3.2-1B F16) unless
	// MapWeights is set or the worker is a tensor-parallel rank
	// (Deps.Reducer), which map it.
	ModelPath string
	// MapWeights serves ModelPath from a memory mapping of the file (pages
	// shared with every process mapping it, read on first use, no copy at
	// start) instead of reading it into the worker's memory. Default
	// false.
	MapWeights bool
	// Model sizes the built-in transformer (zero fields take model
	// defaults); with ModelPath only its CheckLayer, RecompRatio, Threads
	// and MaxPositions (a cap on the file's context length) apply.
	Model model.Config
	// NumBlocks and BlockSize size the paged KV pool; default 2048 × 16.
	NumBlocks, BlockSize int
	// KVType is the element type of the KV pool's values: "f16" (the
	// default, as llama.cpp's cache: half the memory and half the bytes a
	// decode step reads from it, each value rounded to 11 significant
	// bits) or "f32" (kvcache.ParseDType).
	KVType string
	// ShmDir is where the KV memory's fallback file is created (and
	// unlinked at once) when the kernel has no memfd_create; default
	// /dev/shm (kvcache.Create).
	ShmDir string
	// BlendKVSocket is the blend server's KV socket (package rpc/kvsock),
	// on which the worker hands over its KV memory's descriptor; default
	// kvsock.DefaultPath(). Used only with Deps.Blend.
	BlendKVSocket string
	// RegisterInterval is how long the worker waits between attempts to
	// register its KV memory while the blend server is unreachable; a
	// registration lasts while its socket connection does, so a blend
	// restart is noticed at once and re-registered within it. Default 1 s.
	RegisterInterval time.Duration
	// RPCTimeout bounds each blend-server call; default 5 s.
	RPCTimeout time.Duration
	// MaxPendingStores bounds the stores in flight; a store beyond it is
	// skipped and counted (the request is unaffected). Default 64.
	MaxPendingStores int
	// KeepTimeout is how long a prefill worker keeps a handed-over prompt's
	// KV for its read (docs/design.md §9); past it the keep is released
	// (and a read in progress stops). Default 30 s.
	KeepTimeout time.Duration
	// MaxKeeps bounds the hand-overs kept at once; the step that would keep
	// one more fails that request. Default 256.
	MaxKeeps int
	// MaxPulls bounds the pulls a decode worker runs at once
	// (ResourceExhausted beyond). Default 8.
	MaxPulls int
	// PullTimeout bounds one pull. Default 60 s.
	PullTimeout time.Duration
	// KVSendRate, when positive, paces each hand-over read this worker
	// serves to that many bytes per second (a cap on the KV transfer's share
	// of the network). Default 0: unpaced.
	KVSendRate int64
	// Quality configures CacheBlend's quality checks: the blend gate at
	// start and the online check.
	Quality QualityConfig
}

// QualityConfig configures the worker's CacheBlend quality checks; every
// zero field takes its default. A plain value.
type QualityConfig struct {
	// Gate is the blend gate's mode: GateAuto (the default) checks at start
	// that blending reused documents keeps the model's answers close to a
	// full prefill and turns blending off for the model when it does not
	// (the engine then reuses exact prefixes only); GateOn and GateOff force
	// it either way without a check.
	Gate string
	// GateKL is the gate's threshold on the mean KL (nats); default
	// DefaultBlendGateKL.
	GateKL float64
	// SampleRate is the share of blended prefills whose quality is checked
	// online against a full prefill, off the request's path (see
	// docs/design.md §13); 0 (the zero value) is off. Whole-model workers
	// only.
	SampleRate float64
	// Budget is the share of one core the quality checker may use: after a
	// check that took CPU time c (its thread's, on Linux; elsewhere wall
	// time) no sample is taken for c/Budget. Default DefaultQualityBudget.
	// The checker runs on its own thread at the lowest priority, so the
	// budget bounds what it takes from idle time, not from requests.
	Budget float64
	// Positions is how many output positions a check compares; default
	// DefaultQualityPositions.
	Positions int
}

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.WorkerID == "" {
		c.WorkerID = fmt.Sprintf("worker-%d", os.Getpid())
	}
	if c.ModelName == "" && c.ModelPath == "" {
		c.ModelName = defaults.Model
	}
	if c.NumBlocks <= 0 {
		c.NumBlocks = DefaultNumBlocks
	}
	q := &c.Quality
	q.Gate = cmp.Or(q.Gate, GateAuto)
	if q.GateKL <= 0 {
		q.GateKL = DefaultBlendGateKL
	}
	if q.Budget <= 0 || q.Budget > 1 {
		q.Budget = DefaultQualityBudget
	}
	if q.Positions <= 0 {
		q.Positions = DefaultQualityPositions
	}
	if c.BlockSize <= 0 {
		c.BlockSize = DefaultBlockSize
	}
	c.KVType = cmp.Or(c.KVType, DefaultKVType)
	if c.BlendKVSocket == "" {
		c.BlendKVSocket = kvsock.DefaultPath()
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
	if c.KeepTimeout <= 0 {
		c.KeepTimeout = DefaultKeepTimeout
	}
	if c.MaxKeeps <= 0 {
		c.MaxKeeps = DefaultMaxKeeps
	}
	if c.MaxPulls <= 0 {
		c.MaxPulls = DefaultMaxPulls
	}
	if c.PullTimeout <= 0 {
		c.PullTimeout = DefaultPullTimeout
	}
	return c
}

// Deps are the worker's collaborators: the process-wide ones of
// component.Deps and its peer, the blend server.
type Deps struct {
	// Deps are the tracer provider (the worker's spans), the registerer of
	// its instruments (contract/instruments.yaml), its logger, the span
	// profile (CB_PROFILE) and the options of its gRPC server (mutual TLS
	// and the callers' roles, rpc/mtls), each with the default of
	// component.Deps.WithDefaults.
	component.Deps
	// Blend is the blend server client: the worker registers its KV memory
	// on the server's KV socket (Config.BlendKVSocket), then retrieves
	// reused KV and stores prompts through this client with the
	// registration's token. The caller dials it (gRPC connects lazily, so the
	// blend server may come up later or restart) and closes it after
	// Shutdown. nil disables reuse.
	Blend cbv1.BlendServiceClient
	// DialPeer dials another worker's gRPC address (a decode worker pulling
	// a handed-over prompt's KV from a prefill worker): with mutual TLS,
	// expecting the cb-worker role. nil: plaintext rpc.Dial. The worker
	// keeps at most a few connections open and closes them at Shutdown.
	DialPeer func(addr string) (*grpc.ClientConn, error)
	// Reducer, when set, makes the worker one rank of a tensor-parallel
	// group (cb worker --tp N, docs/design.md §11): its model is
	// model.NewShard over this all-reduce, its KV memory holds the rank's
	// KV heads and is registered with the blend server under
	// Reducer.Rank() (which overrides Config.Rank), and its retrieves and
	// stores are the rank's. nil: the whole model, rank Config.Rank.
	Reducer tp.AllReducer
	// Peers, on rank 0 of a group, runs every Execute on the other ranks
	// too (package rankgroup): it forwards the step, runs the worker's own
	// Execute and merges the answers. An error from it (the group failed)
	// is answered with Unavailable. nil: no other ranks.
	Peers StepForwarder
}

// StepForwarder runs a step on the other ranks of a tensor-parallel group
// around the local one (rankgroup.Group implements it).
type StepForwarder interface {
	Execute(ctx context.Context, req *cbv1.ExecuteRequest, local rankgroup.Local) (*cbv1.ExecuteResponse, error)
}

var _ component.Lifecycle = (*Worker)(nil)

// Worker is the cb-worker process's component. Create it with New, then
// Start; Shutdown stops it, ends its KV registration and closes the KV
// memory (the lifecycle of component.Lifecycle). Its methods are safe for concurrent
// use; Execute calls are serialized internally.
type Worker struct {
	cfg     Config
	kvType  kvcache.DType // cfg.KVType parsed
	logger  *slog.Logger
	spans   *telemetry.Spans
	metrics *metrics.WorkerMetrics
	tok     tokenizer.Tokenizer

	model *model.Model
	file  *modelfile.File // the model file (nil: the built-in model)
	// kvModel names the model's KV at the blend server and to other
	// workers (defaults.KVNamespace: the served name, and the file's
	// identity with a model file). Set by Start.
	kvModel string
	kv      *kvcache.Memory

	life lifecycle

	blend cbv1.BlendServiceClient // nil: no reuse

	execMu sync.Mutex // serializes Execute
	// logitBufs recycles a step's logits (a decode batch's, a prefill
	// chunk's) outside the Go heap: a batch's are MaxBatch × Vocab floats
	// (39 MiB for Qwen2.5's vocabulary at 64 sequences), which on the heap
	// the collector would count as live, letting it grow by as much again.
	logitBufs offheap.Pool
	seqs      map[string]*seqState

	reg    registration
	stores storeQueue

	gate    gateResult      // the blend gate's outcome (set by Start)
	quality *qualitySampler // the online quality check; nil when off (set by Start)

	ho    *handoffs                                   // prefill/decode hand-overs (handoff.go)
	dial  func(addr string) (*grpc.ClientConn, error) // Deps.DialPeer
	group rankGroup
}

// lifecycle is the worker's running state: what Start sets and Shutdown
// stops. Its fields other than bg and stop are guarded by mu.
type lifecycle struct {
	mu       sync.Mutex
	started  bool
	shutdown bool
	grpcSrv  *grpc.Server
	health   *health.Server
	ln       net.Listener
	grpcOpts []grpc.ServerOption // component.Deps.GRPCServerOptions (mutual TLS, callers' roles)
	bg       sync.WaitGroup      // the background goroutines (registration, serving)
	stop     chan struct{}       // closed by Shutdown: the registration loop exits
}

// registration is the worker's KV registration at the blend server.
type registration struct {
	mu   sync.Mutex
	sess *session       // the current KV registration; nil when not registered; guarded by mu
	wg   sync.WaitGroup // the sessions' watchers
}

// storeQueue bounds the stores in flight (sem) and collects the ids of
// requests whose store ended (done, guarded by mu) for the next step's
// response.
type storeQueue struct {
	sem  chan struct{}
	mu   sync.Mutex
	done []string
}

// rankGroup is the worker's place in a tensor-parallel group.
type rankGroup struct {
	reducer tp.AllReducer // Deps.Reducer: nil unless a tensor-parallel rank
	peers   StepForwarder // Deps.Peers: rank 0 of a group only
	world   int           // tensor-parallel world size (1: a whole model)
}

// session is one KV registration: the socket connection it lives on and
// its token.
type session struct {
	conn  *kvsock.Conn
	token []byte
	epoch string
	done  chan struct{} // closed when the connection ends (the server closed it)
}

// seqState is what the worker remembers of a request between steps.
type seqState struct {
	prompt []int32
	plan   *reuseplan.Plan // nil: computed in full
	// rule is the plan's recompute ratio and selection rule (its
	// RecompRatio, Select and SelectSeed only).
	rule model.BlendInput
	// qualityCheck: the engine asked for this request's online quality
	// check (SeqStep.quality_check).
	qualityCheck bool
	rng          *rand.Rand
	// loaded is what the blend server wrote of the plan so far.
	loaded      reuseplan.Loaded
	reuseFailed bool
}

// New builds a Worker from cfg and deps; nothing runs until Start.
func New(cfg Config, deps Deps) (*Worker, error) {
	cfg = cfg.withDefaults()
	if g := cfg.Quality.Gate; g != GateAuto && g != GateOn && g != GateOff {
		return nil, fmt.Errorf("worker: blend gate %q (want %s, %s or %s)", g, GateAuto, GateOn, GateOff)
	}
	kvType, err := kvcache.ParseDType(cfg.KVType)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	d := deps.Deps.WithDefaults()
	wm, err := metrics.NewWorkerMetrics(d.Registerer, metrics.WithOnRefused(func(err error) {
		d.Logger.Warn("metrics record refused", "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("worker: metrics: %w", err)
	}
	sec, err := metrics.NewHandoffSecurityMetrics(d.Registerer, metrics.WithOnRefused(func(err error) {
		d.Logger.Warn("metrics record refused", "err", err)
	}))
	if err != nil {
		return nil, fmt.Errorf("worker: metrics: %w", err)
	}
	return &Worker{
		cfg:     cfg,
		kvType:  kvType,
		logger:  d.Logger,
		spans:   d.Spans("github.com/cacheblend/cacheblend/worker"),
		metrics: wm,
		blend:   deps.Blend,
		life:    lifecycle{grpcOpts: d.GRPCServerOptions, stop: make(chan struct{})},
		seqs:    make(map[string]*seqState),
		stores:  storeQueue{sem: make(chan struct{}, cfg.MaxPendingStores)},
		ho:      newHandoffs(sec),
		dial:    deps.DialPeer,
		group:   rankGroup{reducer: deps.Reducer, peers: deps.Peers, world: 1},
	}, nil
}

// Start builds the model, creates the KV memory (a sealed memfd, see
// kvcache.Create; fallback files a crashed worker left are removed), starts
// the gRPC server and, with a blend client, the registration loop; it
// returns once the gRPC address is bound. ctx bounds the binding only.
// Starting twice or after Shutdown is an error; when Start fails nothing is
// left running and the KV memory is closed.
func (w *Worker) Start(ctx context.Context) error {
	w.life.mu.Lock()
	defer w.life.mu.Unlock()
	if w.life.started || w.life.shutdown {
		return errors.New("worker: Start called twice or after Shutdown")
	}
	if removed, err := kvcache.RemoveStale(w.cfg.ShmDir); err == nil && len(removed) > 0 {
		w.logger.Info("removed stale KV shared memory", "files", removed)
	}
	m, err := w.loadModel()
	if err != nil {
		return fmt.Errorf("worker: model: %w", err)
	}
	w.model = m
	// Loading left garbage on the heap (the file's metadata strings, the
	// vocabulary's construction, the gate's forwards), which the collector
	// — rare once the scratch buffers live outside the heap — would leave
	// resident for a long time: one forced collection returns it to the
	// system (Qwen2.5-0.5B Q4_K_M, its 151,936-token vocabulary: a Go heap
	// of 32–35 MiB after the benchmark's runs becomes 20).
	debug.FreeOSMemory()
	kv, err := kvcache.Create(w.cfg.ShmDir, m.KVLayout(w.cfg.NumBlocks, w.cfg.BlockSize, w.kvType))
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.kv = kv
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", w.cfg.Addr)
	if err != nil {
		w.closeResources()
		return fmt.Errorf("worker: listen %s: %w", w.cfg.Addr, err)
	}
	w.life.started = true
	w.life.ln = ln
	w.life.grpcSrv = rpc.NewServer(w.life.grpcOpts...)
	cbv1.RegisterWorkerServiceServer(w.life.grpcSrv, &service{w: w})
	cbv1.RegisterKVTransferServiceServer(w.life.grpcSrv, &kvService{w: w})
	w.life.health = health.NewServer()
	healthpb.RegisterHealthServer(w.life.grpcSrv, w.life.health)
	var firstTry chan struct{}
	if w.blend != nil {
		firstTry = make(chan struct{})
		w.life.bg.Add(1)
		go w.registerLoop(firstTry)
	}
	if w.quality = newQualitySampler(w.cfg, m, w.kvType); w.quality != nil {
		w.life.bg.Add(1)
		go w.checkQuality(w.quality)
	}
	w.life.bg.Add(1)
	go func(srv *grpc.Server) {
		defer w.life.bg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			w.logger.Error("grpc server stopped", "err", err)
		}
	}(w.life.grpcSrv)
	if firstTry != nil {
		// Started means registered when the blend server is up: the first
		// attempt (bounded by RPCTimeout) ends before Start returns, so the
		// first requests after READY can load reused KV.
		<-firstTry
	}
	if w.quality != nil {
		// Started means the quality checker's memory is reserved: while
		// it is being reserved the checker is busy, and a request that asks
		// for a check right after READY would have it dropped.
		<-w.quality.ready
	}
	w.logger.Info("worker started", "addr", ln.Addr().String(), "kv_memory", kv.Name(), "sealed", kv.Sealed(), "layers", m.Config().Layers,
		"dim", m.Config().Dim, "blocks", w.cfg.NumBlocks, "block_size", w.cfg.BlockSize, "blend", w.blend != nil,
		"rank", w.cfg.Rank, "world_size", w.group.world)
	w.metrics.SetBlendGate(w.gate.Off == "", w.gate.KL)
	if g := w.gate; g.Off != "" {
		w.logger.Warn("CacheBlend blending is off for this model: the engine reuses exact prefixes only", "reason", g.Off,
			"blend_gate", g.Outcome, "kl", g.KL, "top1", g.Top1, "cases", g.Cases, "gate_ms", g.Duration.Milliseconds())
	} else {
		w.logger.Info("CacheBlend blend gate", "blend_gate", g.Outcome, "kl", g.KL, "top1", g.Top1, "cases", g.Cases,
			"threshold", w.cfg.Quality.GateKL, "gate_ms", g.Duration.Milliseconds())
	}
	return nil
}

// BlendStatus says whether CacheBlend blending is on for the worker's model
// and why (the blend gate's outcome; "" before Start), for /health.
func (w *Worker) BlendStatus() string {
	w.life.mu.Lock()
	defer w.life.mu.Unlock()
	if !w.life.started {
		return ""
	}
	g := w.gate
	switch {
	case g.Off != "":
		return "off: " + g.Off
	case g.Outcome == gatePassed:
		return fmt.Sprintf("on (blend gate passed: mean KL %.4g <= %.4g)", g.KL, w.cfg.Quality.GateKL)
	}
	return "on (forced: --blend-gate on)"
}

// Addr is the bound gRPC address ("" before Start).
func (w *Worker) Addr() string {
	w.life.mu.Lock()
	defer w.life.mu.Unlock()
	if w.life.ln == nil {
		return ""
	}
	return w.life.ln.Addr().String()
}

// KVMemory describes the KV memory ("memfd:cb-kv", or the fallback's
// "unlinked file in DIR"; "" before Start). It is not a path: nothing on
// the file system names the memory.
func (w *Worker) KVMemory() string {
	w.life.mu.Lock()
	defer w.life.mu.Unlock()
	if w.kv == nil {
		return ""
	}
	return w.kv.Name()
}

// Model is the worker's model (nil before Start).
func (w *Worker) Model() *model.Model {
	w.life.mu.Lock()
	defer w.life.mu.Unlock()
	return w.model
}

// Registered reports whether the blend server currently has this worker's
// KV memory registered.
func (w *Worker) Registered() bool { return w.token() != nil }

// token is the current registration's token, nil when not registered.
func (w *Worker) token() []byte {
	w.reg.mu.Lock()
	defer w.reg.mu.Unlock()
	if w.reg.sess == nil {
		return nil
	}
	select {
	case <-w.reg.sess.done:
		return nil
	default:
		return w.reg.sess.token
	}
}

// Shutdown stops serving (in-flight steps finish until ctx ends, then the
// gRPC server is stopped), stops the registration loop, waits for pending
// stores (until ctx ends), ends the KV registration (UnregisterKV, then the
// socket is closed) and closes the KV memory. It returns
// an error wrapping ctx's when it had to cut steps or stores short. It does
// not close the blend client (the caller's). Later calls return nil.
func (w *Worker) Shutdown(ctx context.Context) error {
	w.life.mu.Lock()
	if w.life.shutdown {
		w.life.mu.Unlock()
		return nil
	}
	w.life.shutdown = true
	srv, hs := w.life.grpcSrv, w.life.health
	w.life.mu.Unlock()
	close(w.life.stop)
	var errs []error
	if hs != nil {
		hs.Shutdown()
	}
	w.closeHandoffs() // reads and pulls stop at once
	if srv != nil {
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			srv.Stop()
			<-done
			errs = append(errs, fmt.Errorf("worker: shutdown: steps cut short: %w", ctx.Err()))
		}
	}
	// Wait for pending stores (they hold the KV memory).
	for i := 0; i < cap(w.stores.sem); i++ {
		select {
		case w.stores.sem <- struct{}{}:
		case <-ctx.Done():
			i = cap(w.stores.sem)
			errs = append(errs, fmt.Errorf("worker: shutdown: stores cut short: %w", ctx.Err()))
		}
	}
	w.life.bg.Wait()
	w.unregister()
	w.life.mu.Lock()
	defer w.life.mu.Unlock()
	return errors.Join(append(errs, w.closeResources())...)
}

func (w *Worker) closeResources() error {
	var errs []error
	if w.kv != nil {
		errs = append(errs, w.kv.Close())
	}
	if w.file != nil {
		errs = append(errs, w.file.Close())
	}
	if w.quality != nil {
		errs = append(errs, w.quality.checker.Close())
	}
	w.logitBufs.Drain()
	return errors.Join(errs...)
}

// loadModel builds the model: the file of ModelPath or the built-in one,
// and this rank's slice of it under tensor parallelism. Called by Start.
func (w *Worker) loadModel() (*model.Model, error) {
	var m *model.Model
	var err error
	if w.cfg.ModelPath != "" {
		var opts []gguf.OpenOption
		if !w.cfg.MapWeights && w.group.reducer == nil {
			opts = append(opts, gguf.Resident())
		}
		if w.file, err = modelfile.Open(w.cfg.ModelPath, opts...); err != nil {
			return nil, err
		}
		if m, err = model.Load(w.file.GGUF, w.cfg.Model); err != nil {
			w.file.Close()
			w.file = nil
			return nil, fmt.Errorf("%s: %w", w.cfg.ModelPath, err)
		}
		if w.cfg.ModelName == "" {
			w.cfg.ModelName = w.file.Name
		}
		w.kvModel = defaults.KVNamespace(w.cfg.ModelName, w.file.Identity)
	} else {
		if m, err = model.New(w.cfg.Model); err != nil {
			return nil, err
		}
		w.kvModel = w.cfg.ModelName
	}
	// The gate checks the whole model, on every rank alike.
	encode, bos := w.tok.Encode, w.tok.BOS()
	if w.file != nil {
		encode, bos = w.file.Vocab.Encode, -1
		if w.file.AddBOS {
			bos = w.file.BOS
		}
	}
	if w.gate, err = runGate(m, w.cfg, encode, bos); err != nil {
		return nil, err
	}
	if w.group.reducer != nil {
		if m, err = m.Shard(w.group.reducer); err != nil {
			return nil, err
		}
		w.cfg.Rank, w.group.world = w.group.reducer.Rank(), w.group.reducer.Size()
	}
	return m, nil
}

// registerLoop registers the KV memory on the blend server's KV socket and
// holds the registration: when the server closes the connection (it
// restarted, or the registration was replaced) it registers again at once,
// then every RegisterInterval until it succeeds. It returns on Shutdown,
// leaving the registration to Shutdown (pending stores still need it).
// firstTry is closed once the first attempt ended, however it ended.
func (w *Worker) registerLoop(firstTry chan<- struct{}) {
	defer w.life.bg.Done()
	failing := false
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		sess, err := w.register()
		if firstTry != nil {
			close(firstTry)
			firstTry = nil
		}
		if err != nil {
			w.metrics.BlendFailure(metrics.BlendOpRegister)
			if !failing {
				w.logger.Warn("KV memory not registered with the blend server; serving without reuse", "socket", w.cfg.BlendKVSocket, "err", err)
			}
			failing = true
			t.Reset(w.cfg.RegisterInterval)
			select {
			case <-w.life.stop:
				return
			case <-t.C:
			}
			continue
		}
		failing = false
		select {
		case <-w.life.stop:
			return
		case <-sess.done:
		}
		w.reg.mu.Lock()
		if w.reg.sess == sess {
			w.reg.sess = nil
		}
		w.reg.mu.Unlock()
		sess.conn.Close()
		w.logger.Warn("the blend server ended the KV registration; registering again", "epoch", sess.epoch)
	}
}

// register hands the KV memory's descriptor to the blend server and
// records the session.
func (w *Worker) register() (*session, error) {
	l := w.kv.Layout()
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.RPCTimeout)
	defer cancel()
	c, ans, err := kvsock.Register(ctx, w.cfg.BlendKVSocket, &cbv1.KVRegistration{
		WorkerId: w.cfg.WorkerID, Rank: int32(w.cfg.Rank), Model: w.kvModel, WorldSize: int32(w.group.world),
		Layout: &cbv1.KVLayout{NumLayers: int32(l.NumLayers), NumBlocks: int32(l.NumBlocks), BlockSize: int32(l.BlockSize),
			KvHeads: int32(l.KVHeads), HeadDim: int32(l.HeadDim), RopeTheta: w.model.Config().RoPETheta,
			RopeInvFreq: w.model.RoPE().InvFreq(), Dtype: l.DType.String()},
	}, w.kv.File())
	if err != nil {
		return nil, err
	}
	sess := &session{conn: c, token: ans.GetRegistrationToken(), epoch: ans.GetServerEpoch(), done: make(chan struct{})}
	w.reg.wg.Go(func() {
		c.WaitClosed()
		close(sess.done)
	})
	w.reg.mu.Lock()
	w.reg.sess = sess
	w.reg.mu.Unlock()
	w.logger.Info("registered KV memory with the blend server", "epoch", sess.epoch, "socket", w.cfg.BlendKVSocket, "kv_memory", w.kv.Name())
	return sess, nil
}

// unregister ends the current registration: UnregisterKV (bounded by 1 s),
// then the connection is closed (which alone releases it on the server).
func (w *Worker) unregister() {
	w.reg.mu.Lock()
	sess := w.reg.sess
	w.reg.sess = nil
	w.reg.mu.Unlock()
	if sess != nil {
		select {
		case <-sess.done:
		default:
			ctx, cancel := context.WithTimeout(context.Background(), min(w.cfg.RPCTimeout, time.Second))
			if _, err := w.blend.UnregisterKV(ctx, &cbv1.UnregisterKVRequest{
				WorkerId: w.cfg.WorkerID, Rank: int32(w.cfg.Rank), RegistrationToken: sess.token,
			}); err != nil {
				w.logger.Debug("unregister KV memory", "err", err)
			}
			cancel()
		}
		sess.conn.Close()
	}
	w.reg.wg.Wait()
}
