package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/rankgroup"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/kvsock"
	"github.com/cacheblend/cacheblend/rpc/mtls"
	"github.com/cacheblend/cacheblend/worker"
)

func init() { subcommands = append(subcommands, newWorkerCmd) }

// workerFlags are cb worker's settings, from its flags.
type workerFlags struct {
	cfg                    worker.Config
	metricsAddr, blendAddr string
	daemon                 daemonFlags
	tpSize, tpRank         int
}

func newWorkerCmd() *cobra.Command {
	var wf workerFlags
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run cb-worker: the model, the paged KV cache in shared memory (a memfd handed to cb blend), the CacheBlend connector (worker side)",
		RunE:  func(c *cobra.Command, _ []string) error { return runWorker(c, &wf) },
	}
	cfg := &wf.cfg
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", "127.0.0.1:50061", "gRPC listen address (127.0.0.1:0 picks a free port)")
	f.StringVar(&wf.metricsAddr, "metrics-addr", "127.0.0.1:0", "address of /metrics and /health")
	f.StringVar(&wf.blendAddr, "blend", "", "blend server gRPC address (empty: no KV reuse)")
	f.StringVar(&cfg.BlendKVSocket, "blend-kv-socket", kvsock.DefaultPath(), "the blend server's KV socket (its --kv-socket), on which the worker hands over its KV memory")
	f.StringVar(&cfg.WorkerID, "worker-id", "", "name of this worker at the blend server (default worker-<pid>)")
	f.StringVar(&cfg.ModelPath, "model", "", "GGUF model file to serve (architectures llama and qwen2; read into memory with transparent huge pages unless --map-weights); empty: the built-in seeded model")
	f.BoolVar(&cfg.MapWeights, "map-weights", false, "serve --model from a shared memory mapping of the file instead of reading it into the worker's memory (no copy at start, pages shared with other processes; decode up to ~10% slower; tensor-parallel ranks always map)")
	f.StringVar(&cfg.ModelName, "model-name", "", "served model name (default: the file's general.name, or "+defaults.Model+" for the built-in model)")
	f.IntVar(&cfg.NumBlocks, "num-blocks", worker.DefaultNumBlocks, "KV blocks in the pool")
	f.IntVar(&cfg.BlockSize, "block-size", worker.DefaultBlockSize, "tokens per KV block")
	f.StringVar(&cfg.KVType, "kv-type", worker.DefaultKVType, "element type of the KV cache: f16 (half the memory and the bytes a decode step reads, as llama.cpp's default) or f32")
	f.DurationVar(&cfg.KeepTimeout, "kv-keep-timeout", worker.DefaultKeepTimeout, "prefill role: how long a handed-over prompt's KV is kept for the decode worker's read")
	f.Int64Var(&cfg.KVSendRate, "kv-send-rate", 0, "prefill role: pace each hand-over read served to this many bytes/s (0: unpaced)")
	f.StringVar(&cfg.ShmDir, "shm-dir", "", "directory of the KV memory's unlinked fallback file when memfd_create is unavailable (default /dev/shm)")
	d := model.DefaultConfig()
	f.IntVar(&cfg.Model.Layers, "layers", d.Layers, "transformer layers")
	f.IntVar(&cfg.Model.Dim, "dim", d.Dim, "model width")
	f.IntVar(&cfg.Model.Heads, "heads", d.Heads, "query heads")
	f.IntVar(&cfg.Model.KVHeads, "kv-heads", d.KVHeads, "key/value heads")
	f.IntVar(&cfg.Model.FFNDim, "ffn-dim", d.FFNDim, "SwiGLU hidden width")
	f.Uint64Var(&cfg.Model.Seed, "seed", d.Seed, "weight seed")
	f.IntVar(&cfg.Model.CheckLayer, "check-layer", d.CheckLayer, "CacheBlend check layer")
	f.Float64Var(&cfg.Model.RecompRatio, "recomp-ratio", d.RecompRatio, "CacheBlend recompute ratio")
	f.StringVar(&cfg.Quality.Gate, "blend-gate", worker.GateAuto, "CacheBlend blend gate: auto (at start, blend sample documents and compare with a full prefill; blending off for the model above --blend-gate-kl), on, off (forced either way, no check)")
	f.Float64Var(&cfg.Quality.GateKL, "blend-gate-kl", worker.DefaultBlendGateKL, "the blend gate's threshold: mean KL (nats) between the next-token distributions of a full prefill and a blend")
	f.Float64Var(&cfg.Quality.SampleRate, "quality-sample-rate", 0.01, "share of blended prefills whose quality is checked online against a full prefill, off the request's path (cb.quality, lmcache_blend_quality_kl); 0: off")
	f.Float64Var(&cfg.Quality.Budget, "quality-budget", worker.DefaultQualityBudget, "share of one core the online quality checker may use, in its thread's CPU time (samples beyond are dropped and counted); it runs at the lowest priority")
	f.IntVar(&cfg.Quality.Positions, "quality-positions", worker.DefaultQualityPositions, "output positions an online quality check compares (teacher-forced)")
	f.IntVar(&wf.tpSize, "tp", 1, "tensor-parallel ranks: the worker runs as this many rank processes (this one is rank 0), each with 1/N of the heads and SwiGLU columns and its own KV memory")
	f.IntVar(&wf.tpRank, "tp-rank", 0, "internal: the rank of a process started by a --tp worker (descriptors 3 and 4 are its segment and step socket)")
	_ = f.MarkHidden("tp-rank")
	wf.daemon.register(f, mtls.Worker)
	return withEnv(cmd)
}

