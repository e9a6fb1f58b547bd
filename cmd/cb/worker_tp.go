package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cacheblend/cacheblend/rankgroup"
	"github.com/cacheblend/cacheblend/service"
	"github.com/cacheblend/cacheblend/tp"
	"github.com/cacheblend/cacheblend/worker"
)

// rankFlagsOwn are the flags a rank process does not inherit from rank 0:
// its own listen addresses, its rank, the shared worker id.
var rankFlagsOwn = map[string]bool{"addr": true, "metrics-addr": true, "tp": true, "tp-rank": true, "worker-id": true}

// rankArgs is the command line of rank r of a --tp group: rank 0's flags
// (model, blend server, TLS, telemetry) with a free gRPC address (its /metrics
// listener comes as a descriptor, rankgroup.MetricsFD), the
// group's worker id and the rank.
func rankArgs(c *cobra.Command, workerID string, world int) func(rank int) []string {
	var inherited []string
	c.Flags().Visit(func(f *pflag.Flag) {
		if !rankFlagsOwn[f.Name] {
			inherited = append(inherited, "--"+f.Name+"="+f.Value.String())
		}
	})
	return func(rank int) []string {
		args := append([]string{"worker"}, inherited...)
		return append(args, "--addr=127.0.0.1:0", "--worker-id="+workerID,
			"--tp="+strconv.Itoa(world), "--tp-rank="+strconv.Itoa(rank))
	}
}

// runRank is a rank process of a --tp group: its model shard all-reduces
// over the inherited segment, and it runs the steps rank 0 forwards until
// rank 0 closes the step socket (or a signal).
func runRank(ctx context.Context, rt *service.Runtime, cfg worker.Config, deps worker.Deps, rank int) error {
	reducer, conn, err := rankgroup.OpenRank(rank, tp.Config{})
	if err != nil {
		return err
	}
	defer reducer.Close()
	deps.Reducer = reducer
	w, err := worker.New(cfg, deps)
	if err == nil {
		err = w.Start(ctx)
	}
	if err != nil {
		conn.Close()
		return err
	}
	mln, err := rankgroup.MetricsListener()
	if err == nil {
		_, err = rt.ServeMetricsOn(mln, nil) // gathered by rank 0
	}
	if err != nil {
		conn.Close()
		_ = w.Shutdown(ctx)
		return err
	}
	rt.Logger.Info("tensor-parallel rank started", "rank", rank, "world_size", reducer.Size(), "kv_memory", w.KVMemory())
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var serveErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		defer cancel() // rank 0 gone: shut down
		serveErr = rankgroup.Serve(sctx, conn, w.Execute)
	})
	err = runUntilSignal(sctx, rt, w)
	cancel()
	wg.Wait()
	if serveErr != nil && !errors.Is(serveErr, context.Canceled) {
		return fmt.Errorf("rank %d: %w", rank, serveErr)
	}
	return err
}

// runGroupUntilSignal is runUntilSignal for rank 0 of a --tp group: it also
// returns when a rank dies, with an error (so cb up restarts the group),
// after shutting the worker and the group down.
func runGroupUntilSignal(ctx context.Context, rt *service.Runtime, w *worker.Worker, group *rankgroup.Group) error {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-group.Done():
			cancel()
		case <-gctx.Done():
		}
	})
	err := runUntilSignal(gctx, rt, w, group)
	cancel()
	wg.Wait()
	if crashed := group.Crashed(); crashed != nil {
		return fmt.Errorf("cb worker: %w", crashed)
	}
	return err
}