// runWorker runs cb worker (rank 0 of a --tp group, or alone), or a rank process of a group.
func runWorker(c *cobra.Command, wf *workerFlags) error {
	ctx, cfg, tpSize := c.Context(), wf.cfg, wf.tpSize
	rt, id, err := wf.daemon.start(ctx, "cb-worker", cfg.Addr, true)
	if err != nil {
		return err
	}
	deps := worker.Deps{Deps: rt.Deps()}
	if tpSize > 1 {
		// The worker's series differ by rank: each rank labels its own.
		deps.Registerer = rankgroup.RankRegisterer(deps.Registerer, wf.tpRank)
	}
	if id != nil {
		// WorkerService: the engine; KVTransferService: other workers.
		deps.GRPCServerOptions = id.ServerOptionsFor(mtls.WorkerPolicy())
	}
	deps.DialPeer = func(addr string) (*grpc.ClientConn, error) {
		return rpc.Dial(addr, dialOptions(id, mtls.Worker)...)
	}
	bc, closeBlend, err := dialBlend(wf.blendAddr, id)
	if err != nil {
		return err
	}
	defer closeBlend()
	deps.Blend = bc
	if wf.tpRank > 0 {
		// A rank process a --tp group's rank 0 started (rankgroup).
		return runRank(ctx, rt, cfg, deps, wf.tpRank)
	}
	var group *rankgroup.Group
	if tpSize > 1 {
		if cfg.WorkerID == "" {
			cfg.WorkerID = fmt.Sprintf("worker-%d", os.Getpid()) // every rank registers under it
		}
		args := rankArgs(c, cfg.WorkerID, tpSize)
		if group, err = rankgroup.New(rankgroup.Config{World: tpSize}, args, rt.Logger); err != nil {
			return err
		}
		if err := group.Start(ctx); err != nil {
			return err
		}
		deps.Reducer, deps.Peers = group.Reducer(), group
		rt.AddGatherer(group.Gatherer()) // the other ranks' series on this /metrics
	}
	w, err := worker.New(cfg, deps)
	if err == nil {
		err = w.Start(ctx)
	}
	if err != nil {
		if group != nil {
			_ = group.Shutdown(ctx)
		}
		return err
	}
	rt.AddHealthDetail("blend", w.BlendStatus)
	maddr, err := rt.ServeMetrics(wf.metricsAddr, nil)
	if err != nil {
		_ = w.Shutdown(ctx)
		if group != nil {
			_ = group.Shutdown(ctx)
		}
		return err
	}
	announce("cb-worker", "grpc", w.Addr(), "metrics", "http://"+maddr.String()+"/metrics", "kv_memory", w.KVMemory(),
		"world_size", strconv.Itoa(max(1, tpSize)))
	if group == nil {
		return runUntilSignal(ctx, rt, w)
	}
	return runGroupUntilSignal(ctx, rt, w, group)
}
